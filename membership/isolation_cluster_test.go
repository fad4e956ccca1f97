package membership_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/internal/gossipfault"
	"keyway/internal/poll"
	"keyway/membership"
)

// routes is a Discovery target that remembers the replicas it was last
// fed and every replica it was ever fed as down.
type routes struct {
	mu     sync.Mutex
	last   []balancer.Replica
	downed map[string]bool
}

func (r *routes) SetReplicaSet(set string, rs []balancer.Replica) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = rs
	for _, x := range rs {
		if x.Down {
			r.downed[x.Name] = true
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

// A proxy's Discovery on a real gossip node, cut off from 4 replicas
// with internal/gossipfault: its node marks them all dead, yet none is
// ever fed as down; the isolation is reported and ends when the network
// heals.
func TestCutProxyKeepsReplicas(t *testing.T) {
	seed := startNode(t, testConfig(), replicaMeta("r0"), nil)
	cfg := testConfig()
	cfg.Join = []string{seed.GossipAddr()}
	for i := 1; i < 4; i++ {
		startNode(t, cfg, replicaMeta(fmt.Sprintf("r%d", i)), nil)
	}

	rt := &routes{downed: map[string]bool{}}
	disc := membership.NewDiscovery(rt, membership.DiscoveryOptions{Logger: testLogger(t).Named("discovery")})
	sw := gossipfault.New()
	pcfg := testConfig()
	pcfg.Join = []string{seed.GossipAddr()}
	pcfg.RejoinInterval = 2 * time.Second
	px, err := membership.New(pcfg, membership.Meta{Role: membership.RoleProxy}, membership.Options{
		Logger: testLogger(t).Named("proxy"), Sink: disc, Messages: disc.HandleMessage, Transport: sw.Wrap,
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

	deadReplicas := func() int {
		n := 0
		for _, m := range px.Members() {
			if m.Meta.Role == membership.RoleReplica && m.Status == membership.StatusDead {
				n++
			}
		}
		return n
	}
	poll.Until(t, 15*time.Second, "the proxy routes to 4 replicas", func() bool { return rt.up() == 4 })

	cut := time.Now()
	sw.Cut()
	poll.Until(t, 30*time.Second, "the proxy finds itself isolated", func() bool { on, _ := disc.Isolated(); return on })
	detected := time.Since(cut)
	poll.Until(t, 60*time.Second, "the proxy's gossip marks all 4 replicas dead", func() bool { return deadReplicas() == 4 })
	allDead := time.Since(cut)
	if on, _ := disc.Isolated(); !on || rt.up() != 4 {
		t.Fatalf("with every replica dead in gossip: isolated %v, %d replicas fed up", on, rt.up())
	}

	sw.Heal()
	healed := time.Now()
	poll.Until(t, 30*time.Second, "the isolation ends", func() bool { on, _ := disc.Isolated(); return !on })
	poll.Until(t, 10*time.Second, "all replicas alive again", func() bool { return deadReplicas() == 0 })
	t.Logf("cut: isolated after %s, all 4 replicas dead in gossip after %s; heal: isolation over after %s",
		detected.Round(time.Millisecond), allDead.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.downed) != 0 {
		t.Fatalf("replicas fed as down: %v", rt.downed)
	}
}
