package membership

import (
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
	// OnRepair, if non-nil, is told about a repair of a set that another
	// proxy's admin API received (see Repair): this proxy lifts its own
	// holds. Called from the Node's message goroutine; it must not block.
	OnRepair func(set, by string)
	// OnEvent, if non-nil, is told about every member change between two
	// snapshots (for the audit trail). Called from the Node's emit
	// goroutine; it must not block.
	OnEvent func(MemberEvent)
	// HealthScore reads this node's Lifeguard health score for the
	// isolation rule; nil means the attached Node's.
	HealthScore func() int
	// Now is the clock of the isolation rule; nil means time.Now.
	Now func() time.Time
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

	onEvent  func(MemberEvent)
	onRepair func(set, by string)

	// feedMu serializes feeding the target: a Resync (another goroutine)
	// must not hand it an older snapshot after a newer one.
	feedMu sync.Mutex
	// cmdMu orders the operator-drain commands this proxy sends: a
	// re-drain (report) is computed and sent under it, and an undrain
	// forgets the hold under it before anything is sent, so that no
	// re-drain computed before an undrain reaches the agent after it.
	// Lock order: cmdMu, then feedMu, then mu.
	cmdMu sync.Mutex
	mu    sync.Mutex
	// node is the attached Node (nil before Attach, and in tests that set
	// send alone); self is its ID (this proxy's fleet ID), the By of the
	// commands it sends.
	node *Node
	self string
	send func(node string, msg []byte) error // the attached Node's Send; a test hook
	// members is the last snapshot fed and index its incarnations, built
	// once per feed: every question about a replica's incarnations is
	// answered from it.
	members    []Member
	index      incarnations
	mismatched map[string]bool            // "peer ID/set" pairs known to disagree
	held       map[[2]string]int64        // set/replica → boot of the newest incarnation seen holding an operator drain
	redrains   map[string]int             // gossip node → drain commands sent to that incarnation
	unknown    map[string]bool            // sets advertised that this proxy does not serve
	sets       map[string]bool            // sets fed at least once
	wants      map[string]SetWant         // set → stopped or not (SetWants)
	stopSent   map[string]time.Time       // gossip node → when it was last told its set's want
	retiring   map[string]RetireFrom      // set → the replicas dropped once stopped (SetRetiring)
	retireTell map[string]map[string]bool // set → the replicas told to retire
	retireSent map[string]time.Time       // gossip node → when it was last told to retire

	// Isolation (isolation.go): the rule, its state (written under
	// feedMu and mu, read under either), its inputs and its signals.
	rule  isolationRule
	iso   isolation
	score func() int
	now   func() time.Time
	isoM  isolationMetrics
	isoLg *zap.Logger
}

var _ Sink = (*Discovery)(nil)

// NewDiscovery returns a Discovery feeding t. Attach the Node before Run.
func NewDiscovery(t Target, opts DiscoveryOptions) *Discovery {
	d := &Discovery{
		target:     t,
		log:        opts.Logger,
		interval:   opts.ReportInterval,
		onEvent:    opts.OnEvent,
		onRepair:   opts.OnRepair,
		mismatched: map[string]bool{},
		held:       map[[2]string]int64{},
		redrains:   map[string]int{},
		stopSent:   map[string]time.Time{},
		retiring:   map[string]RetireFrom{},
		retireTell: map[string]map[string]bool{},
		retireSent: map[string]time.Time{},
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
	d.initIsolation(opts)
	return d
}

// Attach sets the gossip node that sends drain reports and commands.
func (d *Discovery) Attach(n *Node) {
	d.mu.Lock()
	d.node, d.self, d.send = n, n.ID(), n.Send
	d.rule = isolationRuleFor(n.cfg)
	d.mu.Unlock()
	n.Handle(RepairKind, RoleProxy, d.handleRepair)
	n.Handle(adminDrainKind, RoleProxy, d.handleAdminDrain)
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
	idx := indexIncarnations(ms)
	// While this proxy is cut off from gossip, the replicas it cannot hear
	// are routed as last seen alive (isolation.go).
	iso, prev, end := d.isolationStep(ms)
	bySet := idx.replicasBySet()
	if iso.on {
		bySet = indexIncarnations(iso.view(ms)).replicasBySet()
	}
	d.mu.Lock()
	before := d.members
	d.members, d.index = ms, idx
	d.iso = iso
	d.trackHeldLocked(ms)
	d.dropRetiredLocked(bySet)
	// A new incarnation of a replica an operator drained is routed as
	// draining until it holds the drain itself (report sends it again):
	// no request reaches it in between.
	for set, reps := range bySet {
		for i, r := range reps {
			if d.awaitingHoldLocked(set, r.Name) && (r.State == balancer.StateReady || r.State == balancer.StateStarting || r.State == balancer.StateRecovering) {
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
		diffMembers(before, ms, d.onEvent)
	}
	d.reportIsolation(prev, iso, end)
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
// ours for every set both serve. A proxy is known by its ID, and of two
// processes carrying one ID (a binary upgrade) the newest boot speaks for
// it; the other process of this proxy is not another proxy.
func (d *Discovery) checkFingerprints(ms []Member) {
	mine := parseFingerprintMeta(FingerprintMeta(d.target.Fingerprints()))
	d.mu.Lock()
	self := d.self
	d.mu.Unlock()
	newest := map[string]Member{}
	for _, m := range ms {
		if m.Self || m.Meta.Role != RoleProxy || m.Status != StatusAlive || (self != "" && m.ID() == self) {
			continue
		}
		if n, ok := newest[m.ID()]; !ok || m.Meta.Boot > n.Meta.Boot {
			newest[m.ID()] = m
		}
	}
	now := map[string]bool{}
	for id, m := range newest {
		for set, fp := range parseFingerprintMeta(m.Meta.Fingerprint) {
			if my, ok := mine[set]; ok && my != fp {
				now[id+"/"+set] = true
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
