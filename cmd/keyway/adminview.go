package main

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/eventlog"
	"keyway/health"
	"keyway/membership"
	"keyway/proxy"
)

// adminView adapts the proxy, the health checker, the phase tracker, the
// gossip node and the audit trail to the admin API's read interfaces. It
// only reads: each call loads the current routing table once and reports
// from that one snapshot. Safe for concurrent use.
type adminView struct {
	cfg      config.Config
	p        *proxy.Proxy
	hc       *health.Checker
	phases   *health.PhaseTracker
	audit    *eventlog.Log
	declared map[string]int
	// node is the gossip node, set once it exists; nil while gossip is off.
	node atomic.Pointer[membership.Node]
}

// Interface guards.
var (
	_ admin.SetView      = (*adminView)(nil)
	_ admin.MemberLister = (*adminView)(nil)
	_ admin.EventSource  = (*adminView)(nil)
	_ admin.ConfigSource = (*adminView)(nil)
)

func newAdminView(cfg config.Config, p *proxy.Proxy, hc *health.Checker, phases *health.PhaseTracker, audit *eventlog.Log) *adminView {
	v := &adminView{cfg: cfg, p: p, hc: hc, phases: phases, audit: audit, declared: map[string]int{}}
	for _, s := range cfg.ReplicaSets {
		v.declared[s.Name] = s.Replicas
	}
	return v
}

// options returns the admin options' read sources, all served by v.
func (v *adminView) options(o admin.Options) admin.Options {
	o.Sets, o.Members, o.Events, o.Config, o.Drainer = v, v, v, v, v
	return o
}

func (v *adminView) Sets() []admin.SetStatus {
	out := []admin.SetStatus{}
	for _, name := range v.p.Sets() {
		if st, ok := v.Set(name); ok {
			out = append(out, st)
		}
	}
	return out
}

func (v *adminView) Set(name string) (admin.SetStatus, bool) {
	r := v.p.Router(name)
	if r == nil {
		return admin.SetStatus{}, false
	}
	t := r.Table()
	hs := map[string]health.ReplicaHealth{}
	if v.hc != nil {
		for _, h := range v.hc.Snapshot(name) {
			hs[h.Replica] = h
		}
	}
	st := admin.SetStatus{
		Name:        name,
		Declared:    v.declared[name],
		InRotation:  len(t.Rotation()),
		RingSize:    t.Len(),
		Partitions:  t.Partitions(),
		Failover:    t.Failover().String(),
		Fingerprint: t.Fingerprint(),
		Generation:  t.Generation(),
		Replicas:    []admin.ReplicaStatus{},
	}
	if v.phases != nil {
		st.Phase = string(v.phases.Phase(name))
	}
	for _, m := range t.Members() {
		if m.State == balancer.StateReady && !m.Down {
			st.Ready++
		}
		rs := admin.ReplicaStatus{
			Name: m.Name, Addr: m.Addr, State: m.State.String(), Source: m.Source, Zone: m.Zone, Down: m.Down,
			Slot: m.Slot, InRotation: m.InRotation, Partitions: m.Partitions,
		}
		if !m.InRotation {
			rs.Reason = outReason(m)
		}
		if n := t.Partitions(); n > 0 {
			rs.Share = float64(m.Partitions) / float64(n)
		}
		if h, ok := hs[m.Name]; ok {
			rs.Health = h
		}
		st.Replicas = append(st.Replicas, rs)
	}
	return st, true
}

// outReason says why a replica is out of rotation: its own state, gossip's
// verdict and this proxy's exclusions, in that order.
func outReason(m balancer.Member) string {
	var why []string
	if m.Slot < 0 {
		why = append(why, "not on the ring (never ready)")
	}
	if m.State != balancer.StateReady {
		why = append(why, "state "+m.State.String())
	}
	if m.Down {
		why = append(why, "down (gossip)")
	}
	if m.Excluded != 0 {
		why = append(why, "excluded: "+m.Excluded.String())
	}
	if len(why) == 0 {
		return "out of rotation"
	}
	return strings.Join(why, "; ")
}

func (v *adminView) Route(set, key string) (admin.RouteExplain, error) {
	r := v.p.Router(set)
	if r == nil {
		return admin.RouteExplain{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	t := r.Table()
	// The same hash as a header key (and as a path or query key, which
	// hash their decoded form with it).
	h := balancer.HashString(key)
	ex := admin.RouteExplain{
		Set: set, Key: key, Hash: fmt.Sprintf("%016x", h),
		Partition: t.Partition(h), Failover: t.Failover().String(),
		Fingerprint: t.Fingerprint(), Generation: t.Generation(),
		Candidates: []admin.RouteCandidate{},
	}
	if o := t.Owner(h); o >= 0 {
		ex.Owner = t.Replica(o).Name
	}
	pick, ok := t.Pick(h)
	if ok {
		ex.Pick = t.Replica(pick).Name
	}
	reached := false
	for i, slot := range t.Order(h) {
		rep := t.Replica(slot)
		c := admin.RouteCandidate{Name: rep.Name, Addr: rep.Addr, State: rep.State.String(), InRotation: t.InRotation(slot)}
		switch {
		case ok && slot == pick:
			c.Picked, reached = true, true
		case reached:
			// After the pick: never considered.
		case !c.InRotation:
			c.Skipped = outReason(balancer.Member{Replica: *rep, Slot: slot, Excluded: t.Excluded(slot)})
		case i > 0 && t.Failover() == balancer.FailoverStrict:
			c.Skipped = "failover strict: only the owner may take the key"
		default:
			c.Skipped = "not a candidate"
		}
		ex.Candidates = append(ex.Candidates, c)
	}
	return ex, nil
}

// setNode attaches the gossip node once it exists (serve builds it after
// the admin server): until then /v1/members answers [] and drain of a
// gossip replica answers 409.
func (v *adminView) setNode(n *membership.Node) { v.node.Store(n) }

func (v *adminView) Members() []admin.MemberInfo {
	out := []admin.MemberInfo{}
	n := v.node.Load()
	if n == nil {
		return out
	}
	for _, m := range n.Members() {
		mi := admin.MemberInfo{
			Node: m.Node, Gossip: m.Gossip, Role: m.Meta.Role.String(), Status: m.Status.String(),
			Since: m.Since, Self: m.Self, Set: m.Meta.Set, Replica: m.Meta.Replica, Addr: m.Meta.Addr,
			Zone: m.Meta.Zone, Fingerprint: m.Meta.Fingerprint,
		}
		if m.Meta.Role != membership.RoleProxy {
			mi.State = m.Meta.State.String()
		}
		out = append(out, mi)
	}
	return out
}

func (v *adminView) Events(since time.Time, kinds []string, limit int) []any {
	evs := v.audit.Recent(since, kinds, limit)
	out := make([]any, len(evs))
	for i, e := range evs {
		out[i] = e
	}
	return out
}

// Config returns the redacted effective configuration under its YAML key
// names (the names of the file and of docs/configuration.md), not Go's.
func (v *adminView) Config() any {
	b, err := yaml.Marshal(config.Redacted(v.cfg))
	if err != nil {
		return map[string]string{"error": "encoding the configuration: " + err.Error()}
	}
	var out map[string]any
	if err := yaml.Unmarshal(b, &out); err != nil {
		return map[string]string{"error": "encoding the configuration: " + err.Error()}
	}
	return out
}

var _ admin.Drainer = (*adminView)(nil)

// Drain drains or undrains a replica for the operator (admin API). A
// replica with an agent is told through gossip (membership.AdminDrain sent
// to its newest alive incarnation): its advertised draining state takes it
// out of rotation on every proxy. A static replica has no agent: it is held
// out (balancer.ReasonAdmin) on this proxy only. Undrain also ends this
// proxy's supervision hold or ejection of the replica (health.Checker.Reset)
// and any local admin hold. Every call that succeeds records an
// admin_action audit event.
func (v *adminView) Drain(set, replica string, drain bool) (string, error) {
	r := v.p.Router(set)
	if r == nil {
		return "", fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	var rep *balancer.Member
	for _, m := range r.Table().Members() {
		if m.Name == replica {
			rep = &m
			break
		}
	}
	if rep == nil {
		return "", fmt.Errorf("%w %q", admin.ErrUnknownReplica, replica)
	}
	var scope string
	if rep.Source == "static" {
		scope = admin.ScopeThisProxy
		v.p.SetExcluded(set, replica, balancer.ReasonAdmin, drain)
	} else {
		node := v.node.Load()
		if node == nil {
			return "", fmt.Errorf("%w: gossip is off on this proxy", admin.ErrUnreachable)
		}
		var target *membership.Member
		for _, m := range node.Members() {
			if m.Meta.Role != membership.RoleReplica || m.Meta.Set != set || m.Meta.Replica != replica || m.Status != membership.StatusAlive {
				continue
			}
			if target == nil || m.Meta.Boot > target.Meta.Boot {
				target = &m
			}
		}
		if target == nil {
			return "", fmt.Errorf("%w: no alive gossip member advertises %s/%s", admin.ErrUnreachable, set, replica)
		}
		msg := membership.AdminDrain{Set: set, Replica: replica, Boot: target.Meta.Boot, Drain: drain, By: node.Name()}
		if err := node.Send(target.Node, msg.Encode()); err != nil {
			return "", fmt.Errorf("%w: sending to %s: %v", admin.ErrUnreachable, target.Node, err)
		}
		// Take the node's lock once more: it orders Send's reads before the
		// gossip update the command triggers (see agent/helpers_test.go).
		_ = node.Members()
		scope = admin.ScopeGossip
		if !drain {
			v.p.SetExcluded(set, replica, balancer.ReasonAdmin, false)
		}
	}
	action := "undrain"
	if drain {
		action = "drain"
	}
	if !drain && v.hc != nil {
		v.hc.Reset(set, replica)
	}
	if v.audit != nil {
		v.audit.Record(eventlog.KindAdminAction, set, replica, map[string]any{"action": action, "scope": scope})
	}
	return scope, nil
}
