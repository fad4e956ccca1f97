package proxy

import (
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

func gossipReplicas(reps ...*testReplica) []balancer.Replica {
	var out []balancer.Replica
	for _, r := range reps {
		out = append(out, balancer.Replica{Name: r.name, Addr: r.addr(), State: balancer.StateReady, Source: "gossip"})
	}
	return out
}

// The input adapters answer for the sets the proxy serves and refuse or
// ignore others.
func TestGossipAdapters(t *testing.T) {
	a, b := startReplica(t, "r0"), startReplica(t, "r1")
	p, _ := startProxy(t, func(cfg *Config) { cfg.ReplicaSets[0].Static, cfg.ReplicaSets[0].Replicas = nil, 2 })
	if p.SetReplicaSet("nope", gossipReplicas(a)) {
		t.Fatal("SetReplicaSet accepted an unknown set")
	}
	if !p.SetReplicaSet("orders", gossipReplicas(a, b)) {
		t.Fatal("SetReplicaSet refused the configured set")
	}
	if n := p.Router("orders").Table().Len(); n != 2 {
		t.Fatalf("%d ring members after the first gossip list, want 2 at once", n)
	}
	if inf, out, ok := p.ReplicaLoad("orders", "r1"); !ok || out || inf != 0 {
		t.Fatalf("ReplicaLoad(r1) = %d, %v, %v; want 0 in flight, in rotation", inf, out, ok)
	}
	if _, _, ok := p.ReplicaLoad("orders", "r9"); ok {
		t.Fatal("ReplicaLoad answered for an unknown replica")
	}
	if _, _, ok := p.ReplicaLoad("nope", "r1"); ok {
		t.Fatal("ReplicaLoad answered for an unknown set")
	}
	p.SetExcluded("orders", "r1", balancer.ReasonProbe, true)
	p.SetExcluded("nope", "r1", balancer.ReasonProbe, true) // ignored
	if _, out, _ := p.ReplicaLoad("orders", "r1"); !out {
		t.Fatal("SetExcluded did not take r1 out of rotation")
	}
	if fp := p.Fingerprints(); len(fp) != 1 || fp["orders"] != DefaultSetConfig().Hash.Fingerprint() {
		t.Fatalf("Fingerprints() = %v", fp)
	}
}

// A new incarnation of a replica at the same address (gossip's Boot
// changes) retires its pool at once: idle connections to the old process
// close, a connection in use closes when its request hands it back, and
// the Router neither rebuilds the ring nor replaces the backend.
func TestNewIncarnationRetiresPool(t *testing.T) {
	r0, r1 := startReplica(t, "r0"), startReplica(t, "r1")
	held, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unhold) // before the replica's shutdown, which waits for the held request
	r0.setHandler(func(ctx *fasthttp.RequestCtx) {
		if len(ctx.Request.Header.Peek("X-Hold")) > 0 {
			held <- struct{}{}
			<-release
		}
		ctx.SetBodyString("r0")
	})
	reg := newRegistry()
	p, addr := startProxyOpts(t, Options{Registerer: reg}, func(cfg *Config) { cfg.ReplicaSets[0].Static = nil }, r0, r1)
	gossip := gossipReplicas(r0, r1)
	gossip[0].Boot, gossip[1].Boot = 100, 200
	p.SetReplicaSet("orders", gossip)
	key := keyOwnedBy(t, p, "r0")
	tbl := p.Router("orders").Table()
	b := tbl.Backend(0)
	if b.Name() != "r0" {
		t.Fatalf("slot 0 is %s", b.Name())
	}
	// Two connections to r0: one idle in the pool, one in use.
	done := make(chan reply, 1)
	go func() { done <- newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key, "X-Hold", "1") }()
	within(t, held, 5*time.Second, "the held request at r0")
	if r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 200 {
		t.Fatalf("POST: %s", r)
	}
	if n := b.hc.IdleConnsCount(); n != 1 {
		t.Fatalf("%d idle connections to r0, want 1", n)
	}
	ringBuilt := func() float64 {
		v, _ := sample(t, reg, "keyway_table_rebuilds_total", map[string]string{"set": "orders", "ring": "true"})
		return v
	}
	rings := ringBuilt()

	gossip[0].Boot = 101 // r0 restarted at the same address
	p.SetReplicaSet("orders", gossip)
	if n := b.hc.IdleConnsCount(); n != 0 {
		t.Fatalf("%d idle connections to r0's earlier incarnation after the new one appeared, want 0", n)
	}
	unhold()
	if r := within(t, done, 5*time.Second, "the held request's answer"); r.status != 200 {
		t.Fatalf("held POST: %s", r)
	}
	if n := b.hc.ConnsCount(); n != 0 {
		t.Fatalf("%d connections to r0 after the held request handed its connection back, want 0 (closed)", n)
	}
	p.Router("orders").Flush()
	now := p.Router("orders").Table()
	if now.Backend(0) != b {
		t.Fatal("the new incarnation replaced r0's backend")
	}
	if now.Replica(0).Boot != 101 {
		t.Fatalf("the table lists r0 with boot %d, want 101", now.Replica(0).Boot)
	}
	if got := ringBuilt(); got != rings {
		t.Fatalf("the ring was rebuilt %v times for a new incarnation, want 0", got-rings)
	}
	if r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 200 || r.body != "r0" {
		t.Fatalf("POST to the new incarnation: %s", r)
	}
	// The same list again changes nothing.
	p.SetReplicaSet("orders", gossip)
	if n := b.hc.IdleConnsCount(); n != 1 {
		t.Fatalf("%d idle connections after an unchanged gossip list, want 1 (kept)", n)
	}
}
