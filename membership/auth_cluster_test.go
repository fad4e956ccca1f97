package membership_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/fleetauth"
	"keyway/internal/poll"
	"keyway/membership"
)

// Real members on loopback: a replica's name belongs to its set's key
// holders, and while it is alive to the first of them that claimed it.
func TestClaimsInACluster(t *testing.T) {
	creds := fleetauth.Generate([]string{"orders", "users"})
	start := func(name string, meta membership.Meta, c *fleetauth.Credentials, join ...string) (*membership.Node, context.CancelFunc) {
		t.Helper()
		cfg := testConfig()
		cfg.Join = join
		n, err := membership.New(cfg, meta, membership.Options{Logger: testLogger(t).Named(name), Credentials: c})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- n.Run(ctx) }()
		<-n.Started()
		stop := sync.OnceFunc(func() { cancel(); <-done })
		t.Cleanup(stop)
		return n, stop
	}
	claim := func(addr string) membership.Meta {
		return membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "orders-1", Addr: addr, State: balancer.StateReady}
	}
	proxyCreds, ordersCreds := creds.ForProxy(), creds.ForAgent("orders")
	// A host of the set users that claims orders-1 signs with users' key.
	usersCreds := fleetauth.Credentials{Proxy: creds.Public().Proxy, Agents: map[string]fleetauth.KeyList{"orders": creds.ForAgent("users").Agents["users"]}}
	p, _ := start("proxy", membership.Meta{Role: membership.RoleProxy, ID: "p1"}, &proxyCreds)
	genuine, stopGenuine := start("genuine", claim("127.0.0.1:9001"), &ordersCreds, p.GossipAddr())
	poll.Until(t, 10*time.Second, "the proxy to route orders-1 to the genuine replica", func() bool {
		rs := membership.ReplicasBySet(p.Members())["orders"]
		return len(rs) == 1 && rs[0].Addr == "127.0.0.1:9001"
	})
	// Claims first seen within a second of each other are both refused
	// (which came first is not known): the rogues come later.
	poll.Until(t, 10*time.Second, "the genuine claim to be held for more than a second", func() bool {
		for _, m := range p.Members() {
			if m.Node == genuine.Name() {
				return time.Since(m.Since) > 1100*time.Millisecond
			}
		}
		return false
	})
	unsigned, _ := start("unsigned", claim("127.0.0.1:6666"), nil, p.GossipAddr())
	otherSet, _ := start("other-set", claim("127.0.0.1:7777"), &usersCreds, p.GossipAddr())
	sameSet, _ := start("same-set", claim("127.0.0.1:8888"), &ordersCreds, p.GossipAddr())
	want := map[string]string{unsigned.Name(): membership.RejectUnsigned, otherSet.Name(): membership.RejectWrongKey, sameSet.Name(): membership.RejectClaimConflict}
	poll.Until(t, 10*time.Second, "the proxy to see the three claims, refused", func() bool {
		seen := 0
		for _, m := range p.Members() {
			if r, ok := want[m.Node]; ok && m.Status == membership.StatusAlive && m.Refused == r && m.Meta.Role == membership.RoleUnknown {
				seen++
			}
		}
		return seen == 3
	})
	if rs := membership.ReplicasBySet(p.Members())["orders"]; len(rs) != 1 || rs[0].Addr != "127.0.0.1:9001" {
		t.Fatalf("orders-1 routed to %+v while rogues claim it", rs)
	}
	// The genuine agent sees the same (it holds the public keys too).
	poll.Until(t, 10*time.Second, "the genuine agent to refuse them too", func() bool {
		n := 0
		for _, m := range genuine.Members() {
			if r, ok := want[m.Node]; ok && m.Refused == r {
				n++
			}
		}
		return n == 3
	})
	// When the genuine replica goes, a claim of its own set takes the
	// name (it is not alive any more); the others stay refused.
	stopGenuine()
	poll.Until(t, 10*time.Second, "the same-set claim to take orders-1 once it is not alive", func() bool {
		rs := membership.ReplicasBySet(p.Members())["orders"]
		return len(rs) == 1 && rs[0].Addr == "127.0.0.1:8888"
	})
	for _, m := range p.Members() {
		if m.Node == unsigned.Name() || m.Node == otherSet.Name() {
			if m.Meta.Role != membership.RoleUnknown {
				t.Fatalf("%s believed after the genuine replica left: %+v", m.Node, m)
			}
		}
	}
}
