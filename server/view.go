package server

import (
	"fmt"
	"keyway/runstate"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/eventlog/query"
	"keyway/health"
	"keyway/membership"
	"keyway/proxy"
)

// view adapts the node's components (the proxy, the health checker, the
// phase tracker, gossip and the audit trail) to the admin API's read
// interfaces and its drain command. It only reads, except Drain: each call
// loads the current routing table once and reports from that one snapshot.
// Safe for concurrent use.
type view struct {
	n   *ProxyNode
	cfg atomic.Pointer[config.Config] // as last applied; the sets come from the proxy
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
	v := &view{n: n}
	v.setConfig(n.eff)
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
// none).
func (v *view) Sets() []admin.SetStatus {
	out := []admin.SetStatus{}
	for _, name := range v.n.p.Sets() {
		if st, ok := v.set(name, false); ok {
			out = append(out, st)
		}
	}
	return out
}

// Set returns one set with its replicas and their traffic: every call
// reads the proxy's counters afresh (see proxy.Proxy.Traffic).
func (v *view) Set(name string) (admin.SetStatus, bool) { return v.set(name, true) }

// set builds one set's status from one routing table, with the traffic
// figures when traffic is true.
func (v *view) set(name string, traffic bool) (admin.SetStatus, bool) {
	r := v.n.p.Router(name)
	if r == nil {
		return admin.SetStatus{}, false
	}
	t := r.Table()
	var tr proxy.TrafficReport
	if traffic {
		tr, traffic = v.n.p.Traffic(name)
	}
	hs := map[string]health.ReplicaHealth{}
	for _, h := range v.n.hc.Snapshot(name) {
		hs[h.Replica] = h
	}
	st := admin.SetStatus{
		Name:        name,
		Phase:       string(v.n.phases.Phase(name)),
		Declared:    v.declared(name),
		InRotation:  len(t.Rotation()),
		RingSize:    t.Len(),
		Partitions:  t.Partitions(),
		Failover:    t.Failover().String(),
		Fingerprint: t.Fingerprint(),
		Generation:  t.Generation(),
		Replicas:    []admin.ReplicaStatus{},
	}
	for _, sc := range v.n.p.SetConfigs() {
		if sc.Name == name {
			st.Stopped = sc.Stopped
			st.Match = admin.SetMatch{Host: sc.Match.Host, PathPrefix: sc.Match.PathPrefix}
		}
	}
	held := map[string][]string{}
	for _, fs := range v.n.p.FleetStatus() {
		if fs.Set == name {
			for _, h := range fs.Held {
				held[h.Replica] = h.Voters
			}
		}
	}
	st.Source, st.Runtime = v.n.setRuntime(name)
	if rec, ok := v.n.rt.Get(runstate.KindSet, name); ok {
		st.Version = rec.Version
	}
	others, proxies := v.n.p.FleetInflight(name)
	since, now := v.n.phases.Since(name), time.Now()
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
		// The tracker saw the tables up to the newest; this one may be a
		// moment older or newer: a time is reported only for the state
		// (or rotation) this table shows.
		if s, ok := since[m.Name]; ok {
			if s.State == m.State {
				rs.StateSince, rs.StateSeconds = &s.StateSince, seconds(now.Sub(s.StateSince))
			}
			if s.InRotation == m.InRotation {
				rs.RotationSince, rs.RotationSeconds = &s.RotationSince, seconds(now.Sub(s.RotationSince))
			}
		}
		if n := t.Partitions(); n > 0 {
			rs.Share = float64(m.Partitions) / float64(n)
		}
		if m.Slot >= 0 {
			rs.Inflight = t.Backend(m.Slot).Inflight()
		}
		rs.FleetInflight, rs.FleetProxies = rs.Inflight+others[m.Name], proxies+1
		if h, ok := hs[m.Name]; ok {
			rs.Health = h
		}
		rs.HeldBy = held[m.Name]
		if !m.InRotation {
			rs.Why, rs.BackAt = v.why(name, m, hs[m.Name], held[m.Name], now)
			if rs.BackAt != nil {
				rs.BackInSeconds = seconds(rs.BackAt.Sub(now))
			}
		}
		if traffic {
			rs.Traffic = replicaTraffic(tr, m.Name, hs[m.Name])
		}
		st.Replicas = append(st.Replicas, rs)
	}
	if traffic {
		st.Traffic = &admin.SetTraffic{
			WindowSeconds: tr.WindowSeconds, RequestsPerSecond: tr.RequestsPerSecond, ErrorsPerSecond: tr.ErrorsPerSecond,
			LocalAnswersPerSecond: tr.LocalAnswersPerSecond, RequestsTotal: tr.RequestsTotal, ErrorsTotal: tr.ErrorsTotal,
			LocalAnswersTotal: tr.LocalAnswersTotal, RateNote: tr.RateNote,
			ShedPerSecond: tr.ShedPerSecond, ShedTotal: tr.ShedTotal,
			Codes: tr.Codes, CodesPerSecond: tr.CodesPerSecond,
			ClientErrorsTotal: tr.ClientErrorsTotal, ClientErrorsPerSecond: tr.ClientErrorsPerSecond,
			FailedAttemptsTotal: tr.FailedAttemptsTotal, FailedAttemptsPerSecond: tr.FailedAttemptsPerSecond,
			P50LatencySeconds: tr.P50LatencySeconds, P99LatencySeconds: tr.P99LatencySeconds,
			History: []admin.TrafficPoint{},
		}
		if st.Traffic.Codes == nil {
			st.Traffic.Codes = map[string]uint64{}
		}
		for _, pt := range v.n.p.TrafficHistory(name) {
			st.Traffic.History = append(st.Traffic.History, admin.TrafficPoint{At: pt.At, RequestsPerSecond: pt.RequestsPerSecond,
				ClientErrorsPerSecond: pt.ClientErrorsPerSecond, P99LatencySeconds: pt.P99LatencySeconds})
		}
	}
	return st, true
}

// selfAs names this proxy's own vote "this proxy" ("self" in the API).
func selfAs(voters []string) []string {
	out := slices.Clone(voters)
	for i, v := range out {
		if v == "self" {
			out[i] = "this proxy"
		}
	}
	return out
}

// why says in a sentence why a replica is out of rotation on this proxy,
// most telling reason first, and when it comes back on its own (nil when
// it waits on its agent or an operator).
func (v *view) why(set string, m balancer.Member, h health.ReplicaHealth, voters []string, now time.Time) (string, *time.Time) {
	var parts []string
	var back *time.Time
	later := func(t time.Time) {
		if !t.IsZero() && t.After(now) && (back == nil || t.After(*back)) {
			back = &t
		}
	}
	switch {
	case m.Down:
		parts = append(parts, "its agent is unreachable in gossip (down)")
	case m.Slot < 0:
		parts = append(parts, "not ready yet since it joined (it enters the ring once ready)")
	case m.State == balancer.StateDraining && v.n.disc != nil && v.n.disc.OperatorHeld(set, m.Name):
		parts = append(parts, "drained by an operator (keyway undrain to bring it back)")
	case m.State != balancer.StateReady:
		parts = append(parts, "its agent says "+m.State.String())
	}
	if m.Excluded&balancer.ReasonFailed != 0 {
		parts = append(parts, fmt.Sprintf("held out after %d ejections in a short time", h.Ejections))
		later(h.FailedUntil)
	}
	if m.Excluded&balancer.ReasonEjected != 0 {
		what := "failed requests"
		if h.LastReason != "" {
			what = h.LastReason
		}
		parts = append(parts, fmt.Sprintf("ejected after %d failures in a row (%s)", v.n.cfg.Health.Passive.ConsecutiveFailures, what))
		later(h.EjectedUntil)
	}
	if m.Excluded&balancer.ReasonRefused != 0 {
		parts = append(parts, "refused a connection (out at once, until a probe or gossip says it is back)")
	}
	if m.Excluded&balancer.ReasonProbe != 0 {
		p := fmt.Sprintf("failing health probes (%d in a row", h.ProbeFailures)
		if h.LastProbeResult != "" {
			p += ", last: " + h.LastProbeResult
		}
		parts = append(parts, p+")")
	}
	if m.Excluded&balancer.ReasonAdmin != 0 {
		parts = append(parts, "drained on this proxy by an operator")
	}
	if m.Excluded&balancer.ReasonFleet != 0 {
		parts = append(parts, "held out by the fleet on the evidence of "+strings.Join(selfAs(voters), ", "))
	}
	if len(parts) == 0 {
		return m.OutReason(), nil
	}
	return strings.Join(parts, "; "), back
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
			Zone: m.Meta.Zone, Fingerprint: m.Meta.Fingerprint, Refused: m.Refused,
		}
		if m.Meta.Role != membership.RoleProxy {
			mi.State = m.Meta.State.String()
			if m.Meta.Role == membership.RoleReplica && m.Meta.SupervisionKnown {
				mi.Supervised = new(m.Meta.Supervised)
			}
		} else {
			mi.ID = m.ID()
		}
		out = append(out, mi)
	}
	return out
}

// Events answers GET /v1/events from the in-memory trail, with the
// filters of keyway audit: a partition or a key is followed through the
// ring and rotation changes the memory holds, and each event kept carries
// its placement.
func (v *view) Events(q admin.EventQuery) ([]any, error) {
	f := query.Filter{Since: q.Since, Until: q.Until, Kinds: q.Kinds, Sets: q.Sets, Replica: q.Replica, Partition: q.Partition, Key: q.Key}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	var ms []query.Match
	if len(q.Sets) == 0 && q.Replica == "" && q.Partition < 0 && q.Key == "" && q.Until.IsZero() {
		for _, e := range v.n.audit.Recent(q.Since, q.Kinds, q.Limit) {
			ms = append(ms, query.Match{Event: e})
		}
	} else {
		// A partition's placement needs the ring changes before the
		// window: the whole memory is read, in order.
		ms = f.Events(v.n.audit.Recent(time.Time{}, nil, 0))
		if q.Limit > 0 && len(ms) > q.Limit {
			ms = ms[len(ms)-q.Limit:]
		}
	}
	out := make([]any, len(ms))
	for i, m := range ms {
		e := m.Event
		if m.Placement != nil {
			fields := make(map[string]any, len(e.Fields)+1)
			maps.Copy(fields, e.Fields)
			fields["placement"] = m.Placement
			e.Fields = fields
		}
		out[i] = e
	}
	return out, nil
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

// replicaTraffic is one replica's traffic as the proxy counts it, with the
// health checker's ejection counts. A replica that is not on this proxy's
// ring was sent nothing: zeros, measured over the report's window.
func replicaTraffic(tr proxy.TrafficReport, name string, h health.ReplicaHealth) *admin.ReplicaTraffic {
	out := &admin.ReplicaTraffic{WindowSeconds: tr.WindowSeconds, Ejections: h.Ejections, EjectionsTotal: h.EjectionsTotal}
	rt, ok := tr.Replicas[name]
	if !ok {
		if tr.WindowSeconds != nil {
			out.RequestsPerSecond, out.ErrorsPerSecond = new(0.0), new(0.0)
			out.Responses5xxPerSecond, out.FailedAttemptsPerSecond = new(0.0), new(0.0)
		}
		return out
	}
	out.RequestsPerSecond, out.ErrorsPerSecond = rt.RequestsPerSecond, rt.ErrorsPerSecond
	out.Responses5xxPerSecond, out.FailedAttemptsPerSecond = rt.Responses5xxPerSecond, rt.FailedAttemptsPerSecond
	out.MeanLatencySeconds, out.P99LatencySeconds = rt.MeanLatencySeconds, rt.P99LatencySeconds
	out.RequestsTotal, out.Responses5xxTotal = rt.RequestsTotal, rt.Responses5xxTotal
	out.TransportErrorsTotal, out.TransportErrors, out.ErrorsTotal = rt.TransportErrorsTotal, rt.TransportErrors, rt.ErrorsTotal
	return out
}

// seconds is d in seconds, rounded to 1 ms and never below 0.
func seconds(d time.Duration) *float64 {
	v := math.Round(max(d, 0).Seconds()*1000) / 1000
	return &v
}
