package membership

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// A proxy cut off from gossip (a firewall rule, a partition) hears no one:
// memberlist's suspicion timeouts then mark every member it knew dead in
// its own view, one after the other, although the replicas still answer it
// on the data path. Losing gossip must not be losing replicas, so the
// proxy's Discovery tells the two cases apart and, while this proxy is the
// one cut off, keeps feeding the replicas that died meanwhile as they were
// last seen alive. Replicas then leave rotation only on data-path evidence
// (refused connections, active probes, passive checks).
//
// The rule, evaluated on every member snapshot and every 200ms:
//
//   - Peers are the other members that did not leave; a dead member that a
//     newer alive incarnation supersedes (a restart of its replica, or a
//     newer process of its proxy: a restart or a binary upgrade) is no
//     peer, nor is one dead for longer than the window (old news).
//   - Enter isolation when there are at least two peers, at least one of
//     them died within the window, and either more than half of them did,
//     or this node's Lifeguard health score is at least isolationScore.
//     The score is the early signal: a probe of a crashed member is
//     vouched for by the helpers memberlist asks to probe it too (they
//     answer with nacks, the score stays 0), while an isolated node misses
//     every helper's nack and adds one per helper (up to 3) per failed
//     probe, before its first suspicion times out. The majority is the
//     signal when helpers are few (small fleets) or reachable (a partition
//     that leaves this proxy with some peers).
//   - While isolated, every peer that died since the window before the
//     isolation began is held: fed as it was last seen alive. No member is
//     forgotten (forget_after) either: one the Node forgets is fed from
//     its last view.
//   - Leave isolation when every held member is alive again (or left, or
//     was superseded by a newer incarnation); or when one came back (proof
//     of contact) and settle has passed since, the others being taken as
//     really dead; or when the entry rule no longer holds (the score fell
//     below isolationScore and at most half the peers are held), which
//     ends a false alarm. Deaths before the end of an isolation were
//     judged then: they do not count towards the next one.
//
// With a single peer (one proxy and one replica) the rule never fires: a
// cut and a crash of that replica look the same from here, and the
// replica is marked dead as after a crash.

// isolationScore is the health score from which a member's death is
// blamed on this node: at least two helpers failed to answer for one of
// its probes.
const isolationScore = 2

// isolationRule holds the rule's parameters.
type isolationRule struct {
	// window: deaths this recent count together, and are held on entry.
	window time.Duration
	// score: see isolationScore.
	score int
	// settle: after the first held member is heard again, how long the
	// others may take.
	settle time.Duration
}

// isolationRuleFor returns the rule for a gossip configuration. An
// isolated node's probes slow down as its score rises (Lifeguard, up to
// 8× the probe interval) and each of its suspicions runs to the maximum
// timeout, so its deaths trickle in: with 4 peers, over about 10 s with
// the fast profile (measured) and up to a minute or more with lan.
func isolationRuleFor(c Config) isolationRule {
	r := isolationRule{window: 2 * time.Minute, score: isolationScore, settle: c.PushPullInterval}
	if c.Profile == "fast" {
		r.window = 30 * time.Second
	}
	return r
}

// isolation is the rule's state. It is a value: step returns a new one and
// never changes the maps of the one it is given.
type isolation struct {
	on    bool
	since time.Time // when this node found itself isolated
	// held are the members that died during the isolation, as last seen
	// alive (status alive), by node name; a member leaves it when it is
	// heard from again.
	held map[string]Member
	// known is every other member seen while isolated, as last seen, by
	// node name: the forget hold.
	known map[string]Member
	// contact is when a held member was first heard from again.
	contact time.Time
	// peers, dead and score are the counts the rule entered on (logs).
	peers, dead, score int
	// after is when the last isolation ended: deaths before it were
	// judged then and do not count again.
	after time.Time
}

// census counts the peers of a snapshot and returns those dead since
// from, as the rule defines them.
func census(ms []Member, idx successors, from time.Time) (peers int, dead []Member) {
	for _, m := range ms {
		if m.Self || m.Status == StatusLeft {
			continue
		}
		if m.Status == StatusDead {
			if m.Since.Before(from) || idx.superseded(m) {
				continue
			}
			dead = append(dead, m)
		}
		peers++
	}
	return peers, dead
}

// successors index a snapshot's newest alive incarnations: of replicas
// (by set and name) and of proxies (by fleet ID).
type successors struct {
	replicas incarnations
	proxies  map[string]Member // fleet ID → newest alive process
}

func newSuccessors(ms []Member) successors {
	s := successors{replicas: indexIncarnations(ms), proxies: map[string]Member{}}
	for _, m := range ms {
		if m.Meta.Role != RoleProxy || m.Status != StatusAlive {
			continue
		}
		if n, ok := s.proxies[m.ID()]; !ok || m.Meta.Boot > n.Meta.Boot {
			s.proxies[m.ID()] = m
		}
	}
	return s
}

// superseded reports whether a newer alive incarnation of m exists: of
// its replica, or a process of its proxy (one fleet ID).
func (s successors) superseded(m Member) bool {
	var n Member
	var ok bool
	switch m.Meta.Role {
	case RoleReplica:
		n, ok = s.replicas.newestAlive(m.Meta.Set, m.Meta.Replica)
	case RoleProxy:
		n, ok = s.proxies[m.ID()]
	}
	return ok && n.Node != m.Node && n.Meta.Boot > m.Meta.Boot
}

// isolationEnd says why an isolation ended, and which held members were
// still dead then (they are fed as dead from then on).
type isolationEnd struct {
	why  string
	dead []string
}

// step applies the rule to one snapshot, this node's health score and the
// time. end is set when an isolation ended here.
func (r isolationRule) step(s isolation, ms []Member, score int, now time.Time) (next isolation, end isolationEnd) {
	idx := newSuccessors(ms)
	if !s.on {
		from := now.Add(-r.window)
		if s.after.After(from) {
			from = s.after
		}
		peers, dead := census(ms, idx, from)
		if peers < 2 || len(dead) == 0 || (2*len(dead) <= peers && score < r.score) {
			return isolation{after: s.after}, isolationEnd{}
		}
		next = isolation{on: true, since: now, held: map[string]Member{}, known: map[string]Member{},
			peers: peers, dead: len(dead), score: score}
		for _, m := range dead {
			m.Status = StatusAlive
			next.held[m.Node] = m
		}
		for _, m := range ms {
			if !m.Self {
				next.known[m.Node] = m
			}
		}
		return next, isolationEnd{}
	}

	next = s
	next.held, next.known = maps.Clone(s.held), maps.Clone(s.known)
	from := s.since.Add(-r.window)
	present := make(map[string]bool, len(ms))
	for _, m := range ms {
		if m.Self {
			continue
		}
		present[m.Node] = true
		next.known[m.Node] = m
		_, held := next.held[m.Node]
		switch {
		case held && (m.Status != StatusDead || idx.superseded(m)):
			// Heard from again: alive, left, or restarted.
			delete(next.held, m.Node)
			if next.contact.IsZero() {
				next.contact = now
			}
		case !held && m.Status == StatusDead && !m.Since.Before(from) && !idx.superseded(m):
			m.Status = StatusAlive
			next.held[m.Node] = m
		}
	}

	// Held members the Node forgot count as peers still dead.
	peers, _ := census(ms, idx, from)
	for node := range next.held {
		if !present[node] {
			peers++
		}
	}
	why := ""
	switch {
	case len(next.held) == 0:
		why = "every member held is alive again"
	case !next.contact.IsZero() && now.Sub(next.contact) >= r.settle:
		why = "gossip contact is back; the members still dead are taken as dead"
	case score < r.score && 2*len(next.held) <= peers:
		why = "the health score is low again and at most half the peers are dead: a false alarm"
	default:
		return next, isolationEnd{}
	}
	return isolation{after: now}, isolationEnd{why: why, dead: next.heldNames()}
}

// view is the snapshot Discovery feeds while isolated: held members as
// last seen alive, forgotten ones as last seen, sorted by node name like
// a Node's snapshot. Outside isolation it is ms itself.
func (s isolation) view(ms []Member) []Member {
	if !s.on {
		return ms
	}
	out := make([]Member, 0, len(ms)+len(s.known))
	present := make(map[string]bool, len(ms))
	for _, m := range ms {
		present[m.Node] = true
		if h, ok := s.held[m.Node]; ok {
			m = h
		}
		out = append(out, m)
	}
	for node, m := range s.known {
		if present[node] {
			continue
		}
		if h, ok := s.held[node]; ok {
			m = h
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// heldNames returns the held members' node names, sorted.
func (s isolation) heldNames() []string {
	return slices.Sorted(maps.Keys(s.held))
}

// isolationMetrics are the Discovery's isolation signals.
type isolationMetrics struct {
	isolated prometheus.Gauge
	episodes prometheus.Counter
	held     prometheus.Gauge
}

func (d *Discovery) initIsolation(opts DiscoveryOptions) {
	d.rule = isolationRuleFor(DefaultConfig())
	d.score, d.now = opts.HealthScore, opts.Now
	if d.now == nil {
		d.now = time.Now
	}
	// Entering and leaving isolation are logged as errors, without a
	// stack trace: the operator needs the message, not this code's path.
	d.isoLg = d.log.WithOptions(zap.AddStacktrace(zapcore.FatalLevel))
	d.isoM = isolationMetrics{
		isolated: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "isolated",
			Help: "1 while this proxy has lost gossip contact with its peers (it keeps routing to the replicas it cannot hear, as last seen alive, until the data path takes them out), else 0.",
		}),
		episodes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "isolations_total",
			Help: "Times this proxy found itself cut off from gossip.",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "isolation_held_members",
			Help: "Members dead in this proxy's gossip view that it routes as last seen alive because it is isolated.",
		}),
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(d.isoM.isolated, d.isoM.episodes, d.isoM.held)
	}
}

// healthScore returns this node's health score, or -1 when unknown.
func (d *Discovery) healthScore() int {
	if d.score != nil {
		return d.score()
	}
	d.mu.Lock()
	n := d.node
	d.mu.Unlock()
	if n == nil {
		return -1
	}
	return n.HealthScore()
}

// isolationStep applies the isolation rule to ms now. feedMu is held; the
// caller stores next. prev is the state it started from.
func (d *Discovery) isolationStep(ms []Member) (next, prev isolation, end isolationEnd) {
	score := d.healthScore()
	d.mu.Lock()
	prev, rule := d.iso, d.rule
	d.mu.Unlock()
	next, end = rule.step(prev, ms, score, d.now())
	return next, prev, end
}

// recheckIsolation applies the rule to the last snapshot again and feeds
// it when the outcome changed: the health score and the clock move
// without gossip events.
func (d *Discovery) recheckIsolation() {
	d.feedMu.Lock()
	defer d.feedMu.Unlock()
	d.mu.Lock()
	ms := d.members
	d.mu.Unlock()
	if ms == nil {
		return
	}
	next, prev, _ := d.isolationStep(ms)
	if next.on != prev.on || !slices.Equal(next.heldNames(), prev.heldNames()) {
		d.feed(ms)
	}
}

// reportIsolation logs and counts a change of the isolation state.
func (d *Discovery) reportIsolation(prev, next isolation, end isolationEnd) {
	d.isoM.held.Set(float64(len(next.held)))
	switch {
	case next.on && !prev.on:
		d.isoM.isolated.Set(1)
		d.isoM.episodes.Inc()
		d.isoLg.Error("gossip contact lost: this proxy is isolated; it keeps routing to the replicas it cannot hear as last seen alive, takes them out only on data-path evidence, and forgets no member until contact is back",
			zap.Int("peers", next.peers), zap.Int("dead", next.dead), zap.Int("health_score", next.score),
			zap.Strings("held", next.heldNames()))
	case !next.on && prev.on:
		d.isoM.isolated.Set(0)
		d.isoLg.Error("gossip contact restored: this proxy is no longer isolated and routes by gossip again",
			zap.Duration("isolated_for", d.now().Sub(prev.since)), zap.String("why", end.why),
			zap.Strings("still_dead", end.dead))
	case next.on:
		for _, n := range next.heldNames() {
			if _, ok := prev.held[n]; !ok {
				d.isoLg.Warn("member dead in gossip while this proxy is isolated: routed as last seen alive", zap.String("node", n))
			}
		}
	}
}

// Isolated reports whether this proxy has lost gossip contact with its
// peers, and since when. While it has, the replicas that died in its
// gossip view meanwhile are routed as last seen alive, and no member is
// forgotten.
func (d *Discovery) Isolated() (bool, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.iso.on, d.iso.since
}
