package membership_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"keyway/balancer"
	"keyway/internal/gossipfault"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/membership"
)

// routes is a Discovery target that remembers the replicas it was last
// fed and every replica it was fed as down since the last reset, and when.
type routes struct {
	mu     sync.Mutex
	last   []balancer.Replica
	downed map[string]time.Time
}

func (r *routes) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downed = map[string]time.Time{}
}

func (r *routes) SetReplicaSet(set string, rs []balancer.Replica) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = rs
	for _, x := range rs {
		if _, seen := r.downed[x.Name]; x.Down && !seen {
			r.downed[x.Name] = time.Now()
		}
	}
	return set == "orders"
}
func (r *routes) ReplicaLoad(set, replica string) (int64, bool, bool) { return 0, false, false }
func (r *routes) Fingerprints() map[string]string                     { return map[string]string{"orders": "fp"} }

func (r *routes) up() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.last {
		if !x.Down {
			n++
		}
	}
	return n
}

// proxyDiscovery runs a proxy's gossip node and Discovery joined to join,
// feeding a routes target, until the test ends.
func proxyDiscovery(t *testing.T, join string, wrap func(*memberlist.NetTransport) memberlist.NodeAwareTransport) (*membership.Node, *membership.Discovery, *routes) {
	t.Helper()
	rt := &routes{downed: map[string]time.Time{}}
	disc := membership.NewDiscovery(rt, membership.DiscoveryOptions{Logger: testLogger(t).Named("discovery")})
	cfg := testConfig()
	cfg.Join = []string{join}
	cfg.RejoinInterval = 2 * time.Second
	px, err := membership.New(cfg, membership.Meta{Role: membership.RoleProxy}, membership.Options{
		Logger: testLogger(t).Named("proxy"), Sink: disc, Transport: wrap,
	})
	if err != nil {
		t.Fatal(err)
	}
	disc.Attach(px)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); px.Run(ctx) }()
	go func() { defer wg.Done(); disc.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return px, disc, rt
}

func deadReplicas(n *membership.Node) int {
	c := 0
	for _, m := range n.Members() {
		if m.Meta.Role == membership.RoleReplica && m.Status == membership.StatusDead {
			c++
		}
	}
	return c
}

// A proxy's Discovery on a real gossip node, cut off from 4 replicas
// with internal/gossipfault: its node marks them all dead, yet none is
// ever fed as down; the isolation is reported and ends when the network
// heals.
func TestCutProxyKeepsReplicas(t *testing.T) {
	slow.Skip(t)
	seed := startNode(t, testConfig(), replicaMeta("r0"), nil)
	cfg := testConfig()
	cfg.Join = []string{seed.GossipAddr()}
	for i := 1; i < 4; i++ {
		startNode(t, cfg, replicaMeta(fmt.Sprintf("r%d", i)), nil)
	}
	sw := gossipfault.New()
	px, disc, rt := proxyDiscovery(t, seed.GossipAddr(), sw.Wrap)
	poll.Until(t, 15*time.Second, "the proxy routes to 4 replicas", func() bool { return rt.up() == 4 })

	rt.reset()
	cut := time.Now()
	sw.Cut()
	poll.Until(t, 30*time.Second, "the proxy finds itself isolated", func() bool { on, _ := disc.Isolated(); return on })
	detected := time.Since(cut)
	poll.Until(t, 60*time.Second, "the proxy's gossip marks all 4 replicas dead", func() bool { return deadReplicas(px) == 4 })
	allDead := time.Since(cut)
	if on, _ := disc.Isolated(); !on || rt.up() != 4 {
		t.Fatalf("with every replica dead in gossip: isolated %v, %d replicas fed up", on, rt.up())
	}

	sw.Heal()
	healed := time.Now()
	poll.Until(t, 30*time.Second, "the isolation ends", func() bool { on, _ := disc.Isolated(); return !on })
	poll.Until(t, 10*time.Second, "all replicas alive again", func() bool { return deadReplicas(px) == 0 })
	t.Logf("cut: isolated after %s, all 4 replicas dead in gossip after %s; heal: isolation over after %s",
		detected.Round(time.Millisecond), allDead.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for name, when := range rt.downed {
		t.Errorf("%s fed as down %s after the cut (the heal was %s after it)", name, when.Sub(cut), healed.Sub(cut))
	}
}

// One replica cut off is, to the proxy, a crash: its helpers vouch for
// their probes, the health score stays low, the replica is fed as down
// and the proxy never calls itself isolated.
func TestCutReplicaIsACrash(t *testing.T) {
	seed := startNode(t, testConfig(), replicaMeta("r0"), nil)
	cfg := testConfig()
	cfg.Join = []string{seed.GossipAddr()}
	for i := 1; i < 3; i++ {
		startNode(t, cfg, replicaMeta(fmt.Sprintf("r%d", i)), nil)
	}
	sw := gossipfault.New()
	victim, err := membership.New(cfg, replicaMeta("r3"), membership.Options{Logger: testLogger(t).Named("r3"), Transport: sw.Wrap})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); victim.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	px, disc, rt := proxyDiscovery(t, seed.GossipAddr(), nil)
	poll.Until(t, 15*time.Second, "the proxy routes to 4 replicas", func() bool { return rt.up() == 4 })

	sw.Cut()
	maxScore := 0
	poll.Until(t, 30*time.Second, "the proxy marks r3 dead and feeds it down", func() bool {
		maxScore = max(maxScore, px.HealthScore())
		if on, _ := disc.Isolated(); on {
			t.Fatalf("a crashed replica made the proxy isolated (health score %d)", px.HealthScore())
		}
		rt.mu.Lock()
		defer rt.mu.Unlock()
		_, down := rt.downed["r3"]
		return down && deadReplicas(px) == 1
	})
	t.Logf("highest health score of the proxy while one replica was cut off: %d", maxScore)
}
