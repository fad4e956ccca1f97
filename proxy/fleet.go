package proxy

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
)

// The proxy's side of the fleet exchange (membership.Fleet carries the
// views): it publishes, per set, the digest of its routing table, its
// votes (replicas its health checks or refused connections hold out) and
// its vetoes (replicas others vote against that it just exchanged with
// successfully), and it holds out the replicas the fleet's verdict names
// (balancer.ReasonFleet). It also compares its digests with the other
// proxies' and reports how long they have disagreed.

// FleetConfig configures how the proxy follows and reports the fleet. In
// the YAML file it is the top-level `fleet` section. Every proxy of a
// fleet should use the same values: the verdict depends on them.
type FleetConfig struct {
	// ID is this proxy's stable identity in the fleet: the other proxies
	// key its views, votes, run-time records and rolling restarts by it
	// (not by its per-boot gossip node name), so that the old and the new
	// process of one proxy during a binary upgrade count as one proxy.
	// Default "": <host name>:<port>, the port the proxy listener is bound
	// to (see ProxyID). 1 to 128 bytes of letters, digits, '.', '-', '_'
	// and ':'; unique in the fleet.
	ID string `yaml:"id"`
	// Share publishes this proxy's evidence to the other proxies and holds
	// out the replicas the fleet's verdict names. Default true; false
	// keeps rotation purely local (digests are still compared).
	Share bool `yaml:"share"`
	// Interval is how often the view is sent to every other proxy and the
	// verdict evaluated again; a proxy not heard from for 3 intervals is
	// forgotten. Default 1s; 100ms..10s.
	Interval time.Duration `yaml:"interval"`
	// SoloVoteMax bounds how long the fleet follows evidence that only one
	// proxy has: long enough for gossip to confirm a crash, short enough
	// that one proxy with a broken path cannot keep a healthy replica out
	// everywhere. Default 15s; 0 means no bound.
	SoloVoteMax time.Duration `yaml:"solo_vote_max"`
	// VetoWindow is how recent a successful exchange with a replica must
	// be (with no failure since) for this proxy to veto others' votes
	// against it. Default 5s; 100ms..1m.
	VetoWindow time.Duration `yaml:"veto_window"`
	// MaxShare is the largest share of a set's ring members the fleet
	// holds out on votes, in (0, 1]. Default 0.5 (at least one of two).
	MaxShare float64 `yaml:"max_share"`
	// DisagreementBound is how long this proxy's routing of a set may
	// differ from another proxy's before it is logged at warn level and
	// written to the audit trail. Default 10s; at least 1s.
	DisagreementBound time.Duration `yaml:"disagreement_bound"`
}

// DefaultFleetConfig returns the fleet defaults.
func DefaultFleetConfig() FleetConfig {
	return FleetConfig{Share: true, Interval: time.Second, SoloVoteMax: 15 * time.Second, VetoWindow: 5 * time.Second, MaxShare: 0.5, DisagreementBound: 10 * time.Second}
}

// Validate reports every problem.
func (c FleetConfig) Validate() error {
	var errs []error
	if c.ID != "" {
		if err := validFleetID(c.ID); err != nil {
			errs = append(errs, fmt.Errorf("id: %q %v; leave it empty for <host name>:<port>, or write e.g. edge-1", c.ID, err))
		}
	}
	if c.Interval < 100*time.Millisecond || c.Interval > 10*time.Second {
		errs = append(errs, fmt.Errorf("interval: must be between 100ms and 10s, got %s", c.Interval))
	}
	if c.SoloVoteMax < 0 {
		errs = append(errs, fmt.Errorf("solo_vote_max: must not be negative (0 means no bound), got %s", c.SoloVoteMax))
	}
	if c.VetoWindow < 100*time.Millisecond || c.VetoWindow > time.Minute {
		errs = append(errs, fmt.Errorf("veto_window: must be between 100ms and 1m, got %s", c.VetoWindow))
	}
	if !(c.MaxShare > 0 && c.MaxShare <= 1) {
		errs = append(errs, fmt.Errorf("max_share: must be greater than 0 and at most 1, got %v", c.MaxShare))
	}
	if c.DisagreementBound < time.Second {
		errs = append(errs, fmt.Errorf("disagreement_bound: must be at least 1s, got %s", c.DisagreementBound))
	}
	return errors.Join(errs...)
}

// MaxFleetIDLen bounds fleet.id: it travels in the proxy's gossip
// metadata (at most 512 bytes, with the ring fingerprints).
const MaxFleetIDLen = 128

// validFleetID says what is wrong with id as a fleet ID, or nil.
func validFleetID(id string) error {
	if id == "" || len(id) > MaxFleetIDLen {
		return fmt.Errorf("must be 1 to %d bytes long, got %d", MaxFleetIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '-', c == '_', c == ':':
		case c >= 0x80:
			return fmt.Errorf("has a non-ASCII byte at byte %d: use letters, digits, '.', '-', '_' and ':'", i)
		default:
			return fmt.Errorf("has %q at byte %d: use letters, digits, '.', '-', '_' and ':'", rune(c), i)
		}
	}
	return nil
}

// ProxyID returns this proxy's fleet ID: fleet.id, or when it is empty
// host:port, where port is the one listen (the proxy listener) is bound
// to; host is the machine's host name (os.Hostname). A process that
// inherits the listener of the one it replaces (a binary upgrade) gets
// the same ID. The error, for a default that is no valid ID (an odd host
// name), says to set fleet.id.
func (c FleetConfig) ProxyID(host string, listen net.Addr) (string, error) {
	if c.ID != "" {
		if err := validFleetID(c.ID); err != nil {
			return "", fmt.Errorf("fleet.id: %q %v", c.ID, err)
		}
		return c.ID, nil
	}
	port := ""
	if listen != nil {
		_, port, _ = net.SplitHostPort(listen.String())
	}
	if host == "" || port == "" {
		return "", fmt.Errorf("fleet.id: empty, and the default <host name>:<port> is unknown (host name %q, listener %v); set fleet.id", host, listen)
	}
	id := net.JoinHostPort(host, port)
	if err := validFleetID(id); err != nil {
		return "", fmt.Errorf("fleet.id: empty, and the default <host name>:<port> %q %v; set fleet.id", id, err)
	}
	return id, nil
}

// FleetEvent is a change the fleet caused or this proxy noticed, for the
// audit trail: Kind is "fleet_hold" (the fleet holds a replica out on
// others' evidence), "fleet_release", "fleet_disagreement" (this proxy's
// routing of a set has differed from a peer's for longer than
// DisagreementBound) or "fleet_agreement" (it agrees again).
type FleetEvent struct {
	Kind    string
	Set     string
	Replica string // fleet_hold, fleet_release
	Peer    string // fleet_disagreement, fleet_agreement: the peer's fleet ID
	Voters  []string
	// For disagreements: the two digests and how long they have differed.
	Digest, PeerDigest string
	For                time.Duration
}

// vetoGrain is how stale a backend's lastOK may be: the request path
// refreshes it at most this often.
const vetoGrain = int64(50 * time.Millisecond)

// fleetView is the proxy's record of the fleet: what the peers said last
// and which (peer, set) pairs disagree since when. Guarded by mu.
type fleetView struct {
	mu       sync.Mutex
	peers    []balancer.FleetPeer
	disagree map[[2]string]time.Time // (peer ID, set) → since when the digests differ
	reported map[[2]string]bool      // disagreements past the bound, reported
}

// FleetSets implements membership.FleetTarget: this proxy's view of every
// set it serves. Nothing of it allocates on the request path.
func (p *Proxy) FleetSets(now time.Time) []balancer.FleetSet {
	rt := p.routes.Load()
	p.fleet.mu.Lock()
	peers := p.fleet.peers
	p.fleet.mu.Unlock()
	out := make([]balancer.FleetSet, 0, len(rt.names))
	for _, name := range rt.names {
		out = append(out, p.fleetSet(rt.byName[name].st, peers, now))
	}
	return out
}

// fleetSet is one set's view: digest, votes (shared reasons only) and
// vetoes of replicas the peers vote against.
func (p *Proxy) fleetSet(st *setState, peers []balancer.FleetPeer, now time.Time) balancer.FleetSet {
	t := st.router.Table()
	fs := balancer.FleetSet{Set: st.name, Digest: t.Digest()}
	for slot := 0; slot < t.Len(); slot++ {
		if n := t.Backend(slot).Inflight(); n > 0 {
			if fs.Inflight == nil {
				fs.Inflight = map[string]int64{}
			}
			fs.Inflight[t.Replica(slot).Name] = n
		}
	}
	if !p.cfg.Fleet.Share {
		return fs
	}
	st.mu.Lock()
	for _, m := range t.Members() {
		if r := m.Excluded & balancer.SharedReasons; r != 0 && m.Slot >= 0 {
			since, ok := st.voteSince[m.Name]
			if !ok {
				since = now
			}
			fs.Votes = append(fs.Votes, balancer.FleetVote{Replica: m.Name, Reason: r, Since: since})
		}
	}
	st.mu.Unlock()
	// Vetoes: only for replicas someone votes against, to keep views small.
	against := map[string]bool{}
	for _, peer := range peers {
		for _, s := range peer.Sets {
			if s.Set == st.name {
				for _, v := range s.Votes {
					against[v.Replica] = true
				}
			}
		}
	}
	if len(against) == 0 {
		return fs
	}
	window := now.Add(-p.cfg.Fleet.VetoWindow).UnixNano()
	for _, m := range t.Members() {
		if !against[m.Name] || m.Slot < 0 || m.Excluded&balancer.SharedReasons != 0 {
			continue
		}
		b := t.Backend(m.Slot)
		if ok, bad := b.lastOK.Load(), b.lastFail.Load(); ok > window && ok > bad {
			fs.Vetoes = append(fs.Vetoes, m.Name)
		}
	}
	return fs
}

// SetFleet implements membership.FleetTarget: it applies the fleet's
// verdict to every set (holding out, or letting back, replicas with
// balancer.ReasonFleet) and compares this proxy's digests with the peers'.
func (p *Proxy) SetFleet(peers []balancer.FleetPeer, now time.Time) {
	p.fleet.mu.Lock()
	p.fleet.peers = peers
	p.fleet.mu.Unlock()
	rt := p.routes.Load()
	for _, name := range rt.names {
		st := rt.byName[name].st
		if p.cfg.Fleet.Share {
			p.applyVerdict(st, peers, now)
		}
	}
	p.compareDigests(rt, peers, now)
}

// applyVerdict holds out exactly the replicas of st the fleet's verdict
// names.
func (p *Proxy) applyVerdict(st *setState, peers []balancer.FleetPeer, now time.Time) {
	self := p.fleetSet(st, peers, now)
	views := append(slices.Clone(peers), balancer.FleetPeer{ID: "", Sets: []balancer.FleetSet{self}})
	t := st.router.Table()
	var ring []string
	for _, m := range t.Members() {
		if m.Slot >= 0 {
			ring = append(ring, m.Name)
		}
	}
	slices.Sort(ring)
	verdict := balancer.FleetVerdict(st.name, ring, views, now, balancer.FleetRules{SoloVoteMax: p.cfg.Fleet.SoloVoteMax, MaxShare: p.cfg.Fleet.MaxShare})
	want := make(map[string]balancer.FleetExclusion, len(verdict))
	for _, e := range verdict {
		// The proxy's own vote ("") counts for the verdict; to the outside
		// it is this proxy's.
		for i, v := range e.Voters {
			if v == "" {
				e.Voters[i] = "self"
			}
		}
		want[e.Replica] = e
	}
	st.mu.Lock()
	prev := st.fleetOut
	st.fleetOut = want
	st.mu.Unlock()
	for name, e := range want {
		if _, ok := prev[name]; !ok {
			st.router.SetExcluded(name, balancer.ReasonFleet, true)
			p.log.Info("the fleet holds a replica out on another proxy's evidence",
				zap.String("set", st.name), zap.String("replica", name), zap.Strings("voters", e.Voters))
			p.fleetEvent(FleetEvent{Kind: "fleet_hold", Set: st.name, Replica: name, Voters: e.Voters})
		}
	}
	for name := range prev {
		if _, ok := want[name]; !ok {
			st.router.SetExcluded(name, balancer.ReasonFleet, false)
			p.log.Info("the fleet lets a replica back", zap.String("set", st.name), zap.String("replica", name))
			p.fleetEvent(FleetEvent{Kind: "fleet_release", Set: st.name, Replica: name})
		}
	}
}

func (p *Proxy) fleetEvent(e FleetEvent) {
	if p.opts.FleetEvents != nil {
		p.opts.FleetEvents(e)
	}
}

// compareDigests records, for every peer and every set both serve, since
// when their digests differ, and reports disagreements that outlast the
// bound (and their end).
func (p *Proxy) compareDigests(rt *routes, peers []balancer.FleetPeer, now time.Time) {
	p.fleet.mu.Lock()
	defer p.fleet.mu.Unlock()
	if p.fleet.disagree == nil {
		p.fleet.disagree, p.fleet.reported = map[[2]string]time.Time{}, map[[2]string]bool{}
	}
	seen := map[[2]string]bool{}
	for _, peer := range peers {
		for _, s := range peer.Sets {
			rs := rt.byName[s.Set]
			if rs == nil || s.Digest == "" {
				continue
			}
			k := [2]string{peer.ID, s.Set}
			mine := rs.st.router.Table().Digest()
			if mine == s.Digest {
				continue
			}
			seen[k] = true
			since, ok := p.fleet.disagree[k]
			if !ok {
				since = now
				p.fleet.disagree[k] = now
			}
			if d := now.Sub(since); d >= p.cfg.Fleet.DisagreementBound && !p.fleet.reported[k] {
				p.fleet.reported[k] = true
				p.log.Warn("another proxy routes a replica set differently, for longer than fleet.disagreement_bound: some keys go to different replicas",
					zap.String("set", s.Set), zap.String("peer", peer.ID), zap.Duration("for", d),
					zap.String("digest", mine), zap.String("peer_digest", s.Digest))
				p.fleetEvent(FleetEvent{Kind: "fleet_disagreement", Set: s.Set, Peer: peer.ID, Digest: mine, PeerDigest: s.Digest, For: d})
			}
		}
	}
	for k, since := range p.fleet.disagree {
		if seen[k] {
			continue
		}
		if p.fleet.reported[k] {
			p.log.Info("another proxy routes a replica set like this one again",
				zap.String("set", k[1]), zap.String("peer", k[0]), zap.Duration("disagreed_for", now.Sub(since)))
			p.fleetEvent(FleetEvent{Kind: "fleet_agreement", Set: k[1], Peer: k[0], For: now.Sub(since)})
		}
		delete(p.fleet.disagree, k)
		delete(p.fleet.reported, k)
	}
	p.metrics.setFleet(rt, p.fleet.disagree, now)
}

// FleetSetStatus is one set as the fleet sees it, for the admin API.
type FleetSetStatus struct {
	Set    string
	Digest string
	// Held are the replicas the fleet holds out on votes, sorted.
	Held []balancer.FleetExclusion
	// Peers are the other proxies' digests of the set, sorted by ID.
	Peers []FleetPeerSet
}

// FleetPeerSet is one peer's digest of a set and whether it agrees.
type FleetPeerSet struct {
	// ID is the peer's fleet ID.
	ID     string
	Digest string
	Agrees bool
	// Since is when the disagreement started (zero while it agrees).
	Since time.Time
}

// FleetStatus reports every set's digest, what the fleet holds out and
// which peers agree, from the last views (SetFleet).
func (p *Proxy) FleetStatus() []FleetSetStatus {
	rt := p.routes.Load()
	p.fleet.mu.Lock()
	defer p.fleet.mu.Unlock()
	out := make([]FleetSetStatus, 0, len(rt.names))
	for _, name := range rt.names {
		st := rt.byName[name].st
		fs := FleetSetStatus{Set: name, Digest: st.router.Table().Digest(), Held: []balancer.FleetExclusion{}, Peers: []FleetPeerSet{}}
		st.mu.Lock()
		for _, e := range st.fleetOut {
			fs.Held = append(fs.Held, e)
		}
		st.mu.Unlock()
		slices.SortFunc(fs.Held, func(a, b balancer.FleetExclusion) int { return cmp.Compare(a.Replica, b.Replica) })
		for _, peer := range p.fleet.peers {
			for _, s := range peer.Sets {
				if s.Set == name {
					since := p.fleet.disagree[[2]string{peer.ID, name}]
					fs.Peers = append(fs.Peers, FleetPeerSet{ID: peer.ID, Digest: s.Digest, Agrees: s.Digest == fs.Digest, Since: since})
				}
			}
		}
		out = append(out, fs)
	}
	return out
}

// noteVotes records when each replica's shared exclusion started (the
// age its vote carries) and tells Options.FleetChanged that the view
// changed. Called for every table the set's Router publishes.
func (p *Proxy) noteVotes(st *setState, t *balancer.Table[*Backend]) {
	now := time.Now()
	st.mu.Lock()
	since := make(map[string]time.Time, len(st.voteSince))
	for _, m := range t.Members() {
		if m.Excluded&balancer.SharedReasons != 0 {
			s, ok := st.voteSince[m.Name]
			if !ok {
				s = now
			}
			since[m.Name] = s
		}
	}
	st.voteSince = since
	st.mu.Unlock()
	if p.opts.FleetChanged != nil {
		p.opts.FleetChanged()
	}
}

// FleetInflight returns, per replica of a set, the requests in flight to
// it from the other proxies (their last views, at most fleet.interval
// old), and how many proxies that sum covers. This proxy's own count is
// ReplicaLoad's.
func (p *Proxy) FleetInflight(set string) (perReplica map[string]int64, proxies int) {
	p.fleet.mu.Lock()
	defer p.fleet.mu.Unlock()
	perReplica = map[string]int64{}
	for _, peer := range p.fleet.peers {
		for _, s := range peer.Sets {
			if s.Set != set {
				continue
			}
			proxies++
			for name, n := range s.Inflight {
				perReplica[name] += n
			}
		}
	}
	return perReplica, proxies
}
