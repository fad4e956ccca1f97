package proxy

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"keyway/balancer"
)

// dialErrors returns the dial failures counted for a replica on the ring.
func dialErrors(p *Proxy, set, replica string) int {
	t := p.Router(set).Table()
	for _, m := range t.Members() {
		if m.Name == replica && m.Slot >= 0 {
			return int(t.Backend(m.Slot).ctr.upErrs[errDial].Load())
		}
	}
	return -1
}

// refusedHeld reports whether a refused-connection hold keeps a replica
// out of rotation now.
func refusedHeld(p *Proxy, set, replica string) bool {
	for _, m := range p.Router(set).Table().Members() {
		if m.Name == replica {
			return m.Excluded&balancer.ReasonRefused != 0
		}
	}
	return false
}

// keysOf returns n keys the named replica owns now.
func keysOf(t *testing.T, p *Proxy, replica string, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n && i < 100000; i++ {
		if k := fmt.Sprint("key-", i); ownerOf(p, "orders", k) == replica {
			out = append(out, k)
		}
	}
	if len(out) < n {
		t.Fatalf("only %d keys of %s", len(out), replica)
	}
	return out
}

// A replica that refuses a connection leaves rotation at once: the
// request is retried on the next candidate, and no later request tries it
// again until gossip reports a change of it (here: a restart on a new
// port), however long that takes within the hold.
func TestRefusedConnectionEjectsUntilGossipChange(t *testing.T) {
	clk := newFakeClock()
	a, b, c := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")
	p, addr := startProxyOpts(t, Options{clock: clk}, func(cfg *Config) { cfg.ReplicaSets[0].Static, cfg.ReplicaSets[0].Replicas = nil, 3 })
	p.SetReplicaSet("orders", gossipReplicas(a, b, c))
	cl := newClient(addr)
	keysOfB := keysOf(t, p, "r1", 20)
	b.stop(t)
	for i, k := range keysOfB {
		r := cl.do(t, "POST", "/ingest", "x", "X-Key", k)
		if r.status != 200 {
			t.Fatalf("request %d for a key of the stopped replica: %s", i, r)
		}
		clk.advance(RefusedHold / 40) // half the hold over the 20 requests
	}
	if got := dialErrors(p, "orders", "r1"); got != 1 {
		t.Fatalf("%d dial attempts to the stopped replica, want exactly 1 (the first refused request)", got)
	}
	if inf, out, ok := p.ReplicaLoad("orders", "r1"); !ok || !out || inf != 0 {
		t.Fatalf("ReplicaLoad(r1) = %d, %v, %v; want 0 in flight, out of rotation", inf, out, ok)
	}
	if n := clk.pending(); n != 1 {
		t.Fatalf("%d hold timers pending, want 1 (one per hold, not per request)", n)
	}

	// Restarted on a new port under the same name: gossip reports it, the
	// hold is lifted, and its keys come back to it.
	b2 := startReplica(t, "r1")
	p.SetReplicaSet("orders", gossipReplicas(a, b2, c))
	if refusedHeld(p, "orders", "r1") {
		t.Fatal("the hold outlived gossip's report of a new address")
	}
	for _, k := range keysOfB {
		if r := cl.do(t, "POST", "/ingest", "x", "X-Key", k); r.status != 200 || r.body != "r1" {
			t.Fatalf("key %s after the restart: %s, want r1", k, r)
		}
	}
	// The lifted hold's timer changes nothing when it fires.
	clk.advance(RefusedHold)
	if refusedHeld(p, "orders", "r1") || ownerOf(p, "orders", keysOfB[0]) != "r1" {
		t.Fatal("the old hold's timer took r1 out again")
	}
}

// Without news from gossip the hold ends after RefusedHold: the replica is
// tried again, and a second refusal holds it out again, retried on the next
// candidate as the first was.
func TestRefusedHoldExpires(t *testing.T) {
	clk := newFakeClock()
	a, b := startReplica(t, "r0"), startReplica(t, "r1")
	p, addr := startProxyOpts(t, Options{clock: clk}, nil, a, b)
	cl := newClient(addr)
	key := keysOf(t, p, "r1", 1)[0]
	b.stop(t)
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 200 || r.body != "r0" {
		t.Fatalf("first request of a stopped owner: %s, want r0's answer", r)
	}
	if !refusedHeld(p, "orders", "r1") {
		t.Fatal("a refused connection did not hold r1 out")
	}
	clk.advance(RefusedHold - time.Nanosecond)
	if !refusedHeld(p, "orders", "r1") {
		t.Fatal("the hold ended before RefusedHold")
	}
	clk.advance(time.Nanosecond)
	if refusedHeld(p, "orders", "r1") || ownerOf(p, "orders", key) != "r1" {
		t.Fatal("the hold did not end after RefusedHold")
	}
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 200 || r.body != "r0" {
		t.Fatalf("request after the hold: %s, want r0's answer", r)
	}
	if got := dialErrors(p, "orders", "r1"); got != 2 || !refusedHeld(p, "orders", "r1") {
		t.Fatalf("after the hold: %d dial errors, held %v; want 2 and held again", got, refusedHeld(p, "orders", "r1"))
	}
}

// A hold lifted by gossip and taken again is ended by its own timer, not
// by the earlier hold's.
func TestRefusedHoldTimerEndsOnlyItsHold(t *testing.T) {
	clk := newFakeClock()
	p, _ := startProxyOpts(t, Options{clock: clk}, nil, startReplica(t, "r0"), startReplica(t, "r1"))
	rs := p.routes.Load().byName["orders"]
	b := rs.router.Table().Backend(1)
	p.ejectRefused(rs, b) // hold 1, due at 5s
	clk.advance(2 * time.Second)
	p.readmitRefused(rs.st, b, 0) // gossip reported a change
	if refusedHeld(p, "orders", b.name) {
		t.Fatal("readmission left the hold")
	}
	p.ejectRefused(rs, b) // hold 2, due at 7s
	clk.advance(3 * time.Second)
	if !refusedHeld(p, "orders", b.name) {
		t.Fatal("hold 1's timer ended hold 2")
	}
	clk.advance(2 * time.Second)
	if refusedHeld(p, "orders", b.name) {
		t.Fatal("hold 2's timer did not end it")
	}
	if n := clk.pending(); n != 0 {
		t.Fatalf("%d timers left", n)
	}
}

// An ejection and a readmission racing (a refused request while gossip
// reports a change) never leave the replica excluded with no hold to lift
// it: the flag and the Router's reason always agree afterwards.
func TestRefusedHoldAndReadmitDoNotRace(t *testing.T) {
	p, _ := startProxyOpts(t, Options{clock: newFakeClock()}, nil, startReplica(t, "r0"), startReplica(t, "r1"))
	rs := p.routes.Load().byName["orders"]
	for i := 0; i < 500; i++ {
		b := rs.router.Table().Backend(0)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); p.ejectRefused(rs, b) }()
		go func() { defer wg.Done(); p.readmitRefused(rs.st, b, 0) }()
		wg.Wait()
		if held, out := b.refused.Load(), refusedHeld(p, "orders", b.name); held != out {
			t.Fatalf("interleaving %d: hold %v but excluded %v", i, held, out)
		}
		p.readmitRefused(rs.st, b, 0)
	}
}
