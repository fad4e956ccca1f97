package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"keyway/config"
	"keyway/internal/slow"
)

func TestSatPacerPhases(t *testing.T) {
	p := satPacer{durs: []time.Duration{2 * time.Second, time.Second, 2 * time.Second}, rates: []float64{10, 100, 10}}
	// 20 hits in the first phase, 100 in the second, 20 in the third.
	for _, c := range []struct {
		k     uint64
		at    time.Duration
		phase int
		ok    bool
	}{
		{0, 0, 0, true},
		{19, 1900 * time.Millisecond, 0, true},
		{20, 2 * time.Second, 1, true},
		{119, 2990 * time.Millisecond, 1, true},
		{120, 3 * time.Second, 2, true},
		{139, 4900 * time.Millisecond, 2, true},
		{140, 5 * time.Second, 3, false},
	} {
		at, ph, ok := p.due(c.k)
		if at != c.at || ph != c.phase || ok != c.ok {
			t.Errorf("due(%d) = %v, %d, %v; want %v, %d, %v", c.k, at, ph, ok, c.at, c.phase, c.ok)
		}
	}
	if w, stop := p.Pace(2500*time.Millisecond, 20); stop || w != 0 {
		t.Errorf("Pace behind schedule = %v, %v; want 0, false", w, stop)
	}
	if w, stop := p.Pace(2*time.Second, 30); stop || w != 100*time.Millisecond {
		t.Errorf("Pace ahead of schedule = %v, %v; want 100ms, false", w, stop)
	}
	if _, stop := p.Pace(5*time.Second, 140); !stop {
		t.Error("Pace past the last phase did not stop")
	}
	if r := p.Rate(2500 * time.Millisecond); r != 100 {
		t.Errorf("Rate in the load phase = %v, want 100", r)
	}
}

func TestSummarisePhase(t *testing.T) {
	var s []satSample
	// 90 served at 10..99 ms, 6 shed with 503 in 1 ms, 2 with 429, one
	// client timeout, one refused connection.
	for i := range 90 {
		s = append(s, satSample{latency: time.Duration(10+i) * time.Millisecond, code: 200, outcome: satOK})
	}
	for range 6 {
		s = append(s, satSample{latency: time.Millisecond, code: 503, outcome: satShed})
	}
	for range 2 {
		s = append(s, satSample{latency: 2 * time.Millisecond, code: 429, outcome: satShed})
	}
	s = append(s, satSample{latency: 10 * time.Second, outcome: classify(0, `Post "http://x": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`)})
	s = append(s, satSample{outcome: classify(0, "dial tcp: connect: connection refused")})
	p := summarisePhase(s, 50, 2*time.Second)
	if p.Requests != 100 || p.OKShare != 0.9 || p.ShedShare != 0.08 || p.TimeoutShare != 0.01 || p.ErrorShare != 0.01 {
		t.Errorf("counts: %+v", p)
	}
	if p.ShedByStatus["503"] != 6 || p.ShedByStatus["429"] != 2 || p.ShedP99 != 2 {
		t.Errorf("shed: %v, p99 %v ms", p.ShedByStatus, p.ShedP99)
	}
	// Nearest rank over the 90 served: p50 is the 45th (54 ms), p99 the
	// 90th (99 ms); shed and failed requests do not count.
	if p.P50 != 54 || p.P99 != 99 || p.Max != 99 {
		t.Errorf("admitted latency p50 %v p99 %v max %v, want 54 99 99", p.P50, p.P99, p.Max)
	}
}

func TestGoodput(t *testing.T) {
	s := []satSample{
		{at: 0, latency: 500 * time.Millisecond, outcome: satOK},                      // ends 0.5 s
		{at: 500 * time.Millisecond, latency: time.Second, outcome: satOK},            // ends 1.5 s
		{at: 900 * time.Millisecond, latency: 200 * time.Millisecond, outcome: satOK}, // ends 1.1 s
		{at: time.Second, latency: time.Millisecond, outcome: satShed},                // not 2xx
		{at: time.Second, latency: 2 * time.Second, outcome: satOK},                   // ends 3 s
	}
	// Answers arriving in [1 s, 2 s), whenever sent: two.
	if g := goodput(s, time.Second, 2*time.Second); g != 2 {
		t.Errorf("goodput [1s, 2s) = %v, want 2", g)
	}
	if g := goodput(s, 0, 4*time.Second); g != 1 {
		t.Errorf("goodput [0, 4s) = %v, want 1", g)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		code uint16
		err  string
		want satOutcome
	}{
		{200, "", satOK},
		{204, "", satOK},
		{503, "", satShed},
		{502, "", satShed},
		{503, "503 Service Unavailable", satShed}, // vegeta's error for a non-2xx status
		{429, "429 Too Many Requests", satShed},
		{0, "Post: net/http: request canceled (Client.Timeout exceeded while awaiting headers)", satTimeout},
		{0, "read: connection reset by peer", satError},
		{0, "EOF", satError},
	} {
		if got := classify(c.code, c.err); got != c.want {
			t.Errorf("classify(%d, %q) = %d, want %d", c.code, c.err, got, c.want)
		}
	}
}

// timeline builds one request every 10ms from 0 to end, with latency
// lat(at).
func timeline(end time.Duration, lat func(time.Duration) (time.Duration, satOutcome)) []satSample {
	var s []satSample
	for at := time.Duration(0); at < end; at += 10 * time.Millisecond {
		l, o := lat(at)
		s = append(s, satSample{at: at, latency: l, outcome: o, code: 200})
	}
	return s
}

func TestRecoveryTime(t *testing.T) {
	const (
		window = 500 * time.Millisecond
		step   = 100 * time.Millisecond
		hold   = time.Second
		bound  = 30 * time.Millisecond
	)
	// A queue that drains over the first 2 s: latency falls from 2 s to
	// 10 ms at 2 s. The first window wholly after 2 s starts at 2 s.
	drain := timeline(10*time.Second, func(at time.Duration) (time.Duration, satOutcome) {
		if at < 2*time.Second {
			return 2*time.Second - at, satOK
		}
		return 10 * time.Millisecond, satOK
	})
	if d, ok := recoveryTime(drain, 0, 10*time.Second, window, step, hold, bound); !ok || d != 2*time.Second {
		t.Errorf("drain: %v, %v; want 2s, true", d, ok)
	}
	// Measured from the drop at 1 s: 1 s after it.
	if d, ok := recoveryTime(drain, time.Second, 10*time.Second, window, step, hold, bound); !ok || d != time.Second {
		t.Errorf("drain from 1s: %v, %v; want 1s, true", d, ok)
	}
	// Normal from the start: 0.
	flat := timeline(5*time.Second, func(time.Duration) (time.Duration, satOutcome) { return 10 * time.Millisecond, satOK })
	if d, ok := recoveryTime(flat, 0, 5*time.Second, window, step, hold, bound); !ok || d != 0 {
		t.Errorf("flat: %v, %v; want 0, true", d, ok)
	}
	// A short good spell (under the hold) followed by a relapse does not
	// count: normal from 1.0 to 1.5 s, slow until 3 s, normal after.
	relapse := timeline(8*time.Second, func(at time.Duration) (time.Duration, satOutcome) {
		if at < time.Second || (at >= 1500*time.Millisecond && at < 3*time.Second) {
			return time.Second, satOK
		}
		return 10 * time.Millisecond, satOK
	})
	if d, ok := recoveryTime(relapse, 0, 8*time.Second, window, step, hold, bound); !ok || d != 3*time.Second {
		t.Errorf("relapse: %v, %v; want 3s, true", d, ok)
	}
	// Fast but shed: answered in 1 ms with 503 until 4 s. Shedding is not
	// normal, however fast.
	shedding := timeline(8*time.Second, func(at time.Duration) (time.Duration, satOutcome) {
		if at < 4*time.Second {
			return time.Millisecond, satShed
		}
		return 10 * time.Millisecond, satOK
	})
	if d, ok := recoveryTime(shedding, 0, 8*time.Second, window, step, hold, bound); !ok || d != 4*time.Second {
		t.Errorf("shedding: %v, %v; want 4s, true", d, ok)
	}
	// Never normal within the observation.
	if _, ok := recoveryTime(drain, 0, 2500*time.Millisecond, window, step, hold, bound); ok {
		t.Error("recovered although no window after the drain fits with its hold")
	}
	// Gaps (no request sent) are not normal.
	if _, ok := recoveryTime(nil, 0, 5*time.Second, window, step, hold, bound); ok {
		t.Error("recovered with no request at all")
	}
}

func TestSummariseSaturation(t *testing.T) {
	rec := func(x float64) *float64 { return &x }
	lv := func(good, p99, base float64, r *float64) satLevel {
		return satLevel{
			Factor: 2, Base: satPhase{P99: base}, P99OverBase: p99 / base, RecoverySeconds: r, PeakRSSBytes: 64 << 20,
			Load: satPhase{Offered: 600, Goodput: good, P50: p99 / 2, P99: p99, ShedShare: 0.5, ShedP99: 1, ShedByStatus: map[string]int64{"503": 10}},
		}
	}
	runs := []TargetRun{
		{Round: 1, Target: "keyway", Saturation: []satLevel{lv(300, 40, 20, rec(1))}},
		{Round: 2, Target: "keyway", Saturation: []satLevel{lv(290, 60, 20, nil)}},
		{Round: 3, Target: "keyway", Saturation: []satLevel{lv(310, 50, 25, rec(3))}},
		{Round: 1, Target: "haproxy", Saturation: []satLevel{{Factor: 2, Failure: "start"}}},
	}
	got := summariseSaturation(runs, []float64{1, 2})
	if len(got) != 1 {
		t.Fatalf("%d rows, want 1 (keyway at 2×; haproxy failed, nothing at 1×): %+v", len(got), got)
	}
	s := got[0]
	if s.Target != "keyway" || s.Rounds != 3 || s.Offered != 600 || s.Goodput.Median != 300 || s.P99.Median != 50 || s.P99OverBase.Median != 2 {
		t.Errorf("summary: %+v", s)
	}
	if s.NotRecovered != 1 || s.Recovery.Median != 2 || s.ShedByStatus["503"] != 30 || s.PeakRSSMiB.Median != 64 {
		t.Errorf("recovery %+v not recovered %d, shed %v, RSS %+v", s.Recovery, s.NotRecovered, s.ShedByStatus, s.PeakRSSMiB)
	}
	r := &Report{Config: Config{Replicas: 3, Saturation: true, Sat: SatConfig{Concurrency: 2, Service: 20 * time.Millisecond, Recovery: 15 * time.Second}}, SatSummary: got}
	var b strings.Builder
	r.satMarkdown(&b)
	for _, want := range []string{"Capacity 300 req/s", "| keyway | 2× | 600 | 300 (290–310) |", "send lag p99 ms", "(503: 30)", "**1 of 3 not within 15s**"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, b.String())
		}
	}
}

func TestHAProxySaturationConfig(t *testing.T) {
	dir := t.TempDir()
	e := &targetEnv{replicas: []string{"127.0.0.1:1", "127.0.0.1:2"}, maxConns: 100, sat: &satTargetConfig{concurrency: 2, service: 20 * time.Millisecond}}
	if _, err := haproxyConfig(dir, 8080, e); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	b := string(raw)
	for _, want := range []string{"  timeout queue 100ms\n", "  server r1 127.0.0.1:2 maxconn 2 maxqueue 2\n"} {
		if !strings.Contains(b, want) {
			t.Errorf("haproxy.cfg lacks %q:\n%s", want, b)
		}
	}
}

// TestSaturationSmoke runs the saturation mode for a few seconds against
// keyway (the only target that needs nothing installed) and checks what
// does not depend on the machine's speed: the schedule, the capacity
// ceiling on goodput, the service-time floor on latency, and that memory
// was sampled.
func TestSaturationSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyway and runs load for a few seconds; skipped under -short")
	}
	slow.Skip(t)
	skipOffLinux(t)
	repo, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Duration: time.Second, Replicas: 2, Body: 256, Keys: 300, Rounds: 1, Connections: 1,
		Targets: []string{"keyway", "direct"}, LoadGen: "vegeta", Pin: false,
		Saturation: true,
		Sat: SatConfig{
			Concurrency: 2, Service: 20 * time.Millisecond, Factors: []float64{2}, BaseFactor: 0.5,
			Base: time.Second, Duration: time.Second, Recovery: 3 * time.Second, Timeout: 10 * time.Second,
			Window: 500 * time.Millisecond, Step: 100 * time.Millisecond, Bound: 1.5, Hold: time.Second,
		},
		OutDir: t.TempDir(), Repo: repo, Keyway: testKeyway(t), Race: raceEnabled, Log: testLog{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Markdown())
	if len(rep.Runs) != 1 || rep.Runs[0].Target != "keyway" || len(rep.Runs[0].Saturation) != 1 {
		t.Fatalf("want one keyway run with one level (direct skipped), got %+v", rep.Runs)
	}
	if f := rep.Runs[0].Failures; len(f) > 0 {
		t.Fatalf("failures: %v", f)
	}
	lv := rep.Runs[0].Saturation[0]
	// Capacity 2 × 2 ÷ 20ms = 200 req/s: base 100/s for 1 s, load 400/s
	// for 1 s, recovery 100/s for 3 s.
	if lv.Base.Requests != 100 || lv.Load.Requests != 400 || lv.Recovery.Requests != 300 {
		t.Errorf("requests per phase %d, %d, %d; want 100, 400, 300", lv.Base.Requests, lv.Load.Requests, lv.Recovery.Requests)
	}
	if lv.Load.Offered != 400 || !(lv.Load.Goodput > 0) || lv.Load.Goodput > 210 {
		t.Errorf("offered %v, goodput %v; want 400 and at most the capacity (200) plus what was in service", lv.Load.Offered, lv.Load.Goodput)
	}
	if lv.Base.P99 < 20 || lv.Base.P50 < 20 {
		t.Errorf("base p50 %v p99 %v ms, below the 20 ms service time", lv.Base.P50, lv.Base.P99)
	}
	if lv.PeakRSSBytes <= 0 || !(lv.PeakHeapBytes > 0) || len(lv.Timeline) < 5 {
		t.Errorf("peak RSS %d, heap %v, %d timeline seconds", lv.PeakRSSBytes, lv.PeakHeapBytes, len(lv.Timeline))
	}
	if len(rep.SatSummary) != 1 || !strings.Contains(rep.Markdown(), "### Saturation") {
		t.Errorf("summary %+v", rep.SatSummary)
	}
}

// TestKeywaySaturationConfig: keyway's saturation configuration loads and
// carries the same bounds as HAProxy's (maxconn, maxqueue, timeout queue).
func TestKeywaySaturationConfig(t *testing.T) {
	dir := t.TempDir()
	e := &targetEnv{replicas: []string{"127.0.0.1:1", "127.0.0.1:2"}, maxConns: 100, sat: &satTargetConfig{concurrency: 2, service: 20 * time.Millisecond}}
	args, err := keywayConfig(dir, 8080, e)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(args[len(args)-1])
	if err != nil {
		t.Fatal(err)
	}
	sc := cfg.ReplicaSets[0]
	if l := sc.Limits; l.MaxInflightPerReplica != 2 || l.MaxQueuedPerReplica != 2 || l.MaxQueueWait != 100*time.Millisecond {
		t.Errorf("limits %+v: want 2 in flight, 2 queued, 100ms wait", l)
	}
	if len(sc.Static) != 2 || cfg.Server.MaxHeapBytes != satHeapBound {
		t.Errorf("static %v, max_heap_bytes %v", sc.Static, cfg.Server.MaxHeapBytes)
	}
}
