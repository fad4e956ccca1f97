package health

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"keyway/balancer"
)

// activeConfig probes every 100ms with a 90ms timeout (generous for a
// loopback answer on a loaded machine), rise 2, fall 3; passive checks off.
func activeConfig() Config {
	cfg := DefaultConfig()
	cfg.Active.Enabled = true
	cfg.Active.Interval = 100 * time.Millisecond
	cfg.Active.Timeout = 90 * time.Millisecond
	cfg.Passive.Enabled = false
	return cfg
}

// liveChecker runs a Checker on the real clock against real servers. Its
// events arrive on a channel together with the probe counters of the
// replica at that moment (read on Run's goroutine, right after the result
// that caused the event was counted).
type liveChecker struct {
	c      *Checker
	sink   *recSink
	events chan liveEvent
}

type liveEvent struct {
	Event
	counts map[string]float64 // result → keyway_health_probes_total
	health ReplicaHealth      // Snapshot at the event
}

// failures is the number of failed probes (any result but pass).
func (e liveEvent) failures() float64 {
	return e.counts["bad_status"] + e.counts["timeout"] + e.counts["error"]
}

func startChecker(t *testing.T, cfg Config, probeTLS ...func(set, replica, addr string) *tls.Config) *liveChecker {
	t.Helper()
	lc := &liveChecker{sink: newRecSink(t), events: make(chan liveEvent, 100)}
	var pt func(set, replica, addr string) *tls.Config
	if len(probeTLS) > 0 {
		pt = probeTLS[0]
	}
	c, err := NewChecker(cfg, lc.sink, Options{
		ProbeTLS:   pt,
		Logger:     zaptest.NewLogger(t),
		Registerer: prometheus.NewPedanticRegistry(),
		OnEvent: func(e Event) {
			le := liveEvent{Event: e, counts: map[string]float64{}}
			for _, r := range resultNames {
				le.counts[r] = testutil.ToFloat64(lc.c.metrics.probes.WithLabelValues(e.Set, e.Replica, r))
			}
			le.health = lc.c.Snapshot(e.Set)[0]
			lc.events <- le
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	lc.c = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of its context's end")
		}
	})
	return lc
}

// next waits (at most 5s) for the next event.
func (lc *liveChecker) next(t *testing.T) liveEvent {
	t.Helper()
	select {
	case e := <-lc.events:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no health event within 5s")
		return liveEvent{}
	}
}

// waitCount waits (at most 5s) until the replica has had at least n
// probes with the given result.
func (lc *liveChecker) waitCount(t *testing.T, set, replica, result string, n float64) {
	t.Helper()
	ctr := lc.c.metrics.probes.WithLabelValues(set, replica, result)
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for testutil.ToFloat64(ctr) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s: %v %s probes after 5s, want %v", set, replica, testutil.ToFloat64(ctr), result, n)
		}
		<-tick.C
	}
}

// A replica answering 500 goes down after exactly Fall probes, and up
// again after exactly Rise probes once it answers 200.
func TestActiveFallAndRise(t *testing.T) {
	t.Parallel()
	var status atomic.Int32
	status.Store(500)
	var paths sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.URL.Path+" "+r.Header.Get("User-Agent"), true)
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	lc := startChecker(t, activeConfig())
	lc.c.SetTargets("s", []Target{{Replica: "a", Addr: srv.Listener.Addr().String()}})

	// Every probe fails (bad status, or a timeout if the machine is slow):
	// down at exactly the third.
	e := lc.next(t)
	if e.Kind != EventProbeDown || e.failures() != 3 || e.counts["pass"] != 0 || e.health.ProbeFailures != 3 || e.counts["bad_status"] < 1 {
		t.Fatalf("first event %+v, want probe_down after exactly 3 failures", e)
	}
	callsEqual(t, lc.sink.take(), call{"s", "a", balancer.ReasonProbe, true})
	if h := lc.c.Snapshot("s")[0]; h.Probe != "down" || h.ProbeFailures < 3 || h.Excluded != "probe" {
		t.Fatalf("snapshot %+v", h)
	}
	status.Store(200)
	e = lc.next(t)
	if e.Kind != EventProbeUp || e.Reason != "status 200" || e.health.ProbePasses != 2 || e.counts["pass"] < 2 {
		t.Fatalf("second event %+v, want probe_up after 2 passes in a row", e)
	}
	callsEqual(t, lc.sink.take(), call{"s", "a", balancer.ReasonProbe, false})
	if _, ok := paths.Load("/healthz keyway-health"); !ok {
		t.Fatal("the probes did not GET /healthz as keyway-health")
	}
}

// A server that accepts TCP connections but never answers is marked down
// by probe timeouts.
func TestActiveTimeout(t *testing.T) {
	t.Parallel()
	addr, accepted := hangServerCounting(t)
	lc := startChecker(t, activeConfig())
	lc.c.SetTargets("s", []Target{{Replica: "a", Addr: addr}})
	e := lc.next(t)
	if e.Kind != EventProbeDown || e.Reason != "timeout" || e.counts["timeout"] != 3 || e.failures() != 3 {
		t.Fatalf("event %+v, want probe_down after 3 timeouts", e)
	}
	if n := accepted(); n < 3 {
		t.Fatalf("%d connections accepted, want one per probe", n)
	}
}

// A refused connection is an error result.
func TestActiveRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	lc := startChecker(t, activeConfig())
	lc.c.SetTargets("s", []Target{{Replica: "a", Addr: addr}})
	e := lc.next(t)
	if e.Kind != EventProbeDown || e.counts["error"] != 3 || e.failures() != 3 {
		t.Fatalf("event %+v, want probe_down after 3 errors", e)
	}
}

// expect_status decides which answers pass; a redirect is an answer (not
// followed), judged by expect_status too.
func TestActiveExpectStatus(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		status int
		expect string
		pass   bool
	}{
		"204 in 200,204":       {204, "200,204", true},
		"204 not in 200":       {204, "200", false},
		"302 in default":       {302, "200-399", true},
		"302 not in 200-299":   {302, "200-299", false},
		"503 in 200,500-503":   {503, "200,500-503", true},
		"404 not in 200-399":   {404, "200-399", false},
		"200 in 100-599 (all)": {200, "100-599", true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.status == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			cfg := activeConfig()
			cfg.Active.ExpectStatus = tc.expect
			lc := startChecker(t, cfg)
			lc.c.SetTargets("s", []Target{{Replica: "a", Addr: srv.Listener.Addr().String()}})
			if tc.pass {
				lc.waitCount(t, "s", "a", "pass", 4) // more than Fall
				if n := testutil.ToFloat64(lc.c.metrics.probes.WithLabelValues("s", "a", "bad_status")); n != 0 {
					t.Fatalf("%v bad_status probes", n)
				}
				callsEqual(t, lc.sink.take())
			} else {
				e := lc.next(t)
				if e.Kind != EventProbeDown || e.failures() != 3 || e.counts["bad_status"] < 1 {
					t.Fatalf("event %+v", e)
				}
			}
		})
	}
}
