package proxy

import (
	"testing"

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
