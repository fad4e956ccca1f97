package server

import (
	"strings"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/health"
	"keyway/membership"
)

// view adapts the node's components (the proxy, the health checker, the
// phase tracker, gossip and the audit trail) to the admin API's read
// interfaces and its drain command. It only reads, except Drain: each call
// loads the current routing table once and reports from that one snapshot.
// Safe for concurrent use.
type view struct {
	n   *ProxyNode
	cfg atomic.Pointer[config.Config] // as last applied; the sets come from the proxy
	// traffic reads the proxy's counters from the metrics registry.
	traffic *trafficSampler
}

// Interface guards.
var (
	_ admin.SetView      = (*view)(nil)
	_ admin.MemberLister = (*view)(nil)
	_ admin.EventSource  = (*view)(nil)
	_ admin.ConfigSource = (*view)(nil)
	_ admin.Drainer      = (*view)(nil)
)

func newView(n *ProxyNode) *view {
	v := &view{n: n, traffic: newTrafficSampler(n.reg, time.Now)}
	v.setConfig(n.cfg)
	return v
}

// setConfig records the configuration applied at start or by a reload.
func (v *view) setConfig(cfg config.Config) {
	c := config.Redacted(cfg)
	v.cfg.Store(&c)
}

// declared returns a set's declared replica count as it is now (a PATCH
// or a reload changes it), or 0.
func (v *view) declared(set string) int {
	for _, sc := range v.n.p.SetConfigs() {
		if sc.Name == set {
			return sc.Replicas
		}
	}
	return 0
}

// Sets lists the sets without traffic figures (the list endpoint shows
// none): no metrics are gathered.
func (v *view) Sets() []admin.SetStatus {
	out := []admin.SetStatus{}
	for _, name := range v.n.p.Sets() {
		if st, ok := v.set(name, nil); ok {
			out = append(out, st)
		}
	}
	return out
}

// Set returns one set with its replicas and their traffic: every call
// reads the proxy's counters afresh (and may store that reading for later
// rates; see trafficSampler).
func (v *view) Set(name string) (admin.SetStatus, bool) {
	if v.n.p.Router(name) == nil {
		return admin.SetStatus{}, false
	}
	var rd *trafficReading
	if v.traffic != nil {
		rd = v.traffic.read()
	}
	return v.set(name, rd)
}

// set builds one set's status from one routing table; rd, if not nil,
// adds the traffic figures.
func (v *view) set(name string, rd *trafficReading) (admin.SetStatus, bool) {
	r := v.n.p.Router(name)
	if r == nil {
		return admin.SetStatus{}, false
	}
	t := r.Table()
	hs := map[string]health.ReplicaHealth{}
	if v.n.hc != nil {
		for _, h := range v.n.hc.Snapshot(name) {
			hs[h.Replica] = h
		}
	}
	st := admin.SetStatus{
		Name:        name,
		Declared:    v.declared(name),
		InRotation:  len(t.Rotation()),
		RingSize:    t.Len(),
		Partitions:  t.Partitions(),
		Failover:    t.Failover().String(),
		Fingerprint: t.Fingerprint(),
		Generation:  t.Generation(),
		Replicas:    []admin.ReplicaStatus{},
	}
	if v.n.phases != nil {
		st.Phase = string(v.n.phases.Phase(name))
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
			rs.Reason = m.OutReason()
			if m.State == balancer.StateDraining && v.n.disc != nil && v.n.disc.OperatorHeld(name, m.Name) {
				rs.Reason = strings.Replace(rs.Reason, "state draining", "state draining (operator drain)", 1)
			}
		}
		if n := t.Partitions(); n > 0 {
			rs.Share = float64(m.Partitions) / float64(n)
		}
		if h, ok := hs[m.Name]; ok {
			rs.Health = h
		}
		if rd != nil {
			rs.Traffic = rd.replica(name, m.Name, hs[m.Name].Ejections)
		}
		st.Replicas = append(st.Replicas, rs)
	}
	if rd != nil {
		st.Traffic = rd.set(name, st.Replicas)
	}
	return st, true
}

func (v *view) Members() []admin.MemberInfo {
	out := []admin.MemberInfo{}
	if v.n.node == nil {
		return out
	}
	for _, m := range v.n.node.Members() {
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

func (v *view) Events(since time.Time, kinds []string, limit int) []any {
	evs := v.n.audit.Recent(since, kinds, limit)
	out := make([]any, len(evs))
	for i, e := range evs {
		out[i] = e
	}
	return out
}

// Config returns the redacted effective configuration under its YAML key
// names (the names of the file and of docs/configuration.md), not Go's.
func (v *view) Config() any {
	cfg := *v.cfg.Load()
	cfg.ReplicaSets = v.n.p.SetConfigs() // with declared counts changed at run time
	b, err := yaml.Marshal(config.Redacted(cfg))
	if err != nil {
		return map[string]string{"error": "encoding the configuration: " + err.Error()}
	}
	var out map[string]any
	if err := yaml.Unmarshal(b, &out); err != nil {
		return map[string]string{"error": "encoding the configuration: " + err.Error()}
	}
	return out
}
