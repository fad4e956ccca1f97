package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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
	cfg    atomic.Pointer[config.Config] // as last loaded; the sets come from the proxy
	p      *proxy.Proxy
	hc     *health.Checker
	phases *health.PhaseTracker
	audit  *eventlog.Log
	// node is the gossip node, set once it exists; nil while gossip is off.
	node atomic.Pointer[membership.Node]
	disc atomic.Pointer[membership.Discovery]
	// traffic reads the proxy's counters from the metrics registry; nil
	// until options names the registry.
	traffic *trafficSampler
}

// Interface guards.
var (
	_ admin.SetView      = (*adminView)(nil)
	_ admin.MemberLister = (*adminView)(nil)
	_ admin.EventSource  = (*adminView)(nil)
	_ admin.ConfigSource = (*adminView)(nil)
)

func newAdminView(cfg config.Config, p *proxy.Proxy, hc *health.Checker, phases *health.PhaseTracker, audit *eventlog.Log) *adminView {
	v := &adminView{p: p, hc: hc, phases: phases, audit: audit}
	v.setConfig(cfg)
	return v
}

// setConfig records the configuration applied at start or by a reload.
func (v *adminView) setConfig(cfg config.Config) {
	c := config.Redacted(cfg)
	v.cfg.Store(&c)
}

// declared returns a set's declared replica count as it is now (a PATCH
// or a reload changes it), or 0.
func (v *adminView) declared(set string) int {
	for _, sc := range v.p.SetConfigs() {
		if sc.Name == set {
			return sc.Replicas
		}
	}
	return 0
}

// options returns the admin options' read sources, all served by v. The
// traffic figures of the set view come from o.Gatherer, the registry the
// proxy counts its requests in.
func (v *adminView) options(o admin.Options) admin.Options {
	o.Sets, o.Members, o.Events, o.Config, o.Drainer = v, v, v, v, v
	if o.Gatherer != nil {
		v.traffic = newTrafficSampler(o.Gatherer, time.Now)
	}
	return o
}

// Sets lists the sets without traffic figures (the list endpoint shows
// none): no metrics are gathered.
func (v *adminView) Sets() []admin.SetStatus {
	out := []admin.SetStatus{}
	for _, name := range v.p.Sets() {
		if st, ok := v.set(name, nil); ok {
			out = append(out, st)
		}
	}
	return out
}

// Set returns one set with its replicas and their traffic: every call
// reads the proxy's counters afresh (and may store that reading for later
// rates; see trafficSampler).
func (v *adminView) Set(name string) (admin.SetStatus, bool) {
	if v.p.Router(name) == nil {
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
func (v *adminView) set(name string, rd *trafficReading) (admin.SetStatus, bool) {
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
		Declared:    v.declared(name),
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
	held := v.operatorHeld(name)
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
			if held[m.Name] && m.State == balancer.StateDraining {
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

// operatorHeld names the replicas of a set whose newest alive gossip
// incarnation holds an operator drain (Meta.Held).
func (v *adminView) operatorHeld(set string) map[string]bool {
	n := v.node.Load()
	if n == nil {
		return nil
	}
	newest := map[string]membership.Member{}
	for _, m := range n.Members() {
		if m.Meta.Role == membership.RoleReplica && m.Meta.Set == set && m.Status == membership.StatusAlive {
			if cur, ok := newest[m.Meta.Replica]; !ok || m.Meta.Boot > cur.Meta.Boot {
				newest[m.Meta.Replica] = m
			}
		}
	}
	out := map[string]bool{}
	for name, m := range newest {
		out[name] = m.Meta.Held
	}
	return out
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
func (v *adminView) setNode(n *membership.Node, d *membership.Discovery) {
	v.disc.Store(d)
	v.node.Store(n)
}

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
	cfg := *v.cfg.Load()
	cfg.ReplicaSets = v.p.SetConfigs() // with declared counts changed at run time
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
			// Every proxy forgets the drain, so that none drains the
			// replica's next incarnation again.
			if d := v.disc.Load(); d != nil {
				d.ForgetHold(set, replica)
			}
			for _, m := range node.Members() {
				if m.Meta.Role == membership.RoleProxy && m.Status == membership.StatusAlive && !m.Self {
					// Best effort: a proxy that misses it asks a restarted
					// replica to drain at most membership.MaxRedrains times.
					_ = node.Send(m.Node, msg.Encode())
				}
			}
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

// The traffic figures of the set view (issue 5): totals and rates of the
// requests this proxy sent each replica, read from the counters package
// proxy and package health already keep in the metrics registry
// (keyway_requests_total, keyway_upstream_errors_total,
// keyway_ejections_total), so that neither package needs an API for them.
//
// A rate compares two readings of the counters. Every read of a set takes a
// fresh reading and stores it when the last stored one is at least
// sampleEvery old; rates compare the fresh reading with the newest stored
// one at least rateWindow old or, when there is none yet, the oldest stored
// one at least rateMinSpan old. Stored readings older than rateMaxAge are
// forgotten: a rate then needs a second read again. The dashboard reads
// every 2 s, so its rates span 10 to 12 s. Run adds a reading every
// sampleEvery whatever the reads.
const (
	rateWindow  = 10 * time.Second
	rateMinSpan = time.Second
	rateMaxAge  = time.Minute
	sampleEvery = time.Second
)

// The metric families (and label names) the sampler reads.
const (
	metricRequests  = "keyway_requests_total"        // set, replica, code
	metricUpErrors  = "keyway_upstream_errors_total" // set, replica, kind
	metricEjections = "keyway_ejections_total"       // set, replica, reason
	// localReplica is the replica label of answers keyway gave itself.
	localReplica = "none"
)

type replicaKey struct{ set, replica string }

// replicaCounts are one replica's counters in one reading.
type replicaCounts struct {
	requests  float64            // answered, any status class
	r5xx      float64            // answered 5xx
	transport map[string]float64 // failed exchanges by kind
	ejections float64            // passive ejections, any reason
}

func (c *replicaCounts) transportSum() float64 {
	var n float64
	for _, v := range c.transport {
		n += v
	}
	return n
}

// trafficSample is one reading of the counters. Its map is never changed
// once the sample is built, so samples are shared freely.
type trafficSample struct {
	at     time.Time
	counts map[replicaKey]*replicaCounts
}

func (s trafficSample) get(set, replica string) *replicaCounts {
	if c := s.counts[replicaKey{set, replica}]; c != nil {
		return c
	}
	return &replicaCounts{}
}

// trafficSampler keeps the stored readings. Safe for concurrent use.
type trafficSampler struct {
	g   prometheus.Gatherer
	now func() time.Time

	mu     sync.Mutex
	stored []trafficSample // oldest first, at least sampleEvery apart
}

func newTrafficSampler(g prometheus.Gatherer, now func() time.Time) *trafficSampler {
	return &trafficSampler{g: g, now: now}
}

// trafficReading is a fresh reading and the stored one its rates compare
// with (nil: no rate yet, note says why).
type trafficReading struct {
	cur  trafficSample
	base *trafficSample
	note string
}

// gather reads the counters now.
func (s *trafficSampler) gather() trafficSample {
	// A registry answers what it could gather along with an error for the
	// rest; the traffic families come from keyway's own collectors.
	mfs, _ := s.g.Gather()
	cur := trafficSample{at: s.now(), counts: map[replicaKey]*replicaCounts{}}
	for _, mf := range mfs {
		name := mf.GetName()
		if name != metricRequests && name != metricUpErrors && name != metricEjections {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := labels(m)
			k := replicaKey{l["set"], l["replica"]}
			if k.set == "" || k.replica == "" {
				continue
			}
			c := cur.counts[k]
			if c == nil {
				c = &replicaCounts{}
				cur.counts[k] = c
			}
			val := m.GetCounter().GetValue()
			switch name {
			case metricRequests:
				c.requests += val
				if l["code"] == "5xx" {
					c.r5xx += val
				}
			case metricUpErrors:
				if c.transport == nil {
					c.transport = map[string]float64{}
				}
				c.transport[l["kind"]] += val
			case metricEjections:
				c.ejections += val
			}
		}
	}
	return cur
}

func labels(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// read takes a fresh reading, picks the stored one to compare it with, and
// stores the fresh one when the last stored one is sampleEvery old.
func (s *trafficSampler) read() *trafficReading {
	cur := s.gather()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := cur.at
	drop := 0
	for drop < len(s.stored) && now.Sub(s.stored[drop].at) > rateMaxAge {
		drop++
	}
	s.stored = append(s.stored[:0], s.stored[drop:]...)

	rd := &trafficReading{cur: cur}
	for i := len(s.stored) - 1; i >= 0; i-- {
		if now.Sub(s.stored[i].at) >= rateWindow {
			rd.base = &s.stored[i]
			break
		}
	}
	if rd.base == nil && len(s.stored) > 0 && now.Sub(s.stored[0].at) >= rateMinSpan {
		rd.base = &s.stored[0]
	}
	if rd.base != nil {
		b := *rd.base // a copy: s.stored is shifted in place later
		rd.base = &b
	} else {
		switch {
		case len(s.stored) == 0:
			rd.note = "no earlier reading of the counters: rates compare two readings at least 1s apart, taken when a set is read; read again in a second"
		default:
			rd.note = fmt.Sprintf("the earlier reading is only %.1fs old: rates compare two readings at least 1s apart; read again in a second", now.Sub(s.stored[0].at).Seconds())
		}
	}
	if n := len(s.stored); n == 0 || now.Sub(s.stored[n-1].at) >= sampleEvery {
		s.stored = append(s.stored, cur)
	}
	return rd
}

// run stores a reading at every tick until ctx is done.
func (s *trafficSampler) run(ctx context.Context, ticks <-chan time.Time) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
			s.read()
		}
	}
}

// Run reads the counters every second until ctx is done, so that rates are
// known on the first read of a set rather than the second. It returns nil,
// or at once when v has no metrics registry.
func (v *adminView) Run(ctx context.Context) error {
	if v.traffic == nil {
		return nil
	}
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	return v.traffic.run(ctx, t.C)
}

// span is the rates' window in seconds, or 0 with no base.
func (rd *trafficReading) span() float64 {
	if rd.base == nil {
		return 0
	}
	return rd.cur.at.Sub(rd.base.at).Seconds()
}

// increase is a counter's increase since the base reading. A series the
// base lacks was created since (a replica joins a proxy's ring with fresh
// series); one that went down was deleted and created again (the replica
// left the ring and came back): both count from 0, as Prometheus' rate()
// does.
func increase(cur, base float64) float64 {
	if cur < base {
		return cur
	}
	return cur - base
}

// errorsIncrease is the increase of a replica's 5xx answers and failed
// exchanges, kind by kind.
func errorsIncrease(cur, base *replicaCounts) float64 {
	n := increase(cur.r5xx, base.r5xx)
	for kind, v := range cur.transport {
		n += increase(v, base.transport[kind])
	}
	return n
}

// rate rounds a per-second rate to 0.001 for readable JSON.
func rate(delta, span float64) *float64 {
	r := math.Round(delta/span*1000) / 1000
	return &r
}

func count(x float64) uint64 { return uint64(math.Round(x)) }

// replica is one replica's traffic; ejections is the health checker's
// count within its supervision window.
func (rd *trafficReading) replica(set, name string, ejections int) *admin.ReplicaTraffic {
	c := rd.cur.get(set, name)
	tr := &admin.ReplicaTraffic{
		RequestsTotal:        count(c.requests),
		Responses5xxTotal:    count(c.r5xx),
		TransportErrorsTotal: count(c.transportSum()),
		Ejections:            ejections,
		EjectionsTotal:       count(c.ejections),
	}
	tr.ErrorsTotal = tr.Responses5xxTotal + tr.TransportErrorsTotal
	for kind, n := range c.transport {
		if n := count(n); n > 0 {
			if tr.TransportErrors == nil {
				tr.TransportErrors = map[string]uint64{}
			}
			tr.TransportErrors[kind] = n
		}
	}
	if span := rd.span(); span > 0 {
		b := rd.base.get(set, name)
		tr.WindowSeconds = rate(span, 1)
		tr.RequestsPerSecond = rate(increase(c.requests, b.requests), span)
		tr.ErrorsPerSecond = rate(errorsIncrease(c, b), span)
	}
	return tr
}

// set sums the replicas' traffic (reps, as listed) and adds the answers
// keyway gave itself for the set.
func (rd *trafficReading) set(set string, reps []admin.ReplicaStatus) *admin.SetTraffic {
	local := rd.cur.get(set, localReplica)
	st := &admin.SetTraffic{LocalAnswersTotal: count(local.requests), RateNote: rd.note}
	span := rd.span()
	var reqs, errs float64
	for _, r := range reps {
		if r.Traffic == nil {
			continue
		}
		st.RequestsTotal += r.Traffic.RequestsTotal
		st.ErrorsTotal += r.Traffic.ErrorsTotal
		if span > 0 {
			c, b := rd.cur.get(set, r.Name), rd.base.get(set, r.Name)
			reqs += increase(c.requests, b.requests)
			errs += errorsIncrease(c, b)
		}
	}
	if span > 0 {
		st.WindowSeconds = rate(span, 1)
		st.RequestsPerSecond = rate(reqs, span)
		st.ErrorsPerSecond = rate(errs, span)
		st.LocalAnswersPerSecond = rate(increase(local.requests, rd.base.get(set, localReplica).requests), span)
	}
	return st
}
