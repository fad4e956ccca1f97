package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"keyway/admin"
)

// fakeClock is an injected clock the tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// trafficMetrics registers the three counter families the sampler reads,
// with the names and labels the proxy and the health checker use.
type trafficMetrics struct {
	reg                 *prometheus.Registry
	reqs, up, ejections *prometheus.CounterVec
}

func newTrafficMetrics() *trafficMetrics {
	m := &trafficMetrics{
		reg:       prometheus.NewPedanticRegistry(),
		reqs:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "keyway_requests_total", Help: "h"}, []string{"set", "replica", "code"}),
		up:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "keyway_upstream_errors_total", Help: "h"}, []string{"set", "replica", "kind"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "keyway_ejections_total", Help: "h"}, []string{"set", "replica", "reason"}),
	}
	m.reg.MustRegister(m.reqs, m.up, m.ejections, prometheus.NewCounter(prometheus.CounterOpts{Name: "keyway_other_total", Help: "h"}))
	return m
}

// fl reads a rate: -1 for null.
func fl(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

func TestTrafficSamplerRates(t *testing.T) {
	m := newTrafficMetrics()
	clk := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := newTrafficSampler(m.reg, clk.now)
	reps := func(rd *trafficReading, names ...string) ([]admin.ReplicaStatus, *admin.SetTraffic) {
		var out []admin.ReplicaStatus
		for _, n := range names {
			out = append(out, admin.ReplicaStatus{Name: n, Traffic: rd.replica("orders", n, 0)})
		}
		return out, rd.set("orders", out)
	}

	// Counts before the first reading: totals, but no rate yet.
	m.reqs.WithLabelValues("orders", "orders-0", "2xx").Add(5)
	m.reqs.WithLabelValues("other", "other-0", "2xx").Add(100)
	rd := s.read()
	rs, st := reps(rd, "orders-0")
	if tr := rs[0].Traffic; tr.RequestsTotal != 5 || tr.RequestsPerSecond != nil || tr.ErrorsPerSecond != nil || tr.WindowSeconds != nil {
		t.Fatalf("first reading: %+v", tr)
	}
	if st.RequestsTotal != 5 || st.RequestsPerSecond != nil || st.WindowSeconds != nil || !strings.Contains(st.RateNote, "no earlier reading") {
		t.Fatalf("first reading, set: %+v", st)
	}

	// Half a second later: too short a span for a rate, and not stored.
	clk.add(500 * time.Millisecond)
	if _, st := reps(s.read(), "orders-0"); st.RequestsPerSecond != nil || !strings.Contains(st.RateNote, "0.5s old") {
		t.Fatalf("after 0.5s: %+v", st)
	}

	// Traffic over the next 2 s: rates over 2.5 s (since the first stored
	// reading).
	m.reqs.WithLabelValues("orders", "orders-0", "2xx").Add(20)
	m.reqs.WithLabelValues("orders", "orders-1", "2xx").Add(3)
	m.reqs.WithLabelValues("orders", "orders-1", "5xx").Add(2)
	m.up.WithLabelValues("orders", "orders-2", "dial").Add(4)
	m.up.WithLabelValues("orders", "orders-2", "reset").Add(0) // a series at 0 is not listed
	m.reqs.WithLabelValues("orders", "none", "5xx").Add(5)     // keyway answered itself
	m.ejections.WithLabelValues("orders", "orders-2", "connect").Inc()
	clk.add(2 * time.Second)
	rs, st = reps(s.read(), "orders-0", "orders-1", "orders-2", "orders-3")
	want := []struct {
		reqs, r5xx, transport, errs, ejTotal uint64
		rps, eps                             float64
	}{
		{25, 0, 0, 0, 0, 8, 0},
		{5, 2, 0, 2, 0, 2, 0.8},
		{0, 0, 4, 4, 1, 0, 1.6},
		{0, 0, 0, 0, 0, 0, 0}, // no series at all: measured, nothing sent
	}
	for i, w := range want {
		tr := rs[i].Traffic
		if tr.RequestsTotal != w.reqs || tr.Responses5xxTotal != w.r5xx || tr.TransportErrorsTotal != w.transport || tr.ErrorsTotal != w.errs ||
			tr.EjectionsTotal != w.ejTotal || fl(tr.RequestsPerSecond) != w.rps || fl(tr.ErrorsPerSecond) != w.eps || fl(tr.WindowSeconds) != 2.5 {
			t.Errorf("%s after 2.5s: %+v (rates %v %v), want %+v", rs[i].Name, *tr, fl(tr.RequestsPerSecond), fl(tr.ErrorsPerSecond), w)
		}
	}
	if tr := rs[2].Traffic; len(tr.TransportErrors) != 1 || tr.TransportErrors["dial"] != 4 {
		t.Errorf("orders-2 errors by kind: %v, want only dial 4", tr.TransportErrors)
	}
	if st.RequestsTotal != 30 || st.ErrorsTotal != 6 || st.LocalAnswersTotal != 5 || fl(st.RequestsPerSecond) != 10 ||
		fl(st.ErrorsPerSecond) != 2.4 || fl(st.LocalAnswersPerSecond) != 2 || fl(st.WindowSeconds) != 2.5 || st.RateNote != "" {
		t.Errorf("set after 2.5s: %+v", *st)
	}

	// A reader every 2 s with no traffic: once a stored reading is 10 s
	// old, the rates span 10 s and are measured zeros.
	for range 5 {
		clk.add(2 * time.Second)
		rd = s.read()
	}
	rs, st = reps(rd, "orders-0")
	if tr := rs[0].Traffic; fl(tr.WindowSeconds) != 10 || fl(tr.RequestsPerSecond) != 0 || tr.RequestsTotal != 25 {
		t.Errorf("quiet 10 s: %+v window %v", tr, fl(tr.WindowSeconds))
	}
	// Traffic in the last 2 s of a 10 s window.
	m.reqs.WithLabelValues("orders", "orders-0", "2xx").Add(30)
	clk.add(2 * time.Second)
	if rs, _ := reps(s.read(), "orders-0"); fl(rs[0].Traffic.RequestsPerSecond) != 3 || fl(rs[0].Traffic.WindowSeconds) != 10 {
		t.Errorf("30 requests in a 10 s window: %+v", rs[0].Traffic)
	}

	// The series is deleted and created again (the replica left the ring
	// and came back): its new count is all increase.
	m.reqs.DeletePartialMatch(prometheus.Labels{"set": "orders", "replica": "orders-0"})
	m.reqs.WithLabelValues("orders", "orders-0", "2xx").Add(4)
	clk.add(2 * time.Second)
	if rs, _ := reps(s.read(), "orders-0"); rs[0].Traffic.RequestsTotal != 4 || fl(rs[0].Traffic.RequestsPerSecond) != 0.4 {
		t.Errorf("after a counter reset: %+v rate %v", rs[0].Traffic, fl(rs[0].Traffic.RequestsPerSecond))
	}

	// No read for over a minute: the stored readings are forgotten.
	clk.add(rateMaxAge + time.Second)
	if _, st := reps(s.read(), "orders-0"); st.RequestsPerSecond != nil || st.RateNote == "" {
		t.Errorf("after a long pause: %+v", st)
	}
	clk.add(time.Second)
	if _, st := reps(s.read(), "orders-0"); fl(st.WindowSeconds) != 1 || fl(st.RequestsPerSecond) != 0 {
		t.Errorf("a second after that: %+v", st)
	}
}

// TestTrafficSamplerRun drives the background loop with hand-made ticks:
// each tick stores a reading, so the first read of a set has a rate.
func TestTrafficSamplerRun(t *testing.T) {
	m := newTrafficMetrics()
	clk := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := newTrafficSampler(m.reg, clk.now)
	ctx, cancel := context.WithCancel(context.Background())
	ticks := make(chan time.Time)
	done := make(chan error, 1)
	go func() { done <- s.run(ctx, ticks) }()
	// The loop takes a tick only once it has stored the previous tick's
	// reading: each second tick (too close to store anything) waits for
	// the first.
	ticks <- clk.now()
	ticks <- clk.now()
	m.reqs.WithLabelValues("orders", "orders-0", "2xx").Add(6)
	clk.add(3 * time.Second)
	ticks <- clk.now()
	ticks <- clk.now()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	n := len(s.stored)
	s.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d stored readings after ticks at 0 s and 3 s (twice), want 2", n)
	}
	clk.add(time.Second)
	rd := s.read()
	if tr := rd.replica("orders", "orders-0", 0); fl(tr.RequestsPerSecond) != 1.5 || fl(tr.WindowSeconds) != 4 {
		t.Errorf("first read after the ticks: %+v", tr)
	}
}

// TestTrafficSamplerConcurrent reads from many goroutines (go test -race).
func TestTrafficSamplerConcurrent(t *testing.T) {
	m := newTrafficMetrics()
	clk := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := newTrafficSampler(m.reg, clk.now)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				m.reqs.WithLabelValues("orders", fmt.Sprintf("orders-%d", g), "2xx").Inc()
				if i%10 == 0 {
					clk.add(300 * time.Millisecond)
				}
				rd := s.read()
				rd.set("orders", []admin.ReplicaStatus{{Name: "orders-0", Traffic: rd.replica("orders", "orders-0", 0)}})
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 1; i < len(s.stored); i++ {
		if d := s.stored[i].at.Sub(s.stored[i-1].at); d < sampleEvery {
			t.Fatalf("stored readings %v apart, want at least %v", d, sampleEvery)
		}
	}
}
