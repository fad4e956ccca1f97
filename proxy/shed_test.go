package proxy

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"keyway/internal/poll"
)

// hangingReplica makes r hold every request until release is closed,
// telling arrived of each.
func hangingReplica(t *testing.T, r *testReplica) (arrived chan struct{}, release chan struct{}) {
	arrived, release = make(chan struct{}, 16), make(chan struct{})
	r.setHandler(func(ctx *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		<-release
		ctx.SetBodyString(r.name)
	})
	return arrived, release
}

// sendAsync sends a keyed POST in the background; its reply comes on the
// channel.
func sendAsync(addr, key string) chan reply {
	ch := make(chan reply, 1)
	go func() {
		r, err := newClient(addr).try("POST", "/ingest", "x", "X-Key", key)
		if err != nil {
			r = reply{status: -1, body: err.Error()}
		}
		ch <- r
	}()
	return ch
}

// TestOverloadShedsKeyedRequests: a replica that stops answering holds at
// most max_inflight_per_replica requests; the keyed requests beyond get
// 503 with Retry-After at once and never move to the other replica; a
// keyless request goes elsewhere; the bound frees as answers come.
func TestOverloadShedsKeyedRequests(t *testing.T) {
	busy, other := startReplica(t, "busy"), startReplica(t, "other")
	arrived, release := hangingReplica(t, busy)
	p, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].Limits.MaxInflightPerReplica = 2 }, busy, other)
	key := keyOwnedBy(t, p, "busy")
	held := []chan reply{sendAsync(addr, key), sendAsync(addr, key)}
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
			for _, ch := range held {
				<-ch
			}
		}
	})
	within(t, arrived, 5*time.Second, "the first request at busy")
	within(t, arrived, 5*time.Second, "the second request at busy")

	for range 3 {
		t0 := time.Now()
		r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key)
		if r.status != 503 || r.header["Retry-After"] != "1" {
			t.Fatalf("keyed request beyond the bound: got %v, want 503 with Retry-After 1", r)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("the shed answer took %s; it must come at once", d)
		}
		m := r.errorJSON(t)
		if m["reason"] != "overloaded" || m["replica"] != "busy" || m["replica_set"] != "orders" {
			t.Fatalf("error body %v: want reason overloaded, replica busy, set orders", m)
		}
	}
	if n := other.count.Load(); n != 0 {
		t.Fatalf("other saw %d requests: a full replica's keys moved", n)
	}
	// Keyless requests have no affinity: they go to the replica with room.
	for range 2 {
		if r := newClient(addr).do(t, "POST", "/ingest", "x"); r.status != 200 || r.body != "other" {
			t.Fatalf("keyless request: got %v, want 200 from other", r)
		}
	}
	if got := testutil.ToFloat64(p.routes.Load().sets[0].local[lrOverloaded]); got != 3 {
		t.Errorf("local_responses_total{reason=overloaded} = %v, want 3", got)
	}
	if got := p.routes.Load().sets[0].counts.shed.Load(); got != 3 {
		t.Errorf("the set's shed count (keyway status) = %d, want 3", got)
	}

	// Answers free the bound: the key is served by busy again.
	busy.setHandler(func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("busy") })
	close(release)
	released = true
	for _, ch := range held {
		if r := within(t, ch, 5*time.Second, "a held reply"); r.status != 200 {
			t.Fatalf("held request: got %v", r)
		}
	}
	if r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 200 || r.body != "busy" {
		t.Fatalf("after the answers: got %v, want 200 from busy", r)
	}
}

// TestSetMaxInflight429: limits.max_inflight bounds the set on this proxy,
// and overload_status 429 answers the clients with 429.
func TestSetMaxInflight429(t *testing.T) {
	a := startReplica(t, "a")
	arrived, release := hangingReplica(t, a)
	p, addr := startProxy(t, func(c *Config) {
		c.ReplicaSets[0].Limits.MaxInflight = 1
		c.ReplicaSets[0].Limits.OverloadStatus = 429
	}, a)
	held := sendAsync(addr, "k")
	t.Cleanup(func() { close(release); <-held })
	within(t, arrived, 5*time.Second, "the first request at a")
	r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k")
	if r.status != 429 || r.header["Retry-After"] != "1" {
		t.Fatalf("got %v, want 429 with Retry-After 1", r)
	}
	if m := r.errorJSON(t); m["reason"] != "set_overloaded" || m["replica"] != "" {
		t.Fatalf("error body %v: want reason set_overloaded and no replica", m)
	}
	if got := testutil.ToFloat64(p.routes.Load().sets[0].local[lrSetOverloaded]); got != 1 {
		t.Errorf("local_responses_total{reason=set_overloaded} = %v, want 1", got)
	}
}

type failureObserver struct{ n atomic.Int64 }

func (o *failureObserver) Observe(set, replica string, status int, err error, d time.Duration) {
	if status >= 500 || err != nil {
		o.n.Add(1)
	}
}

// TestPressureHeaderShedsReplica: a replica that answers "saturated" has
// its keyed requests shed for the answer's Retry-After, not moved to the
// other replica, and the answer is no evidence against it; then its keys
// come back to it.
func TestPressureHeaderShedsReplica(t *testing.T) {
	busy, other := startReplica(t, "busy"), startReplica(t, "other")
	var saturated atomic.Bool
	saturated.Store(true)
	busy.setHandler(func(ctx *fasthttp.RequestCtx) {
		if saturated.Swap(false) {
			ctx.Response.Header.Set("X-Keyway-Pressure", "saturated")
			ctx.Response.Header.Set("Retry-After", "2")
			ctx.SetStatusCode(503)
			return
		}
		ctx.SetBodyString("busy")
	})
	obs := &failureObserver{}
	p, addr := startProxyOpts(t, Options{Observer: obs}, nil, busy, other)
	key := keyOwnedBy(t, p, "busy")

	// The replica's own answer reaches the client as it is.
	if r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 503 || r.header["X-Keyway-Pressure"] != "saturated" {
		t.Fatalf("the saturated answer: got %v", r)
	}
	r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key)
	if r.status != 503 || (r.header["Retry-After"] != "1" && r.header["Retry-After"] != "2") {
		t.Fatalf("during the pressure hold: got %v, want 503 with Retry-After 1 or 2", r)
	}
	if m := r.errorJSON(t); m["reason"] != "replica_saturated" || m["replica"] != "busy" {
		t.Fatalf("error body %v: want reason replica_saturated, replica busy", m)
	}
	if n := busy.count.Load(); n != 1 {
		t.Fatalf("busy saw %d requests during its hold, want 1", n)
	}
	if n := other.count.Load(); n != 0 {
		t.Fatalf("other saw %d requests: a saturated replica's keys moved", n)
	}
	if n := obs.n.Load(); n != 0 {
		t.Fatalf("the observer saw %d failures: pressure is no evidence against the replica", n)
	}
	// After the hold the key is served by busy again.
	poll.Until(t, 10*time.Second, "the key back at busy", func() bool {
		r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key)
		return r.status == 200 && r.body == "busy"
	})
	if n := other.count.Load(); n != 0 {
		t.Fatalf("other saw %d requests", n)
	}
}

// TestMemoryGuard: with the heap (an injected reading) above
// server.max_heap_bytes new requests get 503 (reason memory); below it
// again they are served.
func TestMemoryGuard(t *testing.T) {
	a := startReplica(t, "a")
	var heap atomic.Uint64
	heap.Store(1 << 30)
	p, addr := startProxyOpts(t, Options{heap: heap.Load, Registerer: newRegistry()}, func(c *Config) { c.Server.MaxHeapBytes = 64 << 20 }, a)
	poll.Until(t, 10*time.Second, "a request shed by the memory guard", func() bool {
		r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k")
		if r.status == 503 {
			if m := r.errorJSON(t); m["reason"] != "memory" || r.header["Retry-After"] != "1" {
				t.Fatalf("shed answer %v: want reason memory, Retry-After 1", r)
			}
			return true
		}
		return false
	})
	poll.Until(t, 10*time.Second, "keyway_memory_guard_shedding 1", func() bool {
		return testutil.ToFloat64(p.metrics.memShedding) == 1
	})
	heap.Store(1 << 20)
	poll.Until(t, 10*time.Second, "a request served again", func() bool {
		return newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k").status == 200
	})
	if got := testutil.ToFloat64(p.routes.Load().sets[0].local[lrMemory]); got < 1 {
		t.Errorf("local_responses_total{reason=memory} = %v, want at least 1", got)
	}
}

// TestInflightBodyBytes: request bodies held by requests in flight are
// bounded by server.max_inflight_body_bytes.
func TestInflightBodyBytes(t *testing.T) {
	a := startReplica(t, "a")
	arrived, release := hangingReplica(t, a)
	_, addr := startProxy(t, func(c *Config) { c.Server.MaxInflightBodyBytes = 1 << 20 }, a)
	body := strings.Repeat("x", 700<<10)
	held := make(chan reply, 1)
	go func() {
		r, err := newClient(addr).try("POST", "/ingest", body, "X-Key", "k")
		if err != nil {
			r = reply{status: -1, body: err.Error()}
		}
		held <- r
	}()
	t.Cleanup(func() { close(release); <-held })
	within(t, arrived, 5*time.Second, "the first request at a")
	r := newClient(addr).do(t, "POST", "/ingest", body, "X-Key", "k")
	if r.status != 503 {
		t.Fatalf("got %v, want 503", r)
	}
	if m := r.errorJSON(t); m["reason"] != "memory" {
		t.Fatalf("error body %v: want reason memory", m)
	}
	// A small body still fits.
	a.setHandler(func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("a") })
	if r := newClient(addr).do(t, "POST", "/ingest", "small", "X-Key", "k"); r.status != 200 {
		t.Fatalf("small body: got %v, want 200", r)
	}
}
