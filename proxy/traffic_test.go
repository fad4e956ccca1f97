package proxy

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

func fl(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

func TestTrafficSamplerRates(t *testing.T) {
	c := newCounters()
	orders, other := c.addSet("orders"), c.addSet("other")
	clk := newFakeClock()
	s := newTrafficSampler(c, clk.Now)

	// Counts before the first reading: totals, but no rate yet.
	c.bind("orders", "orders-0").requests[2].Add(5)
	c.bind("other", "other-0").requests[2].Add(100)
	other.local[5].Add(7)
	tr := s.read().report("orders")
	if r := tr.Replicas["orders-0"]; r.RequestsTotal != 5 || r.RequestsPerSecond != nil || r.ErrorsPerSecond != nil {
		t.Fatalf("first reading: %+v", r)
	}
	if tr.RequestsTotal != 5 || tr.LocalAnswersTotal != 0 || tr.RequestsPerSecond != nil || tr.WindowSeconds != nil || !strings.Contains(tr.RateNote, "no earlier reading") {
		t.Fatalf("first reading, set: %+v", tr)
	}

	// Half a second later: too short a span for a rate, and not stored.
	clk.advance(500 * time.Millisecond)
	if tr := s.read().report("orders"); tr.RequestsPerSecond != nil || !strings.Contains(tr.RateNote, "0.5s old") {
		t.Fatalf("after 0.5s: %+v", tr)
	}

	// Traffic over the next 2 s: rates over 2.5 s (since the first stored
	// reading).
	c.bind("orders", "orders-0").requests[2].Add(20)
	o1 := c.bind("orders", "orders-1")
	o1.requests[2].Add(3)
	o1.requests[5].Add(2)
	o2 := c.bind("orders", "orders-2")
	o2.upErrs[errDial].Add(4) // reset stays 0: not listed
	orders.local[5].Add(5)    // keyway answered itself
	clk.advance(2 * time.Second)
	tr = s.read().report("orders")
	want := map[string]struct {
		reqs, r5xx, transport, errs uint64
		rps, eps                    float64
	}{
		"orders-0": {25, 0, 0, 0, 8, 0},
		"orders-1": {5, 2, 0, 2, 2, 0.8},
		"orders-2": {0, 0, 4, 4, 0, 1.6},
	}
	if len(tr.Replicas) != len(want) {
		t.Errorf("replicas %v, want those with counters only", tr.Replicas)
	}
	for name, w := range want {
		r := tr.Replicas[name]
		if r.RequestsTotal != w.reqs || r.Responses5xxTotal != w.r5xx || r.TransportErrorsTotal != w.transport || r.ErrorsTotal != w.errs ||
			fl(r.RequestsPerSecond) != w.rps || fl(r.ErrorsPerSecond) != w.eps {
			t.Errorf("%s after 2.5s: %+v (rates %v %v), want %+v", name, r, fl(r.RequestsPerSecond), fl(r.ErrorsPerSecond), w)
		}
	}
	if r := tr.Replicas["orders-2"]; len(r.TransportErrors) != 1 || r.TransportErrors["dial"] != 4 {
		t.Errorf("orders-2 errors by kind: %v, want only dial 4", r.TransportErrors)
	}
	if tr.RequestsTotal != 30 || tr.ErrorsTotal != 6 || tr.LocalAnswersTotal != 5 || fl(tr.RequestsPerSecond) != 10 ||
		fl(tr.ErrorsPerSecond) != 2.4 || fl(tr.LocalAnswersPerSecond) != 2 || fl(tr.WindowSeconds) != 2.5 || tr.RateNote != "" {
		t.Errorf("set after 2.5s: %+v", tr)
	}

	// A reader every 2 s with no traffic: once a stored reading is 10 s
	// old, the rates span 10 s and are measured zeros.
	var rd *trafficReading
	for range 5 {
		clk.advance(2 * time.Second)
		rd = s.read()
	}
	if tr := rd.report("orders"); fl(tr.WindowSeconds) != 10 || fl(tr.Replicas["orders-0"].RequestsPerSecond) != 0 || tr.Replicas["orders-0"].RequestsTotal != 25 {
		t.Errorf("quiet 10 s: %+v", tr)
	}
	// Traffic in the last 2 s of a 10 s window.
	c.bind("orders", "orders-0").requests[2].Add(30)
	clk.advance(2 * time.Second)
	if tr := s.read().report("orders"); fl(tr.Replicas["orders-0"].RequestsPerSecond) != 3 || fl(tr.WindowSeconds) != 10 {
		t.Errorf("30 requests in a 10 s window: %+v", tr)
	}

	// The replica left the ring and came back: its new count is all
	// increase.
	c.unbind("orders", "orders-0")
	c.bind("orders", "orders-0").requests[2].Add(4)
	clk.advance(2 * time.Second)
	if r := s.read().report("orders").Replicas["orders-0"]; r.RequestsTotal != 4 || fl(r.RequestsPerSecond) != 0.4 {
		t.Errorf("after a counter reset: %+v rate %v", r, fl(r.RequestsPerSecond))
	}

	// No read for over a minute: the stored readings are forgotten.
	clk.advance(rateMaxAge + time.Second)
	if tr := s.read().report("orders"); tr.RequestsPerSecond != nil || tr.RateNote == "" {
		t.Errorf("after a long pause: %+v", tr)
	}
	clk.advance(time.Second)
	if tr := s.read().report("orders"); fl(tr.WindowSeconds) != 1 || fl(tr.RequestsPerSecond) != 0 {
		t.Errorf("a second after that: %+v", tr)
	}
	if tr := s.read().report("other"); tr.RequestsTotal != 100 || tr.LocalAnswersTotal != 7 {
		t.Errorf("the other set: %+v", tr)
	}
}

func TestTrafficSamplerRun(t *testing.T) {
	c := newCounters()
	c.addSet("orders")
	clk := newFakeClock()
	s := newTrafficSampler(c, clk.Now)
	ctx, cancel := context.WithCancel(context.Background())
	ticks := make(chan time.Time)
	done := make(chan struct{})
	go func() { s.run(ctx, ticks); close(done) }()
	// The loop takes a tick only once it has stored the previous tick's
	// reading: each second tick (too close to store anything) waits for
	// the first.
	ticks <- clk.Now()
	ticks <- clk.Now()
	c.bind("orders", "orders-0").requests[2].Add(6)
	clk.advance(3 * time.Second)
	ticks <- clk.Now()
	ticks <- clk.Now()
	cancel()
	within(t, done, 5*time.Second, "the sampler loop to return")
	s.mu.Lock()
	n := len(s.stored)
	s.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d stored readings after ticks at 0 s and 3 s (twice), want 2", n)
	}
	clk.advance(time.Second)
	if tr := s.read().report("orders"); fl(tr.Replicas["orders-0"].RequestsPerSecond) != 1.5 || fl(tr.WindowSeconds) != 4 {
		t.Errorf("first read after the ticks: %+v", tr)
	}
}

func TestTrafficSamplerConcurrent(t *testing.T) {
	c := newCounters()
	c.addSet("orders")
	clk := newFakeClock()
	s := newTrafficSampler(c, clk.Now)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				c.bind("orders", fmt.Sprintf("orders-%d", g)).requests[2].Add(1)
				if i%10 == 0 {
					clk.advance(300 * time.Millisecond)
				}
				s.read().report("orders")
			}
		})
	}
	wg.Wait()
	if tr := s.read().report("orders"); tr.RequestsTotal != 400 {
		t.Fatalf("%d requests counted, want 400", tr.RequestsTotal)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 1; i < len(s.stored); i++ {
		if d := s.stored[i].at.Sub(s.stored[i-1].at); d < sampleEvery {
			t.Fatalf("stored readings %v apart, want at least %v", d, sampleEvery)
		}
	}
}

// Traffic counts real requests: answers by replica, failed exchanges by
// kind, keyway's own answers; Run's ticker stores readings, so the first
// Traffic call after a while has rates.
func TestTrafficFromRequests(t *testing.T) {
	clk := newFakeClock()
	r0, r1, dead := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "dead")
	r1.setHandler(func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(503) })
	p, addr := startProxyOpts(t, Options{clock: clk}, nil, r0, r1, dead)
	dead.stop(t)
	cl := newClient(addr)
	if _, ok := p.Traffic("nope"); ok {
		t.Fatal("Traffic answered for an unknown set")
	}
	// Run's sampler stores a reading at 0 s: it takes the second tick only
	// once it has stored the first tick's reading (the second, too close,
	// stores nothing).
	clk.ticks <- clk.Now()
	clk.ticks <- clk.Now()
	k0 := keyOwnedBy(t, p, "r0")
	for range 4 {
		cl.do(t, "POST", "/ingest", "x", "X-Key", k0)
	}
	cl.do(t, "POST", "/ingest", "x", "X-Key", keyOwnedBy(t, p, "r1"))
	cl.do(t, "POST", "/ingest", "x", "X-Key", keyWithCandidates(t, p, "dead", "r0")) // refused, then r0
	p.SetExcluded("orders", "r0", balancer.ReasonProbe, true)
	p.SetExcluded("orders", "r1", balancer.ReasonProbe, true)
	cl.do(t, "POST", "/ingest", "x", "X-Key", k0) // 503 from keyway: nothing in rotation
	clk.advance(4 * time.Second)

	tr, ok := p.Traffic("orders")
	if !ok {
		t.Fatal("Traffic: unknown set orders")
	}
	want := map[string]ReplicaTraffic{
		"r0":   {RequestsTotal: 5},
		"r1":   {RequestsTotal: 1, Responses5xxTotal: 1, ErrorsTotal: 1},
		"dead": {TransportErrorsTotal: 1, ErrorsTotal: 1, TransportErrors: map[string]uint64{"dial": 1}},
	}
	for name, w := range want {
		g := tr.Replicas[name]
		if g.RequestsTotal != w.RequestsTotal || g.Responses5xxTotal != w.Responses5xxTotal || g.TransportErrorsTotal != w.TransportErrorsTotal ||
			g.ErrorsTotal != w.ErrorsTotal || fmt.Sprint(g.TransportErrors) != fmt.Sprint(w.TransportErrors) {
			t.Errorf("%s: %+v, want %+v", name, g, w)
		}
	}
	// Rates over the 4 s since the reading Run stored at 0 s: every request
	// came after it.
	if fl(tr.WindowSeconds) != 4 || fl(tr.Replicas["r0"].RequestsPerSecond) != 1.25 || fl(tr.Replicas["dead"].ErrorsPerSecond) != 0.25 ||
		tr.RequestsTotal != 6 || tr.ErrorsTotal != 2 || fl(tr.RequestsPerSecond) != 1.5 || fl(tr.ErrorsPerSecond) != 0.5 ||
		tr.LocalAnswersTotal != 1 || fl(tr.LocalAnswersPerSecond) != 0.25 || tr.RateNote != "" {
		t.Errorf("set: %+v; window %v, r0 %v/s, dead errors %v/s, %v/s, errors %v/s, local %v/s", tr, fl(tr.WindowSeconds), fl(tr.Replicas["r0"].RequestsPerSecond),
			fl(tr.Replicas["dead"].ErrorsPerSecond), fl(tr.RequestsPerSecond), fl(tr.ErrorsPerSecond), fl(tr.LocalAnswersPerSecond))
	}
	// Latency over the window: measured for the replicas that answered,
	// nil for one that never did.
	for _, name := range []string{"r0", "r1"} {
		if r := tr.Replicas[name]; fl(r.MeanLatencySeconds) <= 0 || fl(r.P99LatencySeconds) <= 0 {
			t.Errorf("%s latency: mean %v p99 %v, want both measured", name, fl(r.MeanLatencySeconds), fl(r.P99LatencySeconds))
		}
	}
	if r := tr.Replicas["dead"]; r.MeanLatencySeconds != nil || r.P99LatencySeconds != nil {
		t.Errorf("dead latency: mean %v p99 %v, want none (it answered nothing)", fl(r.MeanLatencySeconds), fl(r.P99LatencySeconds))
	}
	s := p.traffic
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.stored) != 2 || !s.stored[0].at.Equal(clk.Now().Add(-4*time.Second)) {
		t.Errorf("stored readings %d, want the ticked one and Traffic's", len(s.stored))
	}
}

// A reload that renews a replica's pool keeps its counts: the new Backend
// counts on where the old one stopped, in Traffic and in the exposition.
func TestCountersSurvivePoolRenewal(t *testing.T) {
	reg := newRegistry()
	r0, r1 := startReplica(t, "r0"), startReplica(t, "r1")
	p, addr := startProxyOpts(t, Options{Registerer: reg}, nil, r0, r1)
	cl := newClient(addr)
	k0 := keyOwnedBy(t, p, "r0")
	for range 3 {
		cl.do(t, "POST", "/ingest", "x", "X-Key", k0)
	}
	backendOf := func() *Backend {
		tbl := p.Router("orders").Table()
		return tbl.Backend(tbl.Owner(balancer.HashString(k0)))
	}
	old := backendOf()
	cfg := testConfig(r0, r1)
	cfg.ReplicaSets[0].Timeouts.Connect = 2 * time.Second // new pools
	mustReload(t, p, cfg)
	if b := backendOf(); b == old || !old.released.Load() {
		t.Fatal("the reload did not renew r0's pool")
	}
	cl.do(t, "POST", "/ingest", "x", "X-Key", k0)
	if tr, _ := p.Traffic("orders"); tr.Replicas["r0"].RequestsTotal != 4 {
		t.Errorf("Traffic after the renewal: r0 %+v, want 4 requests", tr.Replicas["r0"])
	}
	if got, _ := sample(t, reg, "keyway_requests_total", map[string]string{"set": "orders", "replica": "r0", "code": "2xx"}); got != 4 {
		t.Errorf("keyway_requests_total r0 2xx = %v after the renewal, want 4", got)
	}
}

// A replica that leaves the ring takes its counters and series with it; if
// it comes back, it counts from 0.
func TestDepartedReplicaCounters(t *testing.T) {
	reg := newRegistry()
	reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
	p, addr := startProxyOpts(t, Options{Registerer: reg}, func(cfg *Config) { cfg.ReplicaSets[0].Replicas = 3 })
	p.SetReplicaSet("orders", gossipReplicas(reps...))
	cl := newClient(addr)
	k2 := keyOwnedBy(t, p, "r2")
	cl.do(t, "POST", "/ingest", "x", "X-Key", k2)
	if got, _ := sample(t, reg, "keyway_requests_total", map[string]string{"set": "orders", "replica": "r2", "code": "2xx"}); got != 1 {
		t.Fatalf("r2 2xx = %v, want 1", got)
	}

	p.SetReplicaSet("orders", gossipReplicas(reps[:2]...)) // r2 leaves for good
	p.Router("orders").Flush()
	for _, fam := range []string{"keyway_requests_total", "keyway_upstream_errors_total", "keyway_request_duration_seconds"} {
		if n := seriesWith(t, reg, fam, "replica", "r2"); n != 0 {
			t.Errorf("%s keeps %d series of the departed r2", fam, n)
		}
		if n := seriesWith(t, reg, fam, "replica", "r1"); n == 0 {
			t.Errorf("%s lost r1's series", fam)
		}
	}
	if tr, _ := p.Traffic("orders"); len(tr.Replicas) != 2 || tr.RequestsTotal != 0 {
		t.Errorf("Traffic after r2 left: %+v", tr)
	}

	p.SetReplicaSet("orders", gossipReplicas(reps...)) // back
	p.Router("orders").Flush()
	if got, ok := sample(t, reg, "keyway_requests_total", map[string]string{"set": "orders", "replica": "r2", "code": "2xx"}); !ok || got != 0 {
		t.Errorf("r2 2xx = %v (present %v) after coming back, want a new series at 0", got, ok)
	}
	if tr, _ := p.Traffic("orders"); tr.Replicas["r2"].RequestsTotal != 0 || len(tr.Replicas) != 3 {
		t.Errorf("Traffic after r2 came back: %+v", tr)
	}
}

// The latency over the window comes from the replica's histogram series:
// its mean from the sum and count, its 99th percentile from the buckets'
// increases, interpolated as histogram_quantile does; nil without an
// answer in the window; a histogram created again counts from 0.
func TestTrafficLatency(t *testing.T) {
	c := newCounters()
	c.addSet("orders")
	clk := newFakeClock()
	s := newTrafficSampler(c, clk.Now)
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "l", Buckets: latencyBuckets}, []string{"replica"})
	bind := func() prometheus.Observer {
		h := vec.WithLabelValues("orders-0")
		c.attachLatency(c.bind("orders", "orders-0"), h)
		return h
	}
	h := bind()
	h.Observe(5) // before the first reading: not in any window
	lat := func() (float64, float64) {
		r := s.read().report("orders").Replicas["orders-0"]
		return fl(r.MeanLatencySeconds), fl(r.P99LatencySeconds)
	}
	if m, p := lat(); m != -1 || p != -1 {
		t.Fatalf("first reading: mean %v p99 %v, want none (no rates yet)", m, p)
	}

	for range 99 {
		h.Observe(0.002)
	}
	h.Observe(0.2)
	clk.advance(2 * time.Second)
	// 100 answers: mean (99×2ms + 200ms)/100; the 99th falls in the
	// (1ms, 2.5ms] bucket, which holds 99: its upper bound.
	if m, p := lat(); m != 0.00398 || p != 0.0025 {
		t.Errorf("mean %v p99 %v, want 0.00398 and 0.0025", m, p)
	}

	clk.advance(10 * time.Second)
	for range 10 {
		h.Observe(0.03)
	}
	clk.advance(time.Second)
	// Only the last window's 10: all in (25ms, 50ms], the 99th at 9.9 of 10.
	if m, p := lat(); m != 0.03 || p != 0.04975 {
		t.Errorf("second window: mean %v p99 %v, want 0.03 and 0.04975", m, p)
	}

	clk.advance(11 * time.Second)
	if m, p := lat(); m != -1 || p != -1 {
		t.Errorf("a window without answers: mean %v p99 %v, want none", m, p)
	}

	// Slower than the last bucket: the highest finite bound, as
	// histogram_quantile answers.
	h.Observe(60)
	clk.advance(11 * time.Second)
	if m, p := lat(); m != 60 || p != 30 {
		t.Errorf("60s answer: mean %v p99 %v, want 60 and 30", m, p)
	}

	// The replica left the ring and came back: fresh series, counted from 0.
	c.unbind("orders", "orders-0")
	vec.Reset()
	h = bind()
	for range 4 {
		h.Observe(0.004)
	}
	clk.advance(11 * time.Second)
	if m, p := lat(); m != 0.004 || p != 0.004975 {
		t.Errorf("after coming back: mean %v p99 %v, want 0.004 and 0.004975", m, p)
	}
}

// The set's figures for the dashboard: answers by status class (the
// replicas' and keyway's own), the 5xx clients got apart from the failed
// attempts keyway retried, the set's p50 and p99 from the replicas'
// histograms added up, and a history point every historyEvery.
func TestTrafficSetFigures(t *testing.T) {
	c := newCounters()
	orders := c.addSet("orders")
	clk := newFakeClock()
	s := newTrafficSampler(c, clk.Now)
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "l", Buckets: latencyBuckets}, []string{"replica"})
	o0, o1 := c.bind("orders", "orders-0"), c.bind("orders", "orders-1")
	h0, h1 := vec.WithLabelValues("orders-0"), vec.WithLabelValues("orders-1")
	c.attachLatency(o0, h0)
	c.attachLatency(o1, h1)
	s.read()

	o0.requests[2].Add(18)
	o0.requests[4].Add(2)
	o1.requests[5].Add(3)
	o1.upErrs[errStale].Add(4) // retried: no client saw them
	orders.local[5].Add(1)     // keyway's own 503
	orders.local[4].Add(1)
	for range 10 {
		h0.Observe(0.002) // (1ms, 2.5ms]
	}
	for range 10 {
		h1.Observe(0.2) // (100ms, 250ms]
	}
	clk.advance(2 * time.Second)
	tr := s.read().report("orders")
	wantCodes := map[string]uint64{"2xx": 18, "4xx": 3, "5xx": 4}
	if !maps.Equal(tr.Codes, wantCodes) {
		t.Errorf("codes %v, want %v", tr.Codes, wantCodes)
	}
	if want := map[string]float64{"2xx": 9, "4xx": 1.5, "5xx": 2}; !maps.Equal(tr.CodesPerSecond, want) {
		t.Errorf("codes per second %v, want %v", tr.CodesPerSecond, want)
	}
	if tr.ClientErrorsTotal != 4 || fl(tr.ClientErrorsPerSecond) != 2 || tr.FailedAttemptsTotal != 4 || fl(tr.FailedAttemptsPerSecond) != 2 {
		t.Errorf("client errors %d (%v/s), failed attempts %d (%v/s); want 4 (2/s) and 4 (2/s)",
			tr.ClientErrorsTotal, fl(tr.ClientErrorsPerSecond), tr.FailedAttemptsTotal, fl(tr.FailedAttemptsPerSecond))
	}
	if r := tr.Replicas["orders-1"]; fl(r.Responses5xxPerSecond) != 1.5 || fl(r.FailedAttemptsPerSecond) != 2 || fl(r.ErrorsPerSecond) != 3.5 {
		t.Errorf("orders-1: 5xx %v/s, failed attempts %v/s, errors %v/s; want 1.5, 2, 3.5",
			fl(r.Responses5xxPerSecond), fl(r.FailedAttemptsPerSecond), fl(r.ErrorsPerSecond))
	}
	// 20 answers: the median at rank 10, the last of orders-0's ten in
	// (1ms, 2.5ms]; the 99th at 19.8, in orders-1's (100ms, 250ms]:
	// 100ms + 150ms × 9.8/10.
	if p50, p99 := fl(tr.P50LatencySeconds), fl(tr.P99LatencySeconds); p50 != 0.0025 || p99 != 0.247 {
		t.Errorf("set p50 %v p99 %v, want 0.0025 and 0.247", p50, p99)
	}

	// The history: a point once historyEvery has passed since the first
	// reading, then every historyEvery; at most historyLen.
	if h := s.historyOf("orders"); len(h) != 0 {
		t.Fatalf("history after 2 s: %+v", h)
	}
	o0.requests[2].Add(100)
	clk.advance(historyEvery)
	s.read()
	h := s.historyOf("orders")
	if len(h) != 1 {
		t.Fatalf("history after %v: %+v, want a point", historyEvery+2*time.Second, h)
	}
	// 125 answers (the classes' rates, each rounded to 0.001, added up)
	// and 4 client 5xx since the first reading, 12 s before.
	if p := h[0]; p.RequestsPerSecond != 10.416 || p.ClientErrorsPerSecond != 0.333 || fl(p.P99LatencySeconds) != 0.247 {
		t.Errorf("history point %+v (p99 %v)", p, fl(p.P99LatencySeconds))
	}
	for range historyLen + 5 {
		clk.advance(historyEvery)
		s.read()
	}
	if h := s.historyOf("orders"); len(h) != historyLen || h[len(h)-1].RequestsPerSecond != 0 || h[len(h)-1].P99LatencySeconds != nil {
		t.Errorf("history: %d points, last %+v; want %d, quiet", len(h), h[len(h)-1], historyLen)
	}
	c.forgetSet("orders")
	clk.advance(historyEvery)
	s.read()
	if h := s.historyOf("orders"); h != nil {
		t.Errorf("history of a removed set: %d points", len(h))
	}
}
