package membership_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/internal/poll"
	"keyway/membership"
)

// setsTarget is a Discovery target serving the set "orders" that keeps
// what it is fed.
type setsTarget struct {
	mu   sync.Mutex
	reps []balancer.Replica
}

func (s *setsTarget) SetReplicaSet(set string, rs []balancer.Replica) bool {
	if set != "orders" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reps = rs
	return true
}
func (s *setsTarget) ReplicaLoad(set, replica string) (int64, bool, bool) { return 0, true, true }
func (s *setsTarget) Fingerprints() map[string]string                     { return map[string]string{"orders": "fp"} }

func (s *setsTarget) state(replica string) balancer.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.reps {
		if r.Name == replica {
			return r.State
		}
	}
	return balancer.StateUnknown
}

// gossipProxy is a proxy's gossip side: a Node feeding a Discovery, which
// handles the node's messages. Every message is also recorded.
type gossipProxy struct {
	node   *membership.Node
	disc   *membership.Discovery
	target *setsTarget
	mu     sync.Mutex
	msgs   []membership.AdminDrain
	joined map[string]bool // gossip nodes seen joining
}

func startGossipProxy(t *testing.T, name string, join ...string) *gossipProxy {
	t.Helper()
	p := &gossipProxy{target: &setsTarget{}, joined: map[string]bool{}}
	p.disc = membership.NewDiscovery(p.target, membership.DiscoveryOptions{
		Logger: testLogger(t).Named(name + ".discovery"),
		OnEvent: func(e membership.MemberEvent) {
			if e.Kind == "member_join" {
				p.mu.Lock()
				p.joined[e.Member.Node] = true
				p.mu.Unlock()
			}
		},
	})
	cfg := testConfig()
	cfg.Join = join
	n, err := membership.New(cfg, membership.Meta{Role: membership.RoleProxy, Addr: name}, membership.Options{
		Logger: testLogger(t).Named(name),
		Sink:   p.disc,
	})
	if err != nil {
		t.Fatal(err)
	}
	p.node = n
	p.disc.Attach(n)
	n.Handle(membership.AdminDrainKind, membership.RoleProxy, func(m membership.Message) {
		if c, err := membership.DecodeAdminDrain(m.Body); err == nil {
			p.mu.Lock()
			p.msgs = append(p.msgs, c)
			p.mu.Unlock()
		}
		p.disc.HandleMessage(m.From, m.Body)
	})
	runNode(t, n)
	return p
}

func (p *gossipProxy) sawJoin(node string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.joined[node]
}

func (p *gossipProxy) received() []membership.AdminDrain {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]membership.AdminDrain(nil), p.msgs...)
}

// runNode runs n until the test ends.
func runNode(t *testing.T, n *membership.Node) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-n.Started():
	case err := <-done:
		t.Fatalf("node %s did not start: %v", n.Name(), err)
	}
	t.Cleanup(func() { cancel(); <-done })
}

// startDrainableReplica is a gossip member standing in for a replica's
// agent: an AdminDrain for its replica and boot makes it advertise
// draining and the hold, an undrain ready again. Commands are applied by
// a goroutine of the test, not by the node's message worker.
func startDrainableReplica(t *testing.T, name string, join ...string) *membership.Node {
	t.Helper()
	cmds := make(chan membership.AdminDrain, 16)
	cfg := testConfig()
	cfg.Join = join
	n, err := membership.New(cfg, replicaMeta(name), membership.Options{
		Logger: testLogger(t).Named(name),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.Handle(membership.AdminDrainKind, membership.RoleProxy, func(m membership.Message) {
		if c, err := membership.DecodeAdminDrain(m.Body); err == nil {
			select {
			case cmds <- c:
			default:
				t.Errorf("%s: command dropped", name)
			}
		}
	})
	stop := make(chan struct{})
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		for {
			select {
			case <-stop:
				return
			case c := <-cmds:
				if c.Replica != name || c.Boot != n.Meta().Boot {
					t.Errorf("%s got a command for %s boot %d, its boot is %d", name, c.Replica, c.Boot, n.Meta().Boot)
					continue
				}
				st := balancer.StateReady
				if c.Drain {
					st = balancer.StateDraining
				}
				if err := n.UpdateMeta(func(m *membership.Meta) { m.State, m.Held = st, c.Drain }, time.Second); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
		}
	}()
	runNode(t, n)
	t.Cleanup(func() { close(stop); <-applied }) // runs before the node stops
	return n
}

// Discovery.Drain over real gossip: the drain reaches the replica's agent,
// whose hold every proxy then sees; the undrain reaches it too and is told
// to the other proxy.
func TestDrainOverGossip(t *testing.T) {
	p1 := startGossipProxy(t, "proxy-1")
	r := startDrainableReplica(t, "r0", p1.node.GossipAddr())
	p2 := startGossipProxy(t, "proxy-2", p1.node.GossipAddr())
	poll.Until(t, 10*time.Second, "proxy-1 to route r0 and see proxy-2", func() bool {
		return p1.target.state("r0") == balancer.StateReady && p1.sawJoin(p2.node.Name())
	})
	poll.Until(t, 10*time.Second, "proxy-2 to route r0", func() bool { return p2.target.state("r0") == balancer.StateReady })

	if err := p1.disc.Drain("orders", "r9", true); !errors.Is(err, membership.ErrNotAdvertised) {
		t.Fatalf("Drain of a replica nobody advertises = %v, want ErrNotAdvertised", err)
	}
	if err := p1.disc.Drain("orders", "r0", true); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*gossipProxy{p1, p2} {
		poll.Until(t, 10*time.Second, "both proxies to see r0 held and draining", func() bool {
			return p.disc.OperatorHeld("orders", "r0") && p.target.state("r0") == balancer.StateDraining
		})
	}
	if got := p2.received(); len(got) != 0 {
		t.Fatalf("proxy-2 was told %+v about a drain; only undrains are told", got)
	}

	if err := p1.disc.Drain("orders", "r0", false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*gossipProxy{p1, p2} {
		poll.Until(t, 10*time.Second, "both proxies to see r0 ready, not held", func() bool {
			return !p.disc.OperatorHeld("orders", "r0") && p.target.state("r0") == balancer.StateReady
		})
	}
	poll.Until(t, 10*time.Second, "proxy-2 to be told the undrain", func() bool { return len(p2.received()) > 0 })
	want := membership.AdminDrain{Kind: "admin_drain", Set: "orders", Replica: "r0", Boot: r.Meta().Boot, Drain: false, By: p1.node.Name()}
	if got := p2.received(); len(got) != 1 || got[0] != want {
		t.Fatalf("proxy-2 was told %+v, want %+v", got, want)
	}
	if got := p1.received(); len(got) != 0 {
		t.Fatalf("proxy-1 told itself %+v", got)
	}
}
