package proxy

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"keyway/balancer"

	"keyway/internal/metricstest"
)

// sample returns the value of the series of a counter or gauge family with
// exactly the given labels, and whether it exists.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !labelsEqual(m.GetLabel(), labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func labelsEqual(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}

// seriesWith counts the series of a family having label name=value.
func seriesWith(t *testing.T, g prometheus.Gatherer, family, name, value string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == name && l.GetValue() == value {
					n++
				}
			}
		}
	}
	return n
}

type observation struct {
	set, replica string
	status       int
	err          error
}

type recordingObserver struct {
	mu  sync.Mutex
	obs []observation
}

func (o *recordingObserver) Observe(set, replica string, status int, err error, _ time.Duration) {
	o.mu.Lock()
	o.obs = append(o.obs, observation{set, replica, status, err})
	o.mu.Unlock()
}

// keyWithCandidates returns a key whose candidates start with the names.
func keyWithCandidates(t *testing.T, p *Proxy, names ...string) string {
	t.Helper()
	tbl := p.Router("orders").Table()
	for i := 0; i < 100000; i++ {
		k := fmt.Sprintf("key-%s-%d", strings.Join(names, "-"), i)
		c := tbl.Candidates(balancer.HashString(k))
		ok := len(c) >= len(names)
		for j := 0; ok && j < len(names); j++ {
			ok = tbl.Backend(int(c[j])).Name() == names[j]
		}
		if ok {
			return k
		}
	}
	t.Fatalf("no key with candidates %v", names)
	return ""
}

// TestMetrics drives a scripted set of requests and checks the counters,
// the Observer calls, and that a replica's series go when it leaves.
func TestMetrics(t *testing.T) {
	reg := newRegistry()
	obs := &recordingObserver{}
	r0, r1, dead := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "dead")
	slow, release := slowReplica(t, "slow")
	r1.setHandler(func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	p, addr := startProxyOpts(t, Options{Registerer: reg, Observer: obs}, func(c *Config) {
		c.ReplicaSets[0].Timeouts.Request = 300 * time.Millisecond
		c.ReplicaSets[0].Timeouts.Connect = 100 * time.Millisecond
		c.ReplicaSets[0].Match.PathPrefix = "/ingest"
	}, r0, r1, dead, slow)
	t.Cleanup(release)
	dead.stop(t)
	cl := newClient(addr)
	expect := func(status int, uri string, hdrs ...string) {
		t.Helper()
		if r := cl.do(t, "POST", uri, "x", hdrs...); r.status != status {
			t.Fatalf("POST %s %v: got %v, want %d", uri, hdrs, r, status)
		}
	}

	k0 := keyOwnedBy(t, p, "r0")
	for i := 0; i < 3; i++ {
		expect(200, "/ingest", "X-Key", k0)
	}
	expect(500, "/ingest", "X-Key", keyOwnedBy(t, p, "r1"))                // relayed, counted as the replica's 5xx
	expect(200, "/ingest", "X-Key", keyWithCandidates(t, p, "dead", "r0")) // dial error, retried on r0
	expect(504, "/ingest", "X-Key", keyOwnedBy(t, p, "slow"))              // timeout, not retried
	expect(404, "/elsewhere", "X-Key", k0)                                 // no set

	counts := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"keyway_requests_total", map[string]string{"set": "orders", "replica": "r0", "code": "2xx"}, 4},
		{"keyway_requests_total", map[string]string{"set": "orders", "replica": "r1", "code": "5xx"}, 1},
		{"keyway_requests_total", map[string]string{"set": "orders", "replica": "r1", "code": "2xx"}, 0},
		{"keyway_requests_total", map[string]string{"set": "orders", "replica": "none", "code": "5xx"}, 1},
		{"keyway_requests_total", map[string]string{"set": "none", "replica": "none", "code": "4xx"}, 1},
		{"keyway_upstream_errors_total", map[string]string{"set": "orders", "replica": "dead", "kind": "dial"}, 1},
		{"keyway_upstream_errors_total", map[string]string{"set": "orders", "replica": "slow", "kind": "timeout"}, 1},
		{"keyway_upstream_errors_total", map[string]string{"set": "orders", "replica": "r0", "kind": "dial"}, 0},
		{"keyway_upstream_errors_total", map[string]string{"set": "orders", "replica": "slow", "kind": "reset"}, 0},
		{"keyway_local_responses_total", map[string]string{"set": "orders", "reason": "upstream_timeout"}, 1},
		{"keyway_local_responses_total", map[string]string{"set": "none", "reason": "no_set"}, 1},
		{"keyway_request_duration_seconds", map[string]string{"set": "orders", "replica": "r0"}, 4},
		{"keyway_inflight_requests", map[string]string{}, 0},
		{"keyway_ring_replicas", map[string]string{"set": "orders"}, 4},
		{"keyway_rotation_replicas", map[string]string{"set": "orders"}, 3}, // "dead" refused: held out
	}
	for _, c := range counts {
		got, ok := sample(t, reg, c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if err := testutil.CollectAndCompare(p.metrics.retries, strings.NewReader(`
# HELP keyway_retries_total Requests sent again to the next candidate after a failed attempt.
# TYPE keyway_retries_total counter
keyway_retries_total{set="orders"} 1
`), "keyway_retries_total"); err != nil {
		t.Error(err)
	}

	// The Observer saw every attempt, the failed one with a DialError.
	obs.mu.Lock()
	var sawDial, sawTimeout bool
	for _, o := range obs.obs {
		var de *DialError
		switch {
		case o.replica == "dead" && errors.As(o.err, &de) && o.status == 0:
			sawDial = true
		case o.replica == "slow" && errors.Is(o.err, fasthttp.ErrTimeout):
			sawTimeout = true
		}
	}
	n := len(obs.obs)
	obs.mu.Unlock()
	if n != 7 || !sawDial || !sawTimeout {
		t.Errorf("observer: %d attempts (want 7), dial error seen %v, timeout seen %v", n, sawDial, sawTimeout)
	}

	// Replicas leaving the ring take their series with them.
	p.Router("orders").SetReplicas("static", []balancer.Replica{
		{Name: "r0", Addr: r0.addr(), State: balancer.StateReady},
		{Name: "r1", Addr: r1.addr(), State: balancer.StateReady},
	})
	for _, fam := range []string{"keyway_requests_total", "keyway_upstream_errors_total", "keyway_request_duration_seconds"} {
		for _, gone := range []string{"dead", "slow"} {
			if n := seriesWith(t, reg, fam, "replica", gone); n != 0 {
				t.Errorf("%s still has %d series of removed replica %s", fam, n, gone)
			}
		}
		if n := seriesWith(t, reg, fam, "replica", "r0"); n == 0 {
			t.Errorf("%s lost the series of r0, which stayed", fam)
		}
	}
	if got, _ := sample(t, reg, "keyway_requests_total", map[string]string{"set": "orders", "replica": "r0", "code": "2xx"}); got != 4 {
		t.Errorf("r0's count changed to %v when others left", got)
	}
	if got, _ := sample(t, reg, "keyway_ring_replicas", map[string]string{"set": "orders"}); got != 2 {
		t.Errorf("keyway_ring_replicas = %v after two left, want 2", got)
	}
}

// TestMetricsLint lints every metric the proxy exports.
func TestMetricsLint(t *testing.T) {
	reg := newRegistry()
	rep := startReplica(t, "r0")
	p, addr := startProxyOpts(t, Options{Registerer: reg}, nil, rep)
	newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k")
	p.Router("orders").SetHealthy("r0", false) // a rotation-only rebuild
	p.Router("orders").SetHealthy("r0", true)
	mfs := metricstest.Lint(t, reg)
	if len(mfs) < 10 {
		t.Fatalf("only %d metric families gathered", len(mfs))
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "keyway_") {
			t.Errorf("metric %s lacks the keyway_ prefix", mf.GetName())
		}
	}
}

// TestMetricsRegisteredTwice: a second proxy on the same registry is an
// error from New, not a panic.
func TestMetricsRegisteredTwice(t *testing.T) {
	reg := newRegistry()
	cfg := testConfig(startReplica(t, "r0"))
	if _, err := New(cfg, Options{Registerer: reg, Coalesce: -1}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg, Options{Registerer: reg, Coalesce: -1}); err == nil {
		t.Fatal("New registered the same metrics twice without an error")
	}
}
