package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"keyway/admin"
	"keyway/config"
	"keyway/demo"
	"keyway/internal/testnet"
)

// getJSON decodes a 200 JSON answer of the admin API into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestAdminAPIMatchesRouting runs serve with three static demo replicas and
// checks the read API against what the proxy really does: the replica
// /v1/route names as owner and pick is the one that answers a request
// carrying that X-Key.
func TestAdminAPIMatchesRouting(t *testing.T) {
	var static strings.Builder
	stopReplica := map[string]func(){}
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		addr, stop := startDemoReplica(t, name)
		stopReplica[name] = stop
		fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", name, addr)
	}
	yml := "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nlog: {level: warn}\nreplica_sets:\n  - name: orders\n    replicas: 3\n    static:\n" + static.String()
	cfg, err := config.LoadBytes("test.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	stk := startStack(t, cfg, stackOpts{})
	proxyAddr, adminAddr := stk.proxy, stk.admin
	waitRotation(t, adminAddr, 3)
	base := "http://" + adminAddr

	var list struct {
		ReplicaSets []admin.SetStatus `json:"replica_sets"`
	}
	getJSON(t, base+"/v1/replica_sets", &list)
	if len(list.ReplicaSets) != 1 {
		t.Fatalf("sets: %+v", list)
	}
	s := list.ReplicaSets[0]
	if s.Name != "orders" || s.Phase != "Running" || s.Declared != 3 || s.Ready != 3 || s.InRotation != 3 || s.RingSize != 3 ||
		!strings.HasPrefix(s.Fingerprint, "v1-") || s.Replicas != nil {
		t.Fatalf("set: %+v", s)
	}

	var one admin.SetStatus
	getJSON(t, base+"/v1/replica_sets/orders", &one)
	total := 0
	for _, r := range one.Replicas {
		total += r.Partitions
		if !r.InRotation || r.State != "ready" || r.Slot < 0 || r.Share != float64(r.Partitions)/float64(one.Partitions) {
			t.Errorf("replica: %+v", r)
		}
	}
	if len(one.Replicas) != 3 || total != one.Partitions {
		t.Fatalf("replicas own %d of %d partitions: %+v", total, one.Partitions, one.Replicas)
	}

	route := func(key string) admin.RouteExplain {
		var ex admin.RouteExplain
		getJSON(t, base+"/v1/route?set=orders&key="+url.QueryEscape(key), &ex)
		return ex
	}
	send := func(key string) string {
		req, _ := http.NewRequest("POST", "http://"+proxyAddr+"/ingest", strings.NewReader("x"))
		req.Header.Set("X-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var a demo.Answer
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil || a.Key != key {
			t.Fatalf("key %q: status %d, answer %+v, %v", key, resp.StatusCode, a, err)
		}
		return a.Replica
	}
	owners := map[string]bool{}
	ownedBy := map[string]string{}
	for i := range 40 {
		key := fmt.Sprintf("order/%d ü", i) // escaped in the query, sent raw as a header
		ex := route(key)
		if ex.Key != key || ex.Owner == "" || ex.Pick != ex.Owner || len(ex.Candidates) == 0 ||
			ex.Candidates[0].Name != ex.Owner || !ex.Candidates[0].Picked {
			t.Fatalf("route %q: %+v", key, ex)
		}
		if got := send(key); got != ex.Pick {
			t.Errorf("key %q: /v1/route says %s, the proxy sent it to %s", key, ex.Pick, got)
		}
		owners[ex.Owner] = true
		ownedBy[ex.Owner] = key
	}
	if len(owners) != 3 {
		t.Errorf("40 keys reached %d replicas, want 3 (the comparison would be weak): %v", len(owners), owners)
	}

	// Stop orders-0: the proxy's next request for one of its keys is
	// refused, ejects it and fails over. The route endpoint then says
	// why the owner is skipped and picks the replica that answers.
	key := ownedBy["orders-0"]
	stopReplica["orders-0"]()
	got := send(key)
	ex := route(key)
	if ex.Owner != "orders-0" || ex.Pick == "orders-0" || ex.Pick != got || len(ex.Candidates) < 2 ||
		ex.Candidates[0].InRotation || !strings.Contains(ex.Candidates[0].Skipped, "refused") {
		t.Fatalf("after stopping orders-0, key %q went to %s; route: %+v", key, got, ex)
	}
	if got2 := send(key); got2 != ex.Pick {
		t.Errorf("key %q: /v1/route says %s, the proxy sent it to %s", key, ex.Pick, got2)
	}
	getJSON(t, base+"/v1/replica_sets/orders", &one)
	if r := one.Replicas[0]; r.Name != "orders-0" || r.InRotation || !strings.Contains(r.Reason, "refused") || one.InRotation != 2 {
		t.Errorf("after stopping orders-0: %+v", one)
	}

	var members struct{ Members []admin.MemberInfo }
	getJSON(t, base+"/v1/members", &members)
	if members.Members == nil || len(members.Members) != 0 {
		t.Errorf("members with gossip off: %+v, want []", members)
	}
	var conf map[string]any
	getJSON(t, base+"/v1/config", &conf)
	if sets, _ := conf["replica_sets"].([]any); len(sets) != 1 || conf["listen"] != "127.0.0.1:0" {
		t.Errorf("config under its YAML names: %v", conf)
	}
	var evs struct{ Events []map[string]any }
	getJSON(t, base+"/v1/events?kind=ring_rebuild&limit=1", &evs)
	if len(evs.Events) != 1 || evs.Events[0]["kind"] != "ring_rebuild" || evs.Events[0]["set"] != "orders" {
		t.Errorf("events: %+v", evs)
	}
}

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

// TestAdminTrafficCounts sends requests through a real proxy to four static
// replicas — two demo replicas, one answering every request 500 and one
// address that refuses connections — and checks the set view's traffic
// against what the clients saw.
func TestAdminTrafficCounts(t *testing.T) {
	var static strings.Builder
	for i := range 2 {
		name := fmt.Sprintf("orders-%d", i)
		addr, _ := startDemoReplica(t, name)
		fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", name, addr)
	}
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintln(w, `{"replica": "orders-2"}`)
	}))
	t.Cleanup(failing.Close)
	fmt.Fprintf(&static, "      - {name: orders-2, addr: %q}\n", failing.Listener.Addr().String())
	refusing := testnet.RefusedAddr(t)
	fmt.Fprintf(&static, "      - {name: orders-3, addr: %q}\n", refusing)

	yml := `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: error}
health:
  active: {enabled: false}
  passive: {enabled: true, consecutive_failures: 1, count: [connect, 5xx], base_ejection: 1m, max_ejection: 1m}
replica_sets:
  - name: orders
    replicas: 4
    retries: {attempts: 3}
    static:
` + static.String()
	cfg, err := config.LoadBytes("test.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	stk := startStack(t, cfg, stackOpts{})
	proxyAddr, adminAddr := stk.proxy, stk.admin
	waitRotation(t, adminAddr, 4)
	setURL := "http://" + adminAddr + "/v1/replica_sets/orders"
	byName := func(st admin.SetStatus) map[string]*admin.ReplicaTraffic {
		out := map[string]*admin.ReplicaTraffic{}
		for _, r := range st.Replicas {
			if r.Traffic == nil {
				t.Fatalf("%s has no traffic: %+v", r.Name, r)
			}
			out[r.Name] = r.Traffic
		}
		return out
	}

	// The first read: nothing sent, no rate known yet (null, with a note),
	// not a measured 0.
	var st admin.SetStatus
	getJSON(t, setURL, &st)
	if st.Traffic == nil || st.Traffic.RequestsPerSecond != nil || st.Traffic.WindowSeconds != nil || st.Traffic.RateNote == "" || st.Traffic.RequestsTotal != 0 {
		t.Fatalf("first read: traffic %+v", st.Traffic)
	}
	for name, tr := range byName(st) {
		if tr.RequestsTotal != 0 || tr.ErrorsTotal != 0 || tr.RequestsPerSecond != nil {
			t.Errorf("%s before any request: %+v", name, tr)
		}
	}

	const n = 80
	answered := map[string]uint64{}
	for i := range n {
		req, _ := http.NewRequest("POST", "http://"+proxyAddr+"/ingest", strings.NewReader("x"))
		req.Header.Set("X-Key", fmt.Sprintf("order-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var a demo.Answer
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil || a.Replica == "" || (resp.StatusCode == 500) != (a.Replica == "orders-2") {
			t.Fatalf("request %d: status %d, answer %+v, %v", i, resp.StatusCode, a, err)
		}
		answered[a.Replica]++
	}
	t.Logf("answers by replica: %v", answered)
	if answered["orders-2"] == 0 {
		t.Fatalf("no key reached orders-2 (the 500 replica): %v", answered)
	}

	st = admin.SetStatus{}
	getJSON(t, setURL, &st)
	trs := byName(st)
	for _, name := range []string{"orders-0", "orders-1", "orders-2", "orders-3"} {
		if got := trs[name].RequestsTotal; got != answered[name] {
			t.Errorf("%s: requests_total %d, the clients saw %d answers from it", name, got, answered[name])
		}
	}
	if st.Traffic.RequestsTotal != n || st.Traffic.LocalAnswersTotal != 0 {
		t.Errorf("set: requests_total %d (want %d), local_answers_total %d (want 0)", st.Traffic.RequestsTotal, n, st.Traffic.LocalAnswersTotal)
	}
	if tr := trs["orders-2"]; tr.Responses5xxTotal != answered["orders-2"] || tr.ErrorsTotal != tr.Responses5xxTotal || tr.TransportErrorsTotal != 0 {
		t.Errorf("orders-2 (answers 500): %+v", tr)
	}
	if tr := trs["orders-3"]; tr.TransportErrors["dial"] == 0 || tr.TransportErrorsTotal != tr.TransportErrors["dial"] || tr.ErrorsTotal != tr.TransportErrorsTotal || tr.Responses5xxTotal != 0 {
		t.Errorf("orders-3 (refuses): %+v", tr)
	}
	for _, name := range []string{"orders-0", "orders-1"} {
		if tr := trs[name]; tr.ErrorsTotal != 0 || tr.Ejections != 0 {
			t.Errorf("%s (healthy): %+v", name, tr)
		}
	}

	// The passive checker ejects orders-2 on its first 500 (its sweeper
	// runs every passive.interval), and rates need a reading 1 s after the
	// first: poll both with a deadline.
	deadline := time.Now().Add(15 * time.Second)
	for {
		st = admin.SetStatus{}
		getJSON(t, setURL, &st)
		trs = byName(st)
		if trs["orders-2"].Ejections >= 1 && trs["orders-2"].EjectionsTotal >= 1 && st.Traffic.RequestsPerSecond != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ejection of orders-2 or no rate within 15 s: set %+v, orders-2 %+v", st.Traffic, trs["orders-2"])
		}
		<-time.After(50 * time.Millisecond)
	}
	// The rates compare with the first reading, taken before the requests:
	// rate × window is the number sent.
	if st.Traffic.RateNote != "" {
		t.Errorf("a rate with a note: %+v", st.Traffic)
	}
	w := fl(st.Traffic.WindowSeconds)
	if sent := fl(st.Traffic.RequestsPerSecond) * w; w < 1 || sent < n*0.99 || sent > n*1.01 {
		t.Errorf("set rate %v/s over %v s = %v requests, want %d", fl(st.Traffic.RequestsPerSecond), w, sent, n)
	}
	if fl(trs["orders-3"].ErrorsPerSecond) <= 0 || fl(trs["orders-2"].ErrorsPerSecond) <= 0 || fl(trs["orders-0"].ErrorsPerSecond) != 0 {
		t.Errorf("error rates: orders-0 %v, orders-2 %v, orders-3 %v", fl(trs["orders-0"].ErrorsPerSecond), fl(trs["orders-2"].ErrorsPerSecond), fl(trs["orders-3"].ErrorsPerSecond))
	}
	raw, _ := json.MarshalIndent(st.Traffic, "", "  ")
	t.Logf("set traffic: %s", raw)
	for _, name := range []string{"orders-2", "orders-3"} {
		raw, _ := json.Marshal(trs[name])
		t.Logf("%s traffic: %s", name, raw)
	}
}
