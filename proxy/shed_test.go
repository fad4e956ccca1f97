package proxy

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// TestInflightBodyBytes: the request body bytes buffered are bounded by
// server.max_inflight_body_bytes.
func TestInflightBodyBytes(t *testing.T) {
	a := startReplica(t, "a")
	arrived, release := hangingReplica(t, a)
	// Bodies of 700 KiB buffered whole (not streamed past a 64 KiB
	// buffer): two would take 1.4 MiB.
	_, addr := startProxy(t, func(c *Config) { c.Server.MaxInflightBodyBytes, c.Server.BodyBufferBytes = 1<<20, 1<<20 }, a)
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

// TestQueueWaitsForASlot: with max_queued_per_replica, a keyed request
// for a full replica waits for its slot rather than being shed, in order;
// one beyond the queue is shed at once; none moves to the other replica.
func TestQueueWaitsForASlot(t *testing.T) {
	busy, other := startReplica(t, "busy"), startReplica(t, "other")
	arrived, release := hangingReplica(t, busy)
	reg := newRegistry()
	p, addr := startProxyOpts(t, Options{Registerer: reg}, func(c *Config) {
		l := &c.ReplicaSets[0].Limits
		l.MaxInflightPerReplica, l.MaxQueuedPerReplica, l.MaxQueueWait = 1, 1, 10*time.Second
	}, busy, other)
	key := keyOwnedBy(t, p, "busy")
	first := sendAsync(addr, key)
	within(t, arrived, 5*time.Second, "the first request at busy")
	queued := sendAsync(addr, key)
	b := backendNamed(t, p, "busy")
	poll.Until(t, 5*time.Second, "the second request in busy's queue", func() bool { return b.queue.waiting.Load() == 1 })

	t0 := time.Now()
	r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key)
	if r.status != 503 || r.header["Retry-After"] != "1" {
		t.Fatalf("request beyond the queue: got %v, want 503 with Retry-After 1", r)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("the request beyond the queue took %s; it must be shed at once", d)
	}
	if m := r.errorJSON(t); m["reason"] != "overloaded" || m["replica"] != "busy" {
		t.Fatalf("error body %v: want reason overloaded, replica busy", m)
	}
	select {
	case r := <-queued:
		t.Fatalf("the queued request was answered before busy had a slot: %v", r)
	default:
	}
	close(release)
	for _, ch := range []chan reply{first, queued} {
		if r := within(t, ch, 5*time.Second, "a reply"); r.status != 200 || r.body != "busy" {
			t.Fatalf("got %v, want 200 from busy", r)
		}
	}
	if n := other.count.Load(); n != 0 {
		t.Fatalf("other saw %d requests: a full replica's keys moved", n)
	}
	if got := b.Inflight(); got != 0 {
		t.Errorf("busy's in-flight count after the answers = %d, want 0", got)
	}
	if got := shedCount(t, reg, "busy", "overloaded"); got != 1 {
		t.Errorf(`keyway_shed_total{replica="busy",reason="overloaded"} = %v, want 1`, got)
	}
}

// TestQueueTimeout: a request that waits max_queue_wait without a slot is
// shed with reason queue_timeout, counted for its replica.
func TestQueueTimeout(t *testing.T) {
	busy := startReplica(t, "busy")
	arrived, release := hangingReplica(t, busy)
	reg := newRegistry()
	p, addr := startProxyOpts(t, Options{Registerer: reg}, func(c *Config) {
		l := &c.ReplicaSets[0].Limits
		l.MaxInflightPerReplica, l.MaxQueuedPerReplica, l.MaxQueueWait = 1, 4, 50*time.Millisecond
		l.OverloadStatus = 429
	}, busy)
	held := sendAsync(addr, "k")
	t.Cleanup(func() { close(release); <-held })
	within(t, arrived, 5*time.Second, "the first request at busy")
	t0 := time.Now()
	r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k")
	waited := time.Since(t0)
	if r.status != 429 || r.header["Retry-After"] != "1" {
		t.Fatalf("got %v, want 429 with Retry-After 1", r)
	}
	if m := r.errorJSON(t); m["reason"] != "queue_timeout" || m["replica"] != "busy" {
		t.Fatalf("error body %v: want reason queue_timeout, replica busy", m)
	}
	if waited < 50*time.Millisecond {
		t.Errorf("shed after %s, before max_queue_wait (50ms)", waited)
	}
	if got := shedCount(t, reg, "busy", "queue_timeout"); got != 1 {
		t.Errorf(`keyway_shed_total{replica="busy",reason="queue_timeout"} = %v, want 1`, got)
	}
	if n := backendNamed(t, p, "busy").queue.waiting.Load(); n != 0 {
		t.Errorf("%d requests left in the queue after the timeout", n)
	}
}

// TestReplicaQueueOrderAndBound drives acquire and release directly: the
// waiters get the slot in their order, the bound holds under concurrent
// use, and no slot is lost.
func TestReplicaQueueOrderAndBound(t *testing.T) {
	far := time.Now().Add(time.Hour)
	t.Run("order", func(t *testing.T) {
		var b Backend
		if ok, _ := b.acquire(1, 8, time.Hour, far); !ok {
			t.Fatal("the first acquire failed on a free slot")
		}
		got := make(chan int, 4)
		for i := range 4 {
			go func() {
				if ok, queued := b.acquire(1, 8, time.Hour, far); ok && queued {
					got <- i
				} else {
					got <- -1
				}
			}()
			poll.Until(t, 5*time.Second, "waiter in the queue", func() bool { return b.queue.waiting.Load() == int32(i+1) })
		}
		for want := range 4 {
			b.release(1)
			if i := within(t, got, 5*time.Second, "a waiter's slot"); i != want {
				t.Fatalf("waiter %d got the slot, want %d (first come, first served)", i, want)
			}
		}
		b.release(1)
		if n := b.Inflight(); n != 0 {
			t.Fatalf("in flight after every release = %d, want 0", n)
		}
	})
	t.Run("full queue", func(t *testing.T) {
		var b Backend
		b.acquire(1, 1, time.Hour, far)
		done := make(chan bool, 1)
		go func() { ok, _ := b.acquire(1, 1, time.Hour, far); done <- ok }()
		poll.Until(t, 5*time.Second, "waiter in the queue", func() bool { return b.queue.waiting.Load() == 1 })
		if ok, queued := b.acquire(1, 1, time.Hour, far); ok || queued {
			t.Fatalf("acquire with a full queue = %v, %v; want refused without queueing", ok, queued)
		}
		b.release(1)
		if !within(t, done, 5*time.Second, "the waiter") {
			t.Fatal("the waiter was refused")
		}
		b.release(1)
	})
	t.Run("deadline", func(t *testing.T) {
		var b Backend
		b.acquire(1, 1, time.Hour, far)
		if ok, queued := b.acquire(1, 1, time.Hour, time.Now().Add(-time.Second)); ok || queued {
			t.Fatalf("acquire past the request's deadline = %v, %v; want refused at once", ok, queued)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		var b Backend
		const bound, workers, rounds = 3, 16, 300
		var over atomic.Int64
		var refused atomic.Int64
		done := make(chan struct{})
		for range workers {
			go func() {
				defer func() { done <- struct{}{} }()
				for j := range rounds {
					// Short waits time out now and then: the timed-out
					// path races with hand-overs.
					wait := time.Hour
					if j%7 == 0 {
						wait = time.Microsecond
					}
					ok, _ := b.acquire(bound, workers, wait, far)
					if !ok {
						refused.Add(1)
						continue
					}
					if n := b.inflight.Load(); n > bound {
						over.Store(n)
					}
					b.release(bound)
				}
			}()
		}
		for range workers {
			within(t, done, 30*time.Second, "a worker")
		}
		if n := over.Load(); n != 0 {
			t.Fatalf("%d in flight, over the bound of %d", n, bound)
		}
		if n, w := b.Inflight(), b.queue.waiting.Load(); n != 0 || w != 0 {
			t.Fatalf("after every release: %d in flight, %d waiting; want 0, 0 (a slot or waiter was lost)", n, w)
		}
	})
}

// backendNamed returns the backend of the named replica of set "orders".
func backendNamed(t *testing.T, p *Proxy, name string) *Backend {
	t.Helper()
	tb := p.Router("orders").Table()
	for i := range tb.Len() {
		if b := tb.Backend(i); b.Name() == name {
			return b
		}
	}
	t.Fatalf("no replica %q on the ring", name)
	return nil
}

// shedCount reads keyway_shed_total{set="orders",replica,reason} from p's
// registry.
func shedCount(t *testing.T, reg prometheus.Gatherer, replica, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "keyway_shed_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["set"] == "orders" && l["replica"] == replica && l["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no keyway_shed_total series for replica %q, reason %q", replica, reason)
	return 0
}
