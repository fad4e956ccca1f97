package proxy

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

func TestAllReplicasDownPolicy(t *testing.T) {
	for name, failOpen := range map[string]bool{"fail_closed": false, "fail_open": true} {
		t.Run(name, func(t *testing.T) {
			a, b := startReplica(t, "r0"), startReplica(t, "r1")
			p, addr := startProxyOpts(t, Options{FailOpen: failOpen}, nil, a, b)
			key := keyOwnedBy(t, p, "r1")
			for _, r := range []string{"r0", "r1"} {
				p.Router("orders").SetExcluded(r, balancer.ReasonProbe, true)
			}
			cl := newClient(addr)
			keyed := cl.do(t, "POST", "/ingest", "x", "X-Key", key)
			keyless := cl.do(t, "POST", "/ingest", "x")
			rs := p.routes.Load().byName["orders"]
			if got := testutil.ToFloat64(rs.allDown); got != 2 {
				t.Fatalf("keyway_all_replicas_unhealthy_total = %v, want 2", got)
			}
			if failOpen {
				if keyed.status != 200 || keyed.body != "r1" {
					t.Fatalf("fail open, keyed: %s, want 200 from the ring owner r1", keyed)
				}
				if keyless.status != 200 {
					t.Fatalf("fail open, keyless: %s", keyless)
				}
				return
			}
			for _, r := range []reply{keyed, keyless} {
				if r.status != 503 || r.header["Retry-After"] != "1" {
					t.Fatalf("fail closed: %s, want 503 with Retry-After", r)
				}
			}
			if a.count.Load()+b.count.Load() != 0 {
				t.Fatal("a replica received a request with every replica out of rotation (fail closed)")
			}
		})
	}
}

type tableRecorder struct {
	mu    sync.Mutex
	calls []int // in-rotation count per call
}

func (r *tableRecorder) TableChanged(set string, declared int, ms []balancer.Member, info balancer.RebuildInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range ms {
		if m.InRotation {
			n++
		}
	}
	if set != "orders" || declared != 2 || n != info.InRotation {
		panic("unexpected TableChanged arguments")
	}
	r.calls = append(r.calls, n)
}

func TestTableObserversSeeEveryTable(t *testing.T) {
	rec := &tableRecorder{}
	a, b := startReplica(t, "r0"), startReplica(t, "r1")
	p, _ := startProxyOpts(t, Options{Tables: []TableObserver{rec}}, nil, a, b)
	p.Router("orders").SetHealthy("r0", false)
	p.Router("orders").SetHealthy("r0", true)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// Hooks are wired at construction: every table after the empty initial
	// one is reported, the static replicas' included.
	if len(rec.calls) < 3 || rec.calls[len(rec.calls)-2] != 1 || rec.calls[len(rec.calls)-1] != 2 {
		t.Fatalf("in-rotation counts seen: %v, want ... 2, 1, 2", rec.calls)
	}
}

// Fail open bets against the health checks, never against a replica's own
// lifecycle: a draining owner gets nothing even then.
func TestFailOpenRespectsLifecycle(t *testing.T) {
	a, b := startReplica(t, "r0"), startReplica(t, "r1")
	p, addr := startProxyOpts(t, Options{FailOpen: true}, func(cfg *Config) { cfg.ReplicaSets[0].Static = nil }, a, b)
	gossip := gossipReplicas(a, b)
	p.SetReplicaSet("orders", gossip)
	key := keyOwnedBy(t, p, "r1")
	gossip[1].State = balancer.StateDraining // r1 drains...
	p.SetReplicaSet("orders", gossip)
	p.Router("orders").SetExcluded("r0", balancer.ReasonProbe, true) // ...and r0 fails its probes
	r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key)
	if r.status != 503 || b.count.Load() != 0 {
		t.Fatalf("fail open sent a draining owner's key: %s (r1 received %d)", r, b.count.Load())
	}
}
