package membership

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/balancer"
)

// The fleet exchange: every proxy tells every other proxy, every Interval
// and whenever its view changes, what decides its routing per replica set
// (a digest), its local evidence against replicas (votes) and its recent
// good exchanges with replicas others vote against (vetoes). Each proxy
// then applies the same rule (balancer.FleetVerdict) to all views. Direct
// messages, not gossip broadcasts: the fleet has a handful of proxies, a
// message is small, and a periodic resend repairs any loss.
//
// A proxy is known by its stable ID (Meta.ID), not by its gossip node
// name: during a binary upgrade the old and the new process of one proxy
// are both alive, with two node names and one ID. The others keep one
// view per ID, the one from the newest boot (the new process's sequence
// numbers start again at 1), and the two processes send each other
// nothing.

// FleetTarget is what the fleet exchange reads and feeds: the proxy.
type FleetTarget interface {
	// FleetSets returns this proxy's view of every set it serves, for the
	// others.
	FleetSets(now time.Time) []balancer.FleetSet
	// SetFleet hands over the other proxies' views, after every change and
	// every Interval (verdicts depend on time).
	SetFleet(peers []balancer.FleetPeer, now time.Time)
}

// FleetOptions are a Fleet's dependencies; all optional.
type FleetOptions struct {
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	// Interval is how often the view is sent to every other proxy and the
	// verdicts are evaluated again. 0 means 1s. A peer not heard from for
	// 3 intervals is forgotten (its votes lapse).
	Interval time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Hold, if non-nil, keeps this proxy's view to itself until it is
	// closed: a process that does not route yet (an upgrade's new one,
	// which accepts only once it can) would announce an incomplete view,
	// which replaces its old process's.
	Hold <-chan struct{}
}

// Fleet exchanges proxy views with the other proxies of the gossip
// cluster. Safe for concurrent use. Attach a Node, route messages to
// HandleMessage, and Run it.
type Fleet struct {
	target   FleetTarget
	log      *zap.Logger
	interval time.Duration
	now      func() time.Time
	poke     chan struct{}
	hold     <-chan struct{}
	sends    sync.WaitGroup // reliable sends in flight (Run waits for them)

	received *prometheus.CounterVec // result
	peersG   prometheus.Gauge

	mu      sync.Mutex
	node    *Node
	self    string // this proxy's ID (the attached Node's)
	boot    int64  // this process's boot (the attached Node's)
	seq     uint64
	peers   map[string]*fleetPeer // by proxy ID
	busy    map[string]bool       // gossip nodes with a reliable send in flight
	sendFn  func(node string, msg []byte, reliable bool) error
	dupWarn time.Time // when a view carrying this proxy's own ID was last logged
}

type fleetPeer struct {
	view  balancer.FleetPeer
	node  string // the gossip node that sent the view
	boot  int64  // the sender's boot: a view from an older one is stale
	seq   uint64
	heard time.Time
	addr  string   // the peer's admin address, from its gossip metadata
	nodes []string // the alive gossip nodes carrying its ID
	// older is the last view of the proxy's previous process (a binary
	// upgrade's old one, still draining) while it is alive: its votes and
	// vetoes still count, as the proxy's, until the new process has the
	// evidence itself or the old one is gone, and its requests in flight
	// add to the new one's.
	older *olderView
}

type olderView struct {
	view  balancer.FleetPeer
	node  string
	heard time.Time
}

// merged is the peer's view with its older process's votes and vetoes
// that the newer one lacks, and its requests in flight added.
func (p *fleetPeer) merged() balancer.FleetPeer {
	if p.older == nil {
		return p.view
	}
	out := balancer.FleetPeer{ID: p.view.ID, Sets: make([]balancer.FleetSet, 0, len(p.view.Sets))}
	for _, s := range p.view.Sets {
		for _, o := range p.older.view.Sets {
			if o.Set != s.Set {
				continue
			}
			for _, v := range o.Votes {
				if !slices.ContainsFunc(s.Votes, func(w balancer.FleetVote) bool { return w.Replica == v.Replica && w.Reason == v.Reason }) {
					s.Votes = append(slices.Clip(s.Votes), v)
				}
			}
			for _, v := range o.Vetoes {
				if !slices.Contains(s.Vetoes, v) {
					s.Vetoes = append(slices.Clip(s.Vetoes), v)
				}
			}
			if len(o.Inflight) > 0 {
				// Both processes' requests in flight are the proxy's.
				sum := maps.Clone(s.Inflight)
				if sum == nil {
					sum = map[string]int64{}
				}
				for r, k := range o.Inflight {
					sum[r] += k
				}
				s.Inflight = sum
			}
		}
		out.Sets = append(out.Sets, s)
	}
	return out
}

// PeerStatus is one other proxy as the fleet exchange knows it.
type PeerStatus struct {
	// ID is the proxy's stable ID (its node name if it advertises none).
	ID string
	// Node is the gossip node whose view applies (the newest boot heard),
	// and Nodes every alive gossip node carrying the ID, sorted: two while
	// the proxy upgrades its binary.
	Node  string
	Nodes []string
	// Admin is the peer's admin API address ("" when it advertises none).
	Admin string
	// Heard is when its last view arrived.
	Heard time.Time
	// Sets are its views, by set.
	Sets []balancer.FleetSet
}

const proxyStateKind = "proxy_state"

// proxyState is the wire form of a view: JSON, kind "proxy_state". ID
// and Boot are absent from an older proxy: its node name is its ID.
type proxyState struct {
	Kind string     `json:"kind"`
	Node string     `json:"node"`
	ID   string     `json:"id,omitempty"`
	Boot int64      `json:"boot,omitempty"`
	Seq  uint64     `json:"seq"`
	Sets []stateSet `json:"sets"`
}

type stateSet struct {
	Set      string           `json:"set"`
	Digest   string           `json:"digest"`
	Votes    []stateVote      `json:"votes,omitempty"`
	Vetoes   []string         `json:"vetoes,omitempty"`
	Inflight map[string]int64 `json:"inflight,omitempty"`
}

type stateVote struct {
	Replica string `json:"replica"`
	Reason  string `json:"reason"`
	// AgeMS is how long ago the vote started, on the sender's clock:
	// receivers need no synchronized clocks.
	AgeMS int64 `json:"age_ms"`
}

// NewFleet returns a Fleet feeding t. Attach the Node before Run.
func NewFleet(t FleetTarget, opts FleetOptions) *Fleet {
	f := &Fleet{
		target:   t,
		log:      cmp.Or(opts.Logger, zap.NewNop()),
		interval: cmp.Or(opts.Interval, time.Second),
		now:      opts.Now,
		poke:     make(chan struct{}, 1),
		hold:     opts.Hold,
		peers:    map[string]*fleetPeer{},
		busy:     map[string]bool{},
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "fleet", Name: "views_received_total",
			Help: "Views of other proxies received, by result: applied, stale (an older one than known) or invalid.",
		}, []string{"result"}),
		peersG: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "fleet", Name: "peers",
			Help: "Other proxies this proxy has a current view of.",
		}),
	}
	if f.now == nil {
		f.now = time.Now
	}
	for _, r := range []string{"applied", "stale", "invalid"} {
		f.received.WithLabelValues(r)
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(f.received, f.peersG)
	}
	return f
}

// Attach sets the gossip node the views go through; its ID names this
// proxy in them.
func (f *Fleet) Attach(n *Node) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node, f.self, f.boot = n, n.ID(), n.Meta().Boot
	f.sendFn = func(node string, msg []byte, reliable bool) error {
		if reliable {
			return n.SendReliable(node, msg)
		}
		return n.Send(node, msg)
	}
	n.Handle(proxyStateKind, RoleProxy, f.handleState)
}

// Poke sends this proxy's view now rather than at the next interval (the
// proxy's rotation or evidence changed). It never blocks.
func (f *Fleet) Poke() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// HandleMessage takes a view another proxy sent (a membership
// MessageHandler; other kinds are ignored).
func (f *Fleet) HandleMessage(from string, msg []byte) {
	if MessageKind(msg) == proxyStateKind {
		f.handleState(Message{From: from, Body: msg})
	}
}

// handleState takes a view another proxy sent.
func (f *Fleet) handleState(m Message) {
	var ps proxyState
	if err := json.Unmarshal(m.Body, &ps); err != nil || ps.Node == "" {
		f.received.WithLabelValues("invalid").Inc()
		return
	}
	id := cmp.Or(ps.ID, ps.Node)
	now := f.now()
	view := balancer.FleetPeer{ID: id, Sets: make([]balancer.FleetSet, 0, len(ps.Sets))}
	for _, s := range ps.Sets {
		fs := balancer.FleetSet{Set: s.Set, Digest: s.Digest, Vetoes: s.Vetoes, Inflight: s.Inflight}
		for _, v := range s.Votes {
			fs.Votes = append(fs.Votes, balancer.FleetVote{
				Replica: v.Replica, Reason: balancer.ParseReason(v.Reason),
				Since: now.Add(-time.Duration(max(v.AgeMS, 0)) * time.Millisecond),
			})
		}
		view.Sets = append(view.Sets, fs)
	}
	f.mu.Lock()
	if id == f.self && f.self != "" {
		// The other process of this proxy sends none: another proxy
		// claims this proxy's ID.
		warn := now.Sub(f.dupWarn) >= time.Minute
		if warn {
			f.dupWarn = now
		}
		f.mu.Unlock()
		f.received.WithLabelValues("invalid").Inc()
		if warn {
			f.log.Warn("another proxy uses this proxy's fleet ID: their views and votes are confused; give every proxy its own fleet.id",
				zap.String("id", id), zap.String("node", ps.Node))
		}
		return
	}
	p := f.peers[id]
	if p != nil && (ps.Boot < p.boot || ps.Boot == p.boot && ps.Seq <= p.seq && ps.Seq != 0) {
		// An older process of the proxy (a binary upgrade), or an older
		// view of the same one: stale. The older process's votes and
		// vetoes still count while it runs (fleetPeer.older).
		var peers []balancer.FleetPeer
		if ps.Boot < p.boot && p.older != nil && p.older.node == ps.Node {
			p.older.view, p.older.heard = view, now
			peers = f.viewsLocked()
		}
		f.mu.Unlock()
		f.received.WithLabelValues("stale").Inc()
		if peers != nil {
			f.target.SetFleet(peers, now)
		}
		return
	}
	if p == nil {
		p = &fleetPeer{}
		f.peers[id] = p
	}
	if p.node != "" && ps.Boot > p.boot {
		p.older = &olderView{view: p.view, node: p.node, heard: p.heard}
	}
	p.view, p.node, p.boot, p.seq, p.heard = view, ps.Node, ps.Boot, ps.Seq, now
	f.peersG.Set(float64(len(f.peers)))
	peers := f.viewsLocked()
	f.mu.Unlock()
	f.received.WithLabelValues("applied").Inc()
	f.target.SetFleet(peers, now)
}

// viewsLocked returns the peers' views sorted by ID; f.mu is held.
func (f *Fleet) viewsLocked() []balancer.FleetPeer {
	out := make([]balancer.FleetPeer, 0, len(f.peers))
	for _, p := range f.peers {
		out = append(out, p.merged())
	}
	slices.SortFunc(out, func(a, b balancer.FleetPeer) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Peers returns the other proxies with a current view, sorted by ID.
func (f *Fleet) Peers() []PeerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]PeerStatus, 0, len(f.peers))
	for id, p := range f.peers {
		nodes := p.nodes
		if len(nodes) == 0 {
			nodes = []string{p.node} // not seen in gossip since the view came
		}
		out = append(out, PeerStatus{ID: id, Node: p.node, Nodes: slices.Clone(nodes), Admin: p.addr, Heard: p.heard, Sets: p.merged().Sets})
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Run sends this proxy's view to every other alive proxy every Interval
// and on Poke, forgets peers not heard from for 3 intervals or whose ID
// no alive member carries any more, and hands the views to the target at
// every tick, until ctx is done.
func (f *Fleet) Run(ctx context.Context) error {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	defer f.sends.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			f.step()
		case <-f.poke:
			f.publish()
		}
	}
}

// step is one tick: expire, publish, evaluate.
func (f *Fleet) step() {
	now := f.now()
	f.mu.Lock()
	alive := f.aliveIDsLocked()
	for id, p := range f.peers {
		a, ok := alive[id]
		if !ok || now.Sub(p.heard) > 3*f.interval {
			delete(f.peers, id)
			continue
		}
		p.addr, p.nodes = a.addr, a.nodes
		if p.older != nil && (!slices.Contains(a.nodes, p.older.node) || now.Sub(p.older.heard) > 3*f.interval) {
			p.older = nil // the old process is gone
		}
	}
	f.peersG.Set(float64(len(f.peers)))
	peers := f.viewsLocked()
	f.mu.Unlock()
	f.target.SetFleet(peers, now)
	f.publish()
}

// aliveProxy is what gossip says of one proxy ID.
type aliveProxy struct {
	addr  string   // the admin address of its newest boot
	boot  int64    // that boot
	nodes []string // its alive gossip nodes, sorted
}

// aliveIDsLocked returns the other alive proxies by ID; f.mu is held.
func (f *Fleet) aliveIDsLocked() map[string]aliveProxy {
	out := map[string]aliveProxy{}
	if f.node == nil {
		return out
	}
	for _, m := range f.node.Members() { // sorted by node name
		if m.Meta.Role != RoleProxy || m.Status != StatusAlive || m.Self {
			continue
		}
		a, seen := out[m.ID()]
		if !seen || m.Meta.Boot > a.boot {
			a.addr, a.boot = m.Meta.Addr, m.Meta.Boot
		}
		a.nodes = append(a.nodes, m.Node)
		out[m.ID()] = a
	}
	return out
}

// targetsLocked returns the gossip nodes this proxy's view goes to: every
// other alive proxy, but not the other process of this proxy (its
// upgrade's), which shares this proxy's ID; f.mu is held.
func (f *Fleet) targetsLocked() []string {
	if f.node == nil {
		return nil
	}
	var out []string
	for _, m := range f.node.Members() {
		if m.Meta.Role == RoleProxy && m.Status == StatusAlive && !m.Self && m.ID() != f.self {
			out = append(out, m.Node)
		}
	}
	return out
}

// MaxPacket is the largest user message sent as one UDP packet (a view,
// run-time records); larger ones go over TCP (SendReliable), one at a
// time per peer.
const MaxPacket = 1200

// publish sends this proxy's view to every other alive proxy.
func (f *Fleet) publish() {
	if f.hold != nil {
		select {
		case <-f.hold:
		default:
			return
		}
	}
	now := f.now()
	f.mu.Lock()
	ready := f.sendFn != nil
	f.mu.Unlock()
	if !ready {
		return
	}
	sets := f.target.FleetSets(now)
	f.mu.Lock()
	f.seq++
	ps := proxyState{Kind: proxyStateKind, Node: f.node.Name(), ID: f.self, Boot: f.boot, Seq: f.seq, Sets: make([]stateSet, 0, len(sets))}
	for _, s := range sets {
		ss := stateSet{Set: s.Set, Digest: s.Digest, Vetoes: s.Vetoes, Inflight: s.Inflight}
		for _, v := range s.Votes {
			ss.Votes = append(ss.Votes, stateVote{Replica: v.Replica, Reason: v.Reason.String(), AgeMS: now.Sub(v.Since).Milliseconds()})
		}
		ps.Sets = append(ps.Sets, ss)
	}
	msg, err := json.Marshal(ps)
	if err != nil {
		f.mu.Unlock()
		f.log.Error("fleet view not encoded", zap.Error(err))
		return
	}
	send := f.sendFn
	targets := f.targetsLocked()
	f.mu.Unlock()
	for _, name := range targets {
		if len(msg) <= MaxPacket {
			if err := send(name, msg, false); err != nil {
				f.log.Debug("fleet view not sent", zap.String("proxy", name), zap.Error(err))
			}
			continue
		}
		f.mu.Lock()
		if f.busy[name] {
			f.mu.Unlock()
			continue // the last one is still on its way: the next tick sends a newer one
		}
		f.busy[name] = true
		f.mu.Unlock()
		f.sends.Go(func() {
			if err := send(name, msg, true); err != nil {
				f.log.Debug("fleet view not sent", zap.String("proxy", name), zap.Error(err))
			}
			f.mu.Lock()
			delete(f.busy, name)
			f.mu.Unlock()
		})
	}
}
