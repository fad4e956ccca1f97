package membership_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"keyway/balancer"
	"keyway/internal/poll"
	"keyway/membership"
)

// viewTarget is a proxy's side of the fleet exchange: it publishes one
// set with a fixed digest, marking its views with an in-flight count
// (which process sent a view), and records every list of peers handed
// over.
type viewTarget struct {
	digest string
	mark   int64
	mu     sync.Mutex
	handed [][]balancer.FleetPeer
}

func (v *viewTarget) FleetSets(time.Time) []balancer.FleetSet {
	return []balancer.FleetSet{{Set: "orders", Digest: v.digest, Inflight: map[string]int64{"o-0": v.mark}}}
}

func (v *viewTarget) SetFleet(peers []balancer.FleetPeer, _ time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.handed = append(v.handed, peers)
}

func (v *viewTarget) history() [][]balancer.FleetPeer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.handed)
}

// fleetProxy is a proxy's gossip node and fleet exchange, running until
// stop or the end of the test.
type fleetProxy struct {
	node   *membership.Node
	fleet  *membership.Fleet
	target *viewTarget
	reg    *prometheus.Registry
	stop   func()
}

func startFleetProxy(t *testing.T, id string, mark int64, join ...string) *fleetProxy {
	t.Helper()
	p := &fleetProxy{target: &viewTarget{digest: "d1", mark: mark}, reg: prometheus.NewPedanticRegistry()}
	p.fleet = membership.NewFleet(p.target, membership.FleetOptions{
		Logger: testLogger(t).Named(id + ".fleet"), Registerer: p.reg, Interval: 100 * time.Millisecond,
	})
	cfg := testConfig()
	cfg.Join = join
	n, err := membership.New(cfg, membership.Meta{Role: membership.RoleProxy, ID: id, Addr: "admin-" + id}, membership.Options{
		Logger: testLogger(t).Named(id),
	})
	if err != nil {
		t.Fatal(err)
	}
	p.node = n
	p.fleet.Attach(n)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = n.Run(ctx) }()
	go func() { defer wg.Done(); _ = p.fleet.Run(ctx) }()
	<-n.Started()
	var once sync.Once
	p.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(p.stop)
	return p
}

// views returns the fleet exchange's count of views received with this
// result.
func (p *fleetProxy) views(t *testing.T, result string) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "keyway_fleet_views_received_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no keyway_fleet_views_received_total{result=%q}", result)
	return 0
}

// During a binary upgrade the old and the new process of one proxy are
// both alive, with one fleet ID and two node names. Another proxy sees one
// peer; it applies the new process's views (their sequence numbers start
// again) and counts the old one's as stale, so the view it follows never
// flips back, but the old process's requests in flight still add to the
// proxy's (1 from the old, 2 from the new: 1, then 3, then 2 once the old
// one is gone); no list it hands over holds two views of that proxy, and
// none disagrees. The two processes send each other nothing. The peer
// stays while either process is alive and goes with the last.
func TestFleetKeysProxiesByIDAcrossAnUpgrade(t *testing.T) {
	c := startFleetProxy(t, "edge-c", 0)
	old := startFleetProxy(t, "edge-b", 1, c.node.GossipAddr())
	peer := func() (membership.PeerStatus, int) {
		ps := c.fleet.Peers()
		if len(ps) != 1 {
			return membership.PeerStatus{}, len(ps)
		}
		return ps[0], 1
	}
	poll.Until(t, 10*time.Second, "edge-c follows the old process's views", func() bool {
		p, n := peer()
		return n == 1 && p.ID == "edge-b" && p.Node == old.node.Name()
	})

	upgraded := startFleetProxy(t, "edge-b", 2, c.node.GossipAddr())
	poll.Until(t, 10*time.Second, "edge-c follows the new process's views, with both processes listed", func() bool {
		p, n := peer()
		if n != 1 {
			t.Fatalf("edge-c has %d peers while one proxy upgrades: %+v", n, c.fleet.Peers())
		}
		return p.ID == "edge-b" && p.Node == upgraded.node.Name() && p.Admin == "admin-edge-b" &&
			slices.Equal(p.Nodes, sortedNames(old.node, upgraded.node)) && p.Sets[0].Inflight["o-0"] == 3
	})
	// The old process keeps sending views with higher sequence numbers:
	// stale now.
	stale := c.views(t, "stale")
	poll.Until(t, 10*time.Second, "the old process's views dropped as stale", func() bool {
		if p, n := peer(); n != 1 || p.Node != upgraded.node.Name() {
			t.Fatalf("edge-c follows %+v (%d peers) after the new process's view", p, n)
		}
		return c.views(t, "stale") >= stale+3
	})

	old.stop()
	poll.Until(t, 10*time.Second, "edge-c lists the new process alone, and its requests in flight alone", func() bool {
		p, n := peer()
		return n == 1 && slices.Equal(p.Nodes, []string{upgraded.node.Name()}) && p.Sets[0].Inflight["o-0"] == 2
	})

	var marks []int64
	for _, peers := range c.target.history() {
		if len(peers) > 1 {
			t.Fatalf("edge-c was handed %d views: %+v", len(peers), peers)
		}
		for _, p := range peers {
			if p.ID != "edge-b" || p.Sets[0].Digest != c.target.digest {
				t.Fatalf("edge-c was handed %+v: another ID, or a disagreeing digest", p)
			}
			if len(marks) == 0 || marks[len(marks)-1] != p.Sets[0].Inflight["o-0"] {
				marks = append(marks, p.Sets[0].Inflight["o-0"])
			}
		}
	}
	if !slices.Equal(marks, []int64{1, 3, 2}) {
		t.Fatalf("edge-c's requests in flight of edge-b went %v, want [1 3 2] (the old process's, both, the new one's: never back)", marks)
	}
	for _, p := range []*fleetProxy{old, upgraded} {
		if got := p.views(t, "invalid"); got != 0 {
			t.Fatalf("a process of edge-b received %v views carrying its own ID: the two processes must not exchange views", got)
		}
		for _, peers := range p.target.history() {
			for _, v := range peers {
				if v.ID != "edge-c" {
					t.Fatalf("a process of edge-b was handed a view of %q", v.ID)
				}
			}
		}
	}

	upgraded.stop()
	poll.Until(t, 10*time.Second, "edge-b forgotten once no process carries its ID", func() bool {
		return len(c.fleet.Peers()) == 0
	})
}

func sortedNames(ns ...*membership.Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name())
	}
	slices.Sort(out)
	return out
}
