package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/internal/slow"
)

func TestParsePair(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "", want: nil},
		{in: "keyway,haproxy", want: []string{"keyway", "haproxy"}},
		{in: " keyway@HEAD , keyway@3038dc9", want: []string{"keyway@HEAD", "keyway@3038dc9"}},
		{in: "keyway,keyway", want: []string{"keyway", "keyway"}},
		{in: "keyway", err: "names 1 targets"},
		{in: "keyway,haproxy,nginx", err: "names 3 targets"},
		{in: "direct,keyway", err: `"direct" is not a proxy target`},
		{in: "keyway,squid", err: `"squid" is not a proxy target`},
		{in: "haproxy@HEAD,keyway", err: "only keyway takes @REV"},
		{in: "keyway@,haproxy", err: "only keyway takes @REV"},
	} {
		got, err := parsePair(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parsePair(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("parsePair(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if err := (&Config{Pair: []string{"keyway", "haproxy"}, Duration: time.Second, Connections: 1, Replicas: 1, Keys: 1, Rounds: 1, LoadGen: "auto", LatencyDuration: time.Second}).validate(); err == nil || !strings.Contains(err.Error(), "-rates") {
		t.Errorf("a pair without rates: %v", err)
	}
}

// TestSummarisePairs: the ratios are per round, then the median; failed
// rounds and rounds under rate are counted, not used or hidden.
func TestSummarisePairs(t *testing.T) {
	f := func(x float64) *float64 { return &x }
	lr := func(cpu, p50 float64, under bool) latencyRun {
		return latencyRun{Rate: 1000, CPUPerReqUS: f(cpu), SysPerReqUS: f(cpu / 2), P50: p50, P99: 2 * p50, UnderRate: under}
	}
	runs := []PairRun{
		{Round: 1, Rate: 1000, A: lr(110, 0.2, false), B: lr(100, 0.1, false)}, // 1.10, p50 2.0
		{Round: 2, Rate: 1000, A: lr(90, 0.3, false), B: lr(100, 0.2, true)},   // 0.90, p50 1.5
		{Round: 3, Rate: 1000, A: lr(200, 0.1, false), B: lr(200, 0.1, false)}, // 1.00, p50 1.0
		{Round: 4, Rate: 1000, Failure: "keyway did not start"},
		{Round: 1, Rate: 3000, A: lr(50, 0.2, false), B: lr(40, 0.2, false)},
	}
	sums := summarisePairs(runs, []int{1000, 3000})
	if len(sums) != 2 {
		t.Fatalf("%d summaries, want 2", len(sums))
	}
	s := sums[0]
	if s.CPURatio.N != 3 || s.CPURatio.Median != 1.0 || s.CPURatio.Min != 0.9 || s.CPURatio.Max != 1.1 {
		t.Errorf("CPU ratio %+v; want median 1.0 of 0.9, 1.0, 1.1", *s.CPURatio)
	}
	if math.Abs(s.P50Ratio.Median-1.5) > 1e-9 || s.ACPU.Median != 110 || s.BCPU.Median != 100 || s.ASys.Median != 55 {
		t.Errorf("p50 ratio %+v, A CPU %+v, B CPU %+v, A sys %+v", *s.P50Ratio, *s.ACPU, *s.BCPU, *s.ASys)
	}
	if s.Failures != 1 || s.UnderRate != 1 {
		t.Errorf("failures %d, under rate %d; want 1 and 1", s.Failures, s.UnderRate)
	}
	if r := sums[1].CPURatio; r.N != 1 || r.Median != 1.25 {
		t.Errorf("3000/s ratio %+v, want 1.25", *r)
	}
}

// TestAlternation: the turns of -pair-alternate are A B, B A, A B, ...,
// as many pairs as slices fit in the duration (rounded), at least one.
func TestAlternation(t *testing.T) {
	for _, tc := range []struct {
		d, slice time.Duration
		want     [][2]int
	}{
		{d: 4 * time.Second, slice: time.Second, want: [][2]int{{0, 1}, {1, 0}, {0, 1}, {1, 0}}},
		{d: 2500 * time.Millisecond, slice: time.Second, want: [][2]int{{0, 1}, {1, 0}, {0, 1}}},
		{d: 2400 * time.Millisecond, slice: time.Second, want: [][2]int{{0, 1}, {1, 0}}},
		{d: time.Second, slice: 2 * time.Second, want: [][2]int{{0, 1}}},
	} {
		if got := alternation(tc.d, tc.slice); !slices.Equal(got, tc.want) {
			t.Errorf("alternation(%v, %v) = %v; want %v", tc.d, tc.slice, got, tc.want)
		}
	}
	base := Config{Pair: []string{"keyway", "haproxy"}, Rates: []int{1000}, Duration: time.Second, Connections: 1, Replicas: 1, Keys: 1, Rounds: 1, LoadGen: "auto", LatencyDuration: 10 * time.Second}
	for _, tc := range []struct {
		alt  time.Duration
		pair bool
		err  string
	}{
		{alt: time.Second, pair: true},
		{alt: 5 * time.Second, pair: true},
		{alt: 6 * time.Second, pair: true, err: "-pair-alternate 6s"},
		{alt: -time.Second, pair: true, err: "-pair-alternate -1s"},
		{alt: time.Second, err: "-pair-alternate needs -pair"},
	} {
		c := base
		c.PairAlternate = tc.alt
		if !tc.pair {
			c.Pair, c.Targets = nil, []string{"keyway"}
		}
		err := c.validate()
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("alternate %v, pair %v: %v; want %q", tc.alt, tc.pair, err, tc.err)
		}
	}
}

// TestPairSmoke pairs keyway with itself for two short rounds: both sides
// are measured over the same seconds, each with its own CPU figure, and
// the report says so; at once, and in turns (-pair-alternate).
func TestPairSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyway and runs load for a few seconds; skipped under -short")
	}
	slow.Skip(t)
	skipOffLinux(t)
	t.Run("at once", func(t *testing.T) { pairSmoke(t, 0, "A = keyway (A) and B = keyway (B) on CPU 0 at once") })
	t.Run("in turns", func(t *testing.T) {
		pairSmoke(t, 500*time.Millisecond, "Paired in turns: A = keyway (A) and B = keyway (B) on CPU 0, each loaded alone in 500ms slices")
	})
}

func pairSmoke(t *testing.T, alt time.Duration, title string) {
	repo, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cfg := Config{
		Pair: []string{"keyway", "keyway"}, Rates: []int{300}, LatencyDuration: time.Second, Warmup: 200 * time.Millisecond,
		Duration: time.Second, Connections: 1, Replicas: 3, Body: 256, Keys: 300, Rounds: 2, LoadGen: "vegeta",
		Pin: false, OutDir: out, Repo: repo, Keyway: testKeyway(t), Race: raceEnabled, Log: testLog{t}, PairAlternate: alt,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writeFiles(rep, out); err != nil {
		t.Fatal(err)
	}
	md := rep.Markdown()
	t.Log("\n" + md)
	if len(rep.Runs) != 0 || len(rep.PairRuns) != 2 {
		t.Fatalf("%d target runs and %d pair runs; want 0 and 2", len(rep.Runs), len(rep.PairRuns))
	}
	if a, b := rep.PairRuns[0].First, rep.PairRuns[1].First; a == b {
		t.Errorf("both rounds started %q first; the order alternates", a)
	}
	for _, r := range rep.PairRuns {
		if r.Failure != "" {
			t.Fatalf("round %d: %s", r.Round, r.Failure)
		}
		for _, side := range []latencyRun{r.A, r.B} {
			if side.Requests < 250 || side.Answered != side.Requests || side.Errors != 0 || side.P50 <= 0 || side.CPUPerReqUS == nil || *side.CPUPerReqUS <= 0 {
				t.Errorf("round %d: %+v", r.Round, side)
			}
		}
	}
	if len(rep.PairSummary) != 1 || rep.PairSummary[0].CPURatio == nil || rep.PairSummary[0].CPURatio.N != 2 {
		t.Fatalf("summary %+v", rep.PairSummary)
	}
	for _, want := range []string{title, "A ÷ B CPU per request", "| 300/s |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b, &got); err != nil || len(got.PairRuns) != 2 || len(got.PairSummary) != 1 {
		t.Fatalf("results.json: %v, %d pair runs", err, len(got.PairRuns))
	}
	if got.Config.PairAlternate != alt {
		t.Errorf("results.json records pair_alternate %v; the run used %v", got.Config.PairAlternate, alt)
	}
}

// TestProcessCPUTime: the process CPU clock counts this process's CPU in
// nanoseconds (finer than /proc's 10 ms ticks), grows as it works, and
// treeCPUSys uses it.
func TestProcessCPUTime(t *testing.T) {
	skipOffLinux(t)
	pid := os.Getpid()
	t0, ok := processCPUTime(pid)
	if !ok || t0 <= 0 {
		t.Fatalf("processCPUTime(self) = %d, %v", t0, ok)
	}
	// Work until the clock has moved 20 ms (bounded: at most 10 s of it).
	x := uint64(1)
	var t1 int64
	for i := 0; i < 1e9 && t1-t0 < 20e6; i++ {
		for range 1000 {
			x = x*6364136223846793005 + 1
		}
		t1, _ = processCPUTime(pid)
	}
	if t1-t0 < 20e6 {
		t.Fatalf("the CPU clock moved %d ns after a long loop (x=%d)", t1-t0, x)
	}
	cpu, sys, err := treeCPUSys(pid)
	if err != nil {
		t.Fatal(err)
	}
	if ns := int64(cpu * 1e9); ns < t1 || sys < 0 || sys > cpu {
		t.Errorf("treeCPUSys: cpu %v s (clock said %d ns before), sys %v s", cpu, t1, sys)
	}
	if _, ok := processCPUTime(1<<22 + 1); ok {
		t.Error("a pid above PID_MAX_LIMIT has a CPU clock")
	}
}

// TestMergeAttacks: the two halves of a paired measurement add up to one
// attack, percentiles over both.
func TestMergeAttacks(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		var out []time.Duration
		for _, x := range xs {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	x := attackResult{requests: 3, errors: 1, answered: 3, firstErr: "", latencies: ms(1, 5), sendLags: ms(0, 2), seconds: 1.5}
	y := attackResult{requests: 4, errors: 2, answered: 3, firstErr: "EOF", latencies: ms(2, 3), sendLags: ms(1, 1), seconds: 2}
	m := mergeAttacks(x, y)
	if m.requests != 7 || m.errors != 3 || m.answered != 6 || m.firstErr != "EOF" || m.seconds != 3.5 {
		t.Errorf("merged %+v", m)
	}
	if !slices.Equal(m.latencies, ms(1, 2, 3, 5)) || !slices.Equal(m.sendLags, ms(0, 1, 1, 2)) {
		t.Errorf("latencies %v, send lags %v: want both halves, sorted", m.latencies, m.sendLags)
	}
	if x.firstErr = "reset"; mergeAttacks(x, y).firstErr != "reset" {
		t.Error("the first half's first error is the first")
	}
}
