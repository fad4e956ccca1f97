package proxy

import (
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

func gossipReplicas(reps ...*testReplica) []balancer.Replica {
	var out []balancer.Replica
	for _, r := range reps {
		out = append(out, balancer.Replica{Name: r.name, Addr: r.addr(), State: balancer.StateReady, Source: "gossip"})
	}
	return out
}

// A replica that refuses a connection leaves rotation at once: the
// request is retried on the next candidate, and no later request tries it
// again until gossip reports a change of it (here: a restart on a new port).
func TestRefusedConnectionEjectsUntilGossipChange(t *testing.T) {
	a, b, c := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")
	p, addr := startProxy(t, func(cfg *Config) { cfg.ReplicaSets[0].Static, cfg.ReplicaSets[0].Replicas = nil, 3 })
	if !p.SetReplicaSet("orders", gossipReplicas(a, b, c)) {
		t.Fatal("SetReplicaSet refused the configured set")
	}
	if p.SetReplicaSet("nope", nil) {
		t.Fatal("SetReplicaSet accepted an unknown set")
	}
	cl := newClient(addr)
	var keysOfB []string
	for i := 0; len(keysOfB) < 20; i++ {
		k := fmt.Sprint("key-", i)
		if ownerOf(p, "orders", k) == "r1" {
			keysOfB = append(keysOfB, k)
		}
	}
	b.stop(t)
	for i, k := range keysOfB {
		r := cl.do(t, "POST", "/ingest", "x", "X-Key", k)
		if r.status != 200 {
			t.Fatalf("request %d for a key of the stopped replica: %s", i, r)
		}
	}
	if got := dialErrors(p, "orders", "r1"); got != 1 {
		t.Fatalf("%d dial attempts to the stopped replica, want exactly 1 (the first refused request)", got)
	}
	if inf, out, ok := p.ReplicaLoad("orders", "r1"); !ok || !out || inf != 0 {
		t.Fatalf("ReplicaLoad(r1) = %d, %v, %v; want 0 in flight, out of rotation", inf, out, ok)
	}

	// Restarted on a new port under the same name: gossip reports it, the
	// hold is lifted, and its keys come back to it.
	b2 := startReplica(t, "r1")
	p.SetReplicaSet("orders", gossipReplicas(a, b2, c))
	for _, k := range keysOfB {
		if r := cl.do(t, "POST", "/ingest", "x", "X-Key", k); r.status != 200 || r.body != "r1" {
			t.Fatalf("key %s after the restart: %s, want r1", k, r)
		}
	}
	if fp := p.Fingerprints()["orders"]; fp != DefaultSetConfig().Hash.Fingerprint() {
		t.Fatalf("fingerprint %q", fp)
	}
}

// dialErrors returns the dial failures counted for a replica on the ring.
func dialErrors(p *Proxy, set, replica string) int {
	t := p.Router(set).Table()
	for _, m := range t.Members() {
		if m.Name == replica && m.Slot >= 0 {
			return int(testutil.ToFloat64(t.Backend(m.Slot).upErrs[errDial]))
		}
	}
	return -1
}

// An ejection and a readmission racing (a refused request while gossip
// reports a change) never leave the replica excluded with no hold to lift
// it: the flag and the Router's reason always agree afterwards.
func TestRefusedHoldAndReadmitDoNotRace(t *testing.T) {
	r0, r1 := startReplica(t, "r0"), startReplica(t, "r1")
	p, _ := startProxy(t, nil, r0, r1)
	rs := p.routes.Load().byName["orders"]
	for i := 0; i < 500; i++ {
		b := rs.router.Table().Backend(0)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); p.ejectRefused(rs, b) }()
		go func() { defer wg.Done(); p.readmitRefused(rs.st, b, 0) }()
		wg.Wait()
		var ex balancer.Reason
		for _, m := range rs.router.Table().Members() {
			if m.Name == b.name {
				ex = m.Excluded
			}
		}
		if held, out := b.refused.Load(), ex&balancer.ReasonRefused != 0; held != out {
			t.Fatalf("interleaving %d: hold %v but excluded %v", i, held, out)
		}
		p.readmitRefused(rs.st, b, 0)
	}
}
