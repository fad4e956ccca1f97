package membership

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/balancer"
)

// Target is what a proxy's discovery feeds. The proxy implements it.
type Target interface {
	// SetReplicaSet replaces the gossip-discovered replicas of one set. It
	// returns false when the proxy does not serve that set.
	SetReplicaSet(set string, rs []balancer.Replica) bool
	// ReplicaLoad reports the proxy's requests in flight to a replica and
	// whether it routes with the replica out of rotation. ok is false when
	// the proxy has no such replica on its ring.
	ReplicaLoad(set, replica string) (inflight int64, outOfRotation, ok bool)
	// Fingerprints returns the ring fingerprint of every set it serves.
	Fingerprints() map[string]string
}

// DiscoveryOptions are a Discovery's dependencies; all optional.
type DiscoveryOptions struct {
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	// ReportInterval is how often drain reports go to draining replicas'
	// agents. 0 means 200ms.
	ReportInterval time.Duration
	// OnEvent, if non-nil, is told about every member change between two
	// snapshots (for the audit trail). Called from the Node's emit
	// goroutine; it must not block.
	OnEvent func(MemberEvent)
}

// MemberEvent is one change of a member between two snapshots.
type MemberEvent struct {
	// Kind is "member_join", "member_dead", "member_leave" or "state_change".
	Kind   string
	Member Member
	// From is the previous state (state_change) or status.
	From string
}

// Discovery is the proxy side of gossip: it turns member snapshots into
// per-set replica lists for the proxy, compares ring fingerprints with the
// other proxies, and tells agents of draining replicas how many requests
// are still in flight to them. It implements [Sink]. Safe for concurrent
// use.
type Discovery struct {
	target   Target
	log      *zap.Logger
	interval time.Duration

	mismatchTotal prometheus.Counter
	mismatchPeers prometheus.Gauge
	unknownSets   prometheus.Counter

	onEvent func(MemberEvent)

	// feedMu serializes feeding the target: a Resync (another goroutine)
	// must not hand it an older snapshot after a newer one.
	feedMu     sync.Mutex
	mu         sync.Mutex
	send       func(node string, msg []byte) error // the attached Node's Send; a test hook
	members    []Member
	mismatched map[string]bool     // "peer/set" pairs known to disagree
	held       map[[2]string]int64 // set/replica → boot of the newest incarnation seen holding an operator drain
	redrains   map[string]int      // gossip node → drain commands sent to that incarnation
	unknown    map[string]bool     // sets advertised that this proxy does not serve
	sets       map[string]bool     // sets fed at least once
}

var _ Sink = (*Discovery)(nil)

// NewDiscovery returns a Discovery feeding t. Attach the Node before Run.
func NewDiscovery(t Target, opts DiscoveryOptions) *Discovery {
	d := &Discovery{
		target:     t,
		log:        opts.Logger,
		interval:   opts.ReportInterval,
		onEvent:    opts.OnEvent,
		mismatched: map[string]bool{},
		held:       map[[2]string]int64{},
		redrains:   map[string]int{},
		unknown:    map[string]bool{},
		sets:       map[string]bool{},
		mismatchTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Name: "ring_fingerprint_mismatches_total",
			Help: "Times another proxy was found routing a shared replica set with a different ring fingerprint.",
		}),
		mismatchPeers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "ring_fingerprint_disagreements",
			Help: "Proxy/set pairs whose ring fingerprint differs from this proxy's now.",
		}),
		unknownSets: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "unknown_set_replicas_total",
			Help: "Replica sets advertised by agents that this proxy does not serve (counted once per set).",
		}),
	}
	if d.log == nil {
		d.log = zap.NewNop()
	}
	if d.interval <= 0 {
		d.interval = 200 * time.Millisecond
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(d.mismatchTotal, d.mismatchPeers, d.unknownSets)
	}
	return d
}

// Attach sets the gossip node used to send drain reports.
func (d *Discovery) Attach(n *Node) {
	d.mu.Lock()
	d.send = n.Send
	d.mu.Unlock()
}

// SetMembers implements Sink.
func (d *Discovery) SetMembers(ms []Member) {
	d.feedMu.Lock()
	defer d.feedMu.Unlock()
	d.feed(ms)
}

// feed turns one snapshot into the target's replica lists; feedMu is
// held, so that snapshots reach the target in the order they were taken.
func (d *Discovery) feed(ms []Member) {
	bySet := ReplicasBySet(ms)
	d.mu.Lock()
	prev := d.members
	d.members = ms
	d.trackHeldLocked(ms)
	// A new incarnation of a replica an operator drained is routed as
	// draining until it holds the drain itself (report sends it again):
	// no request reaches it in between.
	for set, reps := range bySet {
		for i, r := range reps {
			if d.awaitingHoldLocked(ms, set, r.Name) && (r.State == balancer.StateReady || r.State == balancer.StateStarting || r.State == balancer.StateRecovering) {
				reps[i].State = balancer.StateDraining
			}
		}
	}
	for set := range d.sets {
		if _, ok := bySet[set]; !ok {
			bySet[set] = nil // the set's last replica is gone: clear it
		}
	}
	d.mu.Unlock()
	for _, set := range slices.Sorted(maps.Keys(bySet)) {
		ok := d.target.SetReplicaSet(set, bySet[set])
		d.mu.Lock()
		switch {
		case ok:
			d.sets[set] = true
			delete(d.unknown, set)
		case len(bySet[set]) == 0:
			delete(d.sets, set) // a set the proxy stopped serving, and nobody advertises it
		case !d.unknown[set]:
			delete(d.sets, set)
			d.unknown[set] = true
			d.unknownSets.Inc()
			d.log.Warn("agents advertise a replica set this proxy does not serve; ignored", zap.String("set", set))
		}
		d.mu.Unlock()
	}
	d.checkFingerprints(ms)
	if d.onEvent != nil {
		diffMembers(prev, ms, d.onEvent)
	}
}

// Resync feeds the target the last member snapshot again. Call it after
// the target's sets changed (a configuration reload): a set it serves now
// gets its gossip replicas at once, not at the next gossip change.
func (d *Discovery) Resync() {
	d.feedMu.Lock()
	defer d.feedMu.Unlock()
	d.mu.Lock()
	ms := d.members
	d.mu.Unlock()
	d.feed(ms)
}

// diffMembers reports the changes from prev to cur, self excluded.
func diffMembers(prev, cur []Member, emit func(MemberEvent)) {
	old := make(map[string]Member, len(prev))
	for _, m := range prev {
		old[m.Node] = m
	}
	for _, m := range cur {
		if m.Self {
			continue
		}
		o, seen := old[m.Node]
		switch {
		case !seen && m.Status == StatusAlive:
			emit(MemberEvent{Kind: "member_join", Member: m})
		case seen && o.Status != m.Status && m.Status == StatusDead:
			emit(MemberEvent{Kind: "member_dead", Member: m, From: o.Status.String()})
		case seen && o.Status != m.Status && m.Status == StatusLeft:
			emit(MemberEvent{Kind: "member_leave", Member: m, From: o.Status.String()})
		case seen && o.Status != m.Status && m.Status == StatusAlive:
			emit(MemberEvent{Kind: "member_join", Member: m, From: o.Status.String()})
		case seen && o.Meta.State != m.Meta.State:
			emit(MemberEvent{Kind: "state_change", Member: m, From: o.Meta.State.String()})
		}
	}
}

// ReplicasBySet turns gossip members into each set's replica list for the
// Router. Of several members claiming one replica name, the newest boot
// wins. A dead member stays listed as Down (on the ring, out of rotation)
// until membership forgets it; a member that left advertising Remove is
// dropped at once; one that left without it (a restart) stays listed as
// stopped until forgotten.
func ReplicasBySet(ms []Member) map[string][]balancer.Replica {
	best := map[[2]string]Member{}
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Meta.Set == "" || m.Meta.Replica == "" {
			continue
		}
		k := [2]string{m.Meta.Set, m.Meta.Replica}
		cur, ok := best[k]
		if !ok || m.Meta.Boot > cur.Meta.Boot || (m.Meta.Boot == cur.Meta.Boot && m.Status == StatusAlive && cur.Status != StatusAlive) {
			best[k] = m
		}
	}
	out := map[string][]balancer.Replica{}
	for k, m := range best {
		r := balancer.Replica{
			Name: m.Meta.Replica, Addr: m.Meta.Addr, State: m.Meta.State,
			Weight: int(m.Meta.Weight), Zone: m.Meta.Zone, Source: "gossip",
		}
		switch m.Status {
		case StatusDead:
			r.Down = true
		case StatusLeft:
			if m.Meta.Remove {
				continue
			}
			r.State = balancer.StateStopped
		}
		out[k[0]] = append(out[k[0]], r)
	}
	for set := range out {
		slices.SortFunc(out[set], func(a, b balancer.Replica) int { return strings.Compare(a.Name, b.Name) })
	}
	return out
}

// FingerprintMeta compacts per-set fingerprints for a proxy's metadata:
// "set:8 hex digits of xxhash" joined by ',', sets sorted.
func FingerprintMeta(fps map[string]string) string {
	parts := make([]string, 0, len(fps))
	for _, set := range slices.Sorted(maps.Keys(fps)) {
		parts = append(parts, fmt.Sprintf("%s:%08x", set, uint32(xxhash.Sum64String(fps[set]))))
	}
	return strings.Join(parts, ",")
}

func parseFingerprintMeta(s string) map[string]string {
	out := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		if set, fp, ok := strings.Cut(p, ":"); ok {
			out[set] = fp
		}
	}
	return out
}

// checkFingerprints compares the other live proxies' fingerprints with
// ours for every set both serve.
func (d *Discovery) checkFingerprints(ms []Member) {
	mine := parseFingerprintMeta(FingerprintMeta(d.target.Fingerprints()))
	now := map[string]bool{}
	for _, m := range ms {
		if m.Self || m.Meta.Role != RoleProxy || m.Status != StatusAlive {
			continue
		}
		for set, fp := range parseFingerprintMeta(m.Meta.Fingerprint) {
			if my, ok := mine[set]; ok && my != fp {
				now[m.Node+"/"+set] = true
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range now {
		if !d.mismatched[k] {
			d.mismatchTotal.Inc()
			peer, set, _ := strings.Cut(k, "/")
			d.log.Warn("another proxy routes a shared replica set with a different ring fingerprint: the two route keys differently",
				zap.String("peer", peer), zap.String("set", set), zap.String("ours", mine[set]))
		}
	}
	d.mismatched = now
	d.mismatchPeers.Set(float64(len(now)))
}

// trackHeldLocked remembers which replicas an operator drained, from the
// Held flag their alive incarnations advertise: set by a held one, cleared
// when the same incarnation advertises it no more (an undrain) or the
// replica leaves for good. A newer incarnation that does not hold it is
// drained again by report. d.mu is held.
func (d *Discovery) trackHeldLocked(ms []Member) {
	// Only the newest alive incarnation of each replica counts: an older
	// one that gossip has not declared dead yet (a crash moments ago)
	// still advertises what it held.
	newest := map[[2]string]Member{}
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Status != StatusAlive || m.Meta.Set == "" || m.Meta.Replica == "" {
			continue
		}
		k := [2]string{m.Meta.Set, m.Meta.Replica}
		if cur, ok := newest[k]; !ok || m.Meta.Boot > cur.Meta.Boot {
			newest[k] = m
		}
	}
	present := map[[2]string]bool{}
	for _, m := range ms {
		present[[2]string{m.Meta.Set, m.Meta.Replica}] = true
	}
	for k := range d.held {
		if !present[k] {
			delete(d.held, k) // forgotten (gossip.forget_after): a later replica of that name starts afresh
		}
	}
	if len(d.redrains) > 0 {
		alive := map[string]bool{}
		for _, m := range ms {
			alive[m.Node] = m.Status == StatusAlive
		}
		for node := range d.redrains {
			if !alive[node] {
				delete(d.redrains, node) // that incarnation is gone
			}
		}
	}
	for k, m := range newest {
		mark, marked := d.held[k]
		switch {
		case m.Meta.Remove:
			delete(d.held, k)
		case m.Meta.Held && m.Meta.Boot >= mark:
			d.held[k] = m.Meta.Boot
		case marked && !m.Meta.Held && m.Meta.Boot == mark:
			delete(d.held, k) // the operator undrained it
		}
	}
}

// MaxRedrains bounds the drain commands a proxy sends one new incarnation
// of a held replica (one per report interval: 5 s at the default 200 ms).
const MaxRedrains = 25

// ForgetHold forgets an operator drain of a replica on this proxy: an
// undrain asked here, or told by another proxy (HandleMessage). A new
// incarnation is then routed by what it advertises.
func (d *Discovery) ForgetHold(set, replica string) {
	d.mu.Lock()
	_, had := d.held[[2]string{set, replica}]
	delete(d.held, [2]string{set, replica})
	d.mu.Unlock()
	if had {
		d.log.Info("operator drain forgotten", zap.String("set", set), zap.String("replica", replica))
		d.feedMu.Lock()
		defer d.feedMu.Unlock()
		d.mu.Lock()
		ms := d.members
		d.mu.Unlock()
		d.feed(ms) // route it by what it advertises now
	}
}

// HandleMessage is a proxy's membership.MessageHandler: an undrain that
// another proxy's admin API received (AdminDrain with Drain false, sent to
// every proxy) makes this one forget the drain too, so that no proxy
// drains a later incarnation again.
func (d *Discovery) HandleMessage(from string, msg []byte) {
	if MessageKind(msg) != adminDrainKind {
		return
	}
	c, err := DecodeAdminDrain(msg)
	if err != nil || c.Drain {
		return
	}
	d.ForgetHold(c.Set, c.Replica)
}

// awaitingHoldLocked reports whether the newest alive incarnation of a
// replica an operator drained does not hold the drain yet. d.mu is held.
func (d *Discovery) awaitingHoldLocked(ms []Member, set, replica string) bool {
	mark, ok := d.held[[2]string{set, replica}]
	if !ok {
		return false
	}
	var newest *Member
	for i := range ms {
		m := &ms[i]
		if m.Meta.Role == RoleReplica && m.Status == StatusAlive && m.Meta.Set == set && m.Meta.Replica == replica && (newest == nil || m.Meta.Boot > newest.Meta.Boot) {
			newest = m
		}
	}
	return newest != nil && newest.Meta.Boot > mark && !newest.Meta.Held
}

// Run sends drain reports to the agents of draining (and stopped, not yet
// gone) replicas, and drains
// again new incarnations of replicas an operator drained, until ctx is
// done.
func (d *Discovery) Run(ctx context.Context) error {
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.report()
		}
	}
}

func (d *Discovery) report() {
	d.mu.Lock()
	send, ms := d.send, d.members
	d.mu.Unlock()
	if send == nil {
		return
	}
	d.mu.Lock()
	type redrain struct {
		m    Member
		sent int // commands sent to this incarnation before this one
	}
	var redrains []redrain
	for _, m := range ms {
		if m.Meta.Role == RoleReplica && m.Status == StatusAlive && m.Meta.State != balancer.StateStopped &&
			!m.Meta.Held && m.Meta.Boot > d.held[[2]string{m.Meta.Set, m.Meta.Replica}] && d.awaitingHoldLocked(ms, m.Meta.Set, m.Meta.Replica) {
			if n := d.redrains[m.Node]; n <= MaxRedrains {
				redrains = append(redrains, redrain{m, n})
				d.redrains[m.Node] = n + 1
			}
		}
	}
	d.mu.Unlock()
	for _, r := range redrains {
		m := r.m
		fields := []zap.Field{zap.String("set", m.Meta.Set), zap.String("replica", m.Meta.Replica), zap.String("node", m.Node)}
		if r.sent == MaxRedrains {
			// An agent that does not advertise the hold (an older keyway)
			// or does not get the command: this proxy keeps routing it as
			// draining, and stops asking.
			d.log.Warn("replica restarted during an operator drain does not hold it; not asking again, routed as draining until an undrain", fields...)
			continue
		}
		// Sent every interval until the agent advertises the hold: a
		// lost datagram or a busy agent only delays it.
		cmd := AdminDrain{Set: m.Meta.Set, Replica: m.Meta.Replica, Boot: m.Meta.Boot, Drain: true, By: "keyway (operator drain of an earlier incarnation)"}
		if err := send(m.Node, cmd.Encode()); err != nil {
			d.log.Debug("operator drain not re-sent", append(fields, zap.Error(err))...)
		} else if r.sent == 0 {
			d.log.Info("replica restarted during an operator drain: draining it again", fields...)
		}
	}
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Status != StatusAlive || (m.Meta.State != balancer.StateDraining && m.Meta.State != balancer.StateStopped) {
			continue
		}
		inflight, out, ok := d.target.ReplicaLoad(m.Meta.Set, m.Meta.Replica)
		if !ok {
			// Not on our ring: we send it nothing.
			inflight, out = 0, true
		}
		rep := DrainReport{Set: m.Meta.Set, Replica: m.Meta.Replica, Boot: m.Meta.Boot, DrainingSeen: out, Inflight: inflight,
			StoppedSeen: m.Meta.State == balancer.StateStopped}
		if err := send(m.Node, rep.Encode()); err != nil {
			d.log.Debug("drain report not sent", zap.String("node", m.Node), zap.Error(err))
		}
	}
}
