package main

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/internal/slow"
)

// TestSmoke runs the harness for a few seconds against keyway and direct
// with tiny settings, TLS mode included, and checks the numbers it writes.
// It needs only Go: the load comes from vegeta and the harness's own
// clients, so wrk, HAProxy, nginx and Caddy are not used even when
// installed.
func TestSmoke(t *testing.T) {
	slow.Skip(t)
	if testing.Short() {
		t.Skip("builds keyway and runs load for a few seconds; skipped under -short")
	}
	skipOffLinux(t)
	repo, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cfg := Config{
		Duration:        time.Second,
		Warmup:          200 * time.Millisecond,
		Connections:     4,
		Rates:           []int{200},
		LatencyDuration: time.Second,
		Replicas:        3,
		Body:            256,
		Keys:            300,
		Rounds:          1,
		Targets:         []string{"direct", "keyway"},
		IdleConns:       200,
		SparseConns:     20,
		SparsePeriod:    300 * time.Millisecond,
		LoadGen:         "vegeta",
		TLS:             true,
		Pin:             false, // never pin the test process
		OutDir:          out,
		Repo:            repo,
		Keyway:          testKeyway(t),
		Race:            raceEnabled,
		Log:             testLog{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writeFiles(rep, out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Markdown())

	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	sum := map[string]TargetSummary{}
	for _, s := range got.Summary {
		sum[s.Target] = s
		if len(s.Failures) > 0 {
			t.Errorf("%s failures: %v", s.Target, s.Failures)
		}
	}
	for _, name := range []string{"direct", "keyway"} {
		s, ok := sum[name]
		if !ok {
			t.Fatalf("no summary for %s in %s", name, b)
		}
		if s.RPS == nil || !(s.RPS.Median > 0) {
			t.Errorf("%s throughput = %+v, want > 0", name, s.RPS)
		}
		if s.Errors != 0 {
			t.Errorf("%s had %d errors under load", name, s.Errors)
		}
		if len(s.Latency) != 1 || s.Latency[0].P50 == nil || !(s.Latency[0].P50.Median > 0) || s.Latency[0].Errors != 0 {
			t.Errorf("%s latency = %+v, want one rate with p50 > 0 and no errors", name, s.Latency)
		}
	}
	// CPU per request at the fixed rate: measured for keyway, absent for
	// direct (no proxy process), in the runs and in the summaries.
	for _, run := range got.Runs {
		if len(run.Latency) != 1 {
			continue
		}
		l := run.Latency[0]
		if !(l.AchievedRate > 0) || l.Answered != l.Requests {
			t.Errorf("%s at %d/s: sent %v/s, %d of %d requests answered; want > 0 and all", run.Target, l.Rate, l.AchievedRate, l.Answered, l.Requests)
		}
		t.Logf("%s at %d/s: sent %.0f/s, send lag p99 %.2f ms", run.Target, l.Rate, l.AchievedRate, l.SendLagP99)
		switch run.Target {
		case "keyway":
			if l.CPUPerReqUS == nil || !(*l.CPUPerReqUS > 0) || l.CPUUtil == nil || !(*l.CPUUtil > 0) || l.CPUSeconds == nil {
				t.Errorf("keyway latency run: proxy CPU %v s, %v cores, %v µs/req; want all > 0", l.CPUSeconds, l.CPUUtil, l.CPUPerReqUS)
			}
		case "direct":
			if l.CPUPerReqUS != nil || l.CPUUtil != nil || l.CPUSeconds != nil {
				t.Errorf("direct latency run has proxy CPU figures: %v s, %v cores, %v µs/req", l.CPUSeconds, l.CPUUtil, l.CPUPerReqUS)
			}
		}
	}
	if l := sum["keyway"].Latency; len(l) != 1 || l[0].CPUPerReqUS == nil || !(l[0].CPUPerReqUS.Median > 0) {
		t.Errorf("keyway latency summary lacks proxy CPU per request: %+v", l)
	}
	if l := sum["direct"].Latency; len(l) == 1 && (l[0].CPUPerReqUS != nil || l[0].CPUUtil != nil) {
		t.Errorf("direct latency summary has proxy CPU figures: %+v, %+v", l[0].CPUPerReqUS, l[0].CPUUtil)
	}
	kw := sum["keyway"]
	if kw.SplitKeyShare != 0 || kw.KeysSeen == 0 {
		t.Errorf("keyway: %v of %d keys seen by more than one replica, want 0 of > 0", kw.SplitKeyShare, kw.KeysSeen)
	}
	if kw.Balance == nil || kw.Balance.Median < 1 || kw.Balance.Median > 3 {
		t.Errorf("keyway balance max/mean = %+v, want within [1, 3] for 3 replicas", kw.Balance)
	}
	if kw.CPUPerReqUS == nil || !(kw.CPUPerReqUS.Median > 0) || kw.PeakRSSMiB == nil || !(kw.PeakRSSMiB.Median > 1) {
		t.Errorf("keyway CPU/request %+v and peak RSS %+v MiB, want both > 0", kw.CPUPerReqUS, kw.PeakRSSMiB)
	}
	if kw.IdleRSSMiB == nil || !(kw.IdleRSSMiB.Median > 1) || kw.IdleBytes == nil || math.IsNaN(kw.IdleBytes.Median) {
		t.Errorf("keyway idle-connection memory not measured: %+v, %+v", kw.IdleRSSMiB, kw.IdleBytes)
	}
	// 20 connections, each sending every 300 ms: about 67 req/s.
	if kw.SparseCPUPerReqUS == nil || !(kw.SparseCPUPerReqUS.Median > 0) || kw.SparseErrors != 0 ||
		kw.SparseRate == nil || kw.SparseRate.Median < 30 || kw.SparseRate.Median > 100 {
		t.Errorf("keyway sparse clients: CPU/request %+v, rate %+v, %d errors; want CPU > 0, about 67 req/s, no error", kw.SparseCPUPerReqUS, kw.SparseRate, kw.SparseErrors)
	}
	if sum["direct"].SparseCPUPerReqUS != nil {
		t.Errorf("direct has a sparse-client figure: %+v", sum["direct"].SparseCPUPerReqUS)
	}
	if len(got.Ratios) == 0 || got.Ratios[0].Vs["direct"] == nil {
		t.Errorf("no keyway/direct throughput ratio: %+v", got.Ratios)
	}
	kt := kw.TLS
	if kt == nil {
		t.Fatal("keyway has no TLS summary")
	}
	if kt.CPUPerReqUS == nil || !(kt.CPUPerReqUS.Median > 0) || kt.CPUOverPlain == nil || kt.Errors != 0 {
		t.Errorf("keyway TLS keep-alive: CPU/request %+v, TLS ÷ plain %+v, errors %d; want both > 0 and no errors", kt.CPUPerReqUS, kt.CPUOverPlain, kt.Errors)
	}
	if kt.HandshakeRate == nil || !(kt.HandshakeRate.Median > 0) || kt.HandshakeCPUUS == nil || !(kt.HandshakeCPUUS.Median > 0) || kt.HandshakeErrors != 0 {
		t.Errorf("keyway handshakes: %+v/s, %+v µs each, %d errors; want > 0 and no errors", kt.HandshakeRate, kt.HandshakeCPUUS, kt.HandshakeErrors)
	}
	if kt.ConnRate == nil || !(kt.ConnRate.Median > 0) || kt.ConnErrors != 0 || kt.IdleBytes == nil {
		t.Errorf("keyway plain new connections %+v/s (%d errors), idle TLS memory %+v", kt.ConnRate, kt.ConnErrors, kt.IdleBytes)
	}
	if !strings.HasPrefix(kt.Negotiated, "TLS 1.3 ") || !strings.Contains(kt.Negotiated, " X25519") {
		t.Errorf("keyway negotiated %q, want TLS 1.3 with X25519", kt.Negotiated)
	}
	if sum["direct"].TLS != nil {
		t.Error("direct has TLS figures; the replicas speak plain HTTP")
	}
	if md := rep.Markdown(); !strings.Contains(md, "### TLS: the cost of terminating TLS 1.3") {
		t.Error("the report has no TLS section")
	}

	svg, err := os.ReadFile(filepath.Join(out, "latency-200.svg"))
	if err != nil {
		t.Fatal(err)
	}
	checkSVG(t, svg, []string{"direct", "keyway"})
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// checkSVG checks that svg is well-formed XML with one polyline per target.
func checkSVG(t *testing.T, svg []byte, targets []string) {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(string(svg)))
	lines := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("plot is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != len(targets) {
		t.Errorf("plot has %d lines, want %d", lines, len(targets))
	}
	for _, n := range targets {
		if !strings.Contains(string(svg), ">"+n+"<") {
			t.Errorf("plot legend lacks %s", n)
		}
	}
}

func TestParseWrk(t *testing.T) {
	out := []byte("Running 10s test @ http://127.0.0.1:1/ingest\n  1 threads and 64 connections\n" +
		`WRKJSON {"requests":123456,"duration_us":10001000,"connect":0,"read":1,"write":0,"status":2,"timeout":3}` + "\n")
	s, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := wrkSummary{Requests: 123456, DurationUS: 10001000, Read: 1, Status: 2, Timeout: 3}
	if s != want {
		t.Errorf("parseWrk = %+v, want %+v", s, want)
	}
	if _, err := parseWrk([]byte("unable to connect to 127.0.0.1:1 Connection refused\n")); err == nil {
		t.Error("parseWrk of output without a summary: no error")
	}
}

func TestKeyIndex(t *testing.T) {
	for _, i := range []int{0, 7, 42, 9999, 123456} {
		if got, ok := keyIndex([]byte(keyName(i))); !ok || got != i {
			t.Errorf("keyIndex(%q) = %d, %v", keyName(i), got, ok)
		}
	}
	for _, k := range []string{"", "key-", "key-12a", "tenant-1", "KEY-00001"} {
		if _, ok := keyIndex([]byte(k)); ok {
			t.Errorf("keyIndex(%q) accepted", k)
		}
	}
}

func TestPercentileAndStat(t *testing.T) {
	var xs []time.Duration
	for i := 1; i <= 1000; i++ {
		xs = append(xs, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 500 * time.Millisecond, 99: 990 * time.Millisecond, 99.9: 999 * time.Millisecond, 100: time.Second} {
		if got := percentile(xs, p); got != want {
			t.Errorf("percentile(%v) = %v, want %v", p, got, want)
		}
	}
	if s := newStat([]float64{3, 1, 2, math.NaN()}); s == nil || *s != (Stat{Median: 2, Min: 1, Max: 3, N: 3}) {
		t.Errorf("newStat = %+v", s)
	}
	if s := newStat([]float64{4, 1}); s == nil || s.Median != 2.5 {
		t.Errorf("newStat even = %+v", s)
	}
	c := curve(xs)
	if len(c) == 0 || math.Abs(c[0].Percentile-50) > 1e-9 || math.Abs(c[len(c)-1].Percentile-99.99) > 1e-9 {
		t.Errorf("curve spans %v..%v, want 50..99.99", c[0].Percentile, c[len(c)-1].Percentile)
	}
}

// TestRatiosPerRound checks that ratios divide values of the same round
// and skip rounds where the other target's value is not positive.
func TestRatiosPerRound(t *testing.T) {
	tp := func(rps, cpu float64) *throughputRun {
		return &throughputRun{RPS: rps, CPUPerReqUS: cpu, Routing: routing{Balance: 1}}
	}
	add := func(v float64) *float64 { return &v }
	rep := &Report{Config: Config{Rates: []int{100}, Rounds: 2}}
	rep.Runs = []TargetRun{
		{Round: 1, Target: "keyway", Throughput: tp(200, 10), Latency: []latencyRun{{Rate: 100, P50: 0.3, AddedP50: add(0.2), AddedP99: add(1)}}},
		{Round: 1, Target: "haproxy", Throughput: tp(100, 20), Latency: []latencyRun{{Rate: 100, P50: 0.2, AddedP50: add(0.1), AddedP99: add(-1)}}},
		{Round: 2, Target: "keyway", Throughput: tp(300, 10), Latency: []latencyRun{{Rate: 100, P50: 0.3, AddedP50: add(0.2), AddedP99: add(1)}}},
		{Round: 2, Target: "haproxy", Throughput: tp(100, 10), Latency: []latencyRun{{Rate: 100, P50: 0.3, AddedP50: add(0.2), AddedP99: add(2)}}},
	}
	rows := rep.ratios([]string{"keyway", "haproxy"})
	get := func(metric string) *Stat {
		for _, r := range rows {
			if strings.HasPrefix(r.Metric, metric) {
				return r.Vs["haproxy"]
			}
		}
		t.Fatalf("no ratio row %q", metric)
		return nil
	}
	if s := get("throughput"); s.Median != 2.5 || s.Min != 2 || s.Max != 3 {
		t.Errorf("throughput ratio = %+v, want median 2.5 of 2 and 3", s)
	}
	if s := get("proxy CPU"); s.Median != 0.75 {
		t.Errorf("CPU ratio = %+v, want median 0.75", s)
	}
	if s := get("added p99"); s.N != 1 || s.Median != 0.5 {
		t.Errorf("added p99 ratio = %+v, want only round 2 (0.5)", s)
	}
}

func TestParsePerfStat(t *testing.T) {
	out := "# started on Sat Nov 29 09:00:00 2026\n\n" +
		"973601,,raw_syscalls:sys_enter,10001,100.00,,\n" +
		"616000,,syscalls:sys_enter_read,10001,100.00,,\n" +
		"<not counted>,,syscalls:sys_enter_sendto,0,0.00,,\n"
	got, err := parsePerfStat(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["all"] != 973601 || got["read"] != 616000 {
		t.Errorf("parsePerfStat = %v", got)
	}
	if _, err := parsePerfStat("Error: No permissions to trace\n"); err == nil {
		t.Error("parsePerfStat without counts: no error")
	}
}

// latAt is a latency run at rate with the given proxy CPU per request (nil
// for direct) and achieved rate.
func latAt(rate int, cpu *float64, achieved float64) latencyRun {
	l := latencyRun{Rate: rate, P50: 0.5, P99: 1, Requests: 1000, Answered: 1000, AchievedRate: achieved, SendLagP99: 0.2}
	if cpu != nil {
		// As setCPU would over 1 s: 1000 answers at cpu µs each.
		l.CPUSeconds, l.CPUUtil, l.CPUPerReqUS = f64(*cpu*1e-3), f64(*cpu*1e-3), f64(*cpu)
	}
	return l
}

func f64(v float64) *float64 { return &v }

// TestLatencyCPUSummaryAndRatios checks the proxy CPU per request at each
// fixed rate: its summary per target (median and range over rounds, none
// for direct), its per-round ratio rows, and the flag on a round whose
// load side did not hold the rate.
func TestLatencyCPUSummaryAndRatios(t *testing.T) {
	rep := &Report{Config: Config{Rates: []int{1000, 3000}, Rounds: 3}}
	// keyway ÷ haproxy at 1000/s: 20/10, 30/10, 12/12 → median 2; at
	// 3000/s: 9/10, 8/10, 10/5 → median 0.9. haproxy's round 3 at 3000/s
	// was sent at 2900/s, under 97%.
	kw1, kw3 := []float64{20, 30, 12}, []float64{9, 8, 10}
	hp1, hp3 := []float64{10, 10, 12}, []float64{10, 10, 5}
	for round := 1; round <= 3; round++ {
		i := round - 1
		hpSent := 3000.0
		if round == 3 {
			hpSent = 2900
		}
		rep.Runs = append(rep.Runs,
			TargetRun{Round: round, Target: "direct", Latency: []latencyRun{latAt(1000, nil, 1000), latAt(3000, nil, 3000)}},
			TargetRun{Round: round, Target: "keyway", Latency: []latencyRun{latAt(1000, &kw1[i], 1000), latAt(3000, &kw3[i], 2991)}},
			TargetRun{Round: round, Target: "haproxy", Latency: []latencyRun{latAt(1000, &hp1[i], 1000), latAt(3000, &hp3[i], hpSent)}},
		)
	}
	rep.summarise()

	sums := map[string]TargetSummary{}
	for _, s := range rep.Summary {
		sums[s.Target] = s
	}
	kw := sums["keyway"].Latency
	if len(kw) != 2 {
		t.Fatalf("keyway has %d latency summaries, want 2", len(kw))
	}
	if s := kw[0].CPUPerReqUS; s == nil || *s != (Stat{Median: 20, Min: 12, Max: 30, N: 3}) {
		t.Errorf("keyway CPU µs/req at 1000/s = %+v, want median 20 of 12..30", s)
	}
	if s := kw[1].CPUUtil; s == nil || math.Abs(s.Median-0.009) > 1e-12 {
		t.Errorf("keyway CPU util at 3000/s = %+v, want 0.009 (9 µs × 1000 requests in 1 s)", s)
	}
	if len(kw[1].UnderRate) != 0 {
		t.Errorf("keyway at 3000/s sent 2991/s, flagged under rate in rounds %v", kw[1].UnderRate)
	}
	if hp := sums["haproxy"].Latency; len(hp) != 2 || !slices.Equal(hp[1].UnderRate, []int{3}) || len(hp[0].UnderRate) != 0 {
		t.Errorf("haproxy under-rate rounds = %+v, want [3] at 3000/s only", hp)
	}
	for _, l := range sums["direct"].Latency {
		if l.CPUPerReqUS != nil || l.CPUUtil != nil {
			t.Errorf("direct at %d/s has proxy CPU figures %+v, %+v", l.Rate, l.CPUPerReqUS, l.CPUUtil)
		}
	}

	row := func(metric string) RatioRow {
		for _, r := range rep.Ratios {
			if r.Metric == metric {
				return r
			}
		}
		t.Fatalf("no ratio row %q in %+v", metric, rep.Ratios)
		return RatioRow{}
	}
	r1 := row("proxy CPU µs per request at 1000/s")
	if s := r1.Vs["haproxy"]; r1.Better != "lower" || s == nil || s.Median != 2 || s.Min != 1 || s.Max != 3 || s.N != 3 {
		t.Errorf("CPU ratio at 1000/s = %+v (better %s), want median 2 of 1..3, lower", s, r1.Better)
	}
	if _, ok := r1.Vs["direct"]; ok || r1.Note != "" {
		t.Errorf("CPU ratio at 1000/s: vs direct %v, note %q; want neither", r1.Vs["direct"], r1.Note)
	}
	r3 := row("proxy CPU µs per request at 3000/s")
	if s := r3.Vs["haproxy"]; s == nil || math.Abs(s.Median-0.9) > 1e-12 || s.N != 3 {
		t.Errorf("CPU ratio at 3000/s = %+v, want median 0.9 over 3 rounds", s)
	}
	if !strings.Contains(r3.Note, "haproxy: 1 of 3 ratio(s) include a run whose load side sent under 97% of 3000/s") {
		t.Errorf("CPU ratio at 3000/s note = %q, want the under-rate round counted", r3.Note)
	}
	if p99 := row("p99 latency at 3000/s"); !strings.Contains(p99.Note, "under 97%") {
		t.Errorf("p99 ratio at 3000/s note = %q, want the under-rate round counted", p99.Note)
	}
	row("proxy CPU µs per request, saturated (throughput run)")

	md := rep.Markdown()
	for _, want := range []string{
		"| target | p50 | p99 | p99.9 | max | added p50 | added p99 | proxy CPU µs/req | errors |",
		"| keyway | 0.500 (0.500–0.500) | 1.000 (1.000–1.000) | 0.000 (0.000–0.000) | 0.00 (0.00–0.00) | 0.000 (0.000–0.000) | 0.000 (0.000–0.000) | 20.0 (12.0–30.0) | 0 |",
		"| direct | 0.500 (0.500–0.500) | 1.000 (1.000–1.000) | 0.000 (0.000–0.000) | 0.00 (0.00–0.00) | — | — | — | 0 |",
		"| haproxy | 0.500 (0.500–0.500) | 1.000 (1.000–1.000) | 0.000 (0.000–0.000) | 0.00 (0.00–0.00) | 0.000 (0.000–0.000) | 0.000 (0.000–0.000) | 10.0 (5.0–10.0) **(under rate)** | 0 |",
		"**Under rate: haproxy at 3000/s**, round(s) 3: the load generator sent less than 97% of the requested rate (sent 3000 (2900–3000) req/s",
		"| proxy CPU µs per request at 3000/s | lower | — | 0.90 (0.80–2.00) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Count(md, "**Under rate:") != 1 {
		t.Errorf("markdown has %d under-rate notes, want 1:\n%s", strings.Count(md, "**Under rate:"), md)
	}
}

func TestUnderRate(t *testing.T) {
	for _, c := range []struct {
		rate     int
		achieved float64
		want     bool
	}{
		{3000, 2910, false}, // exactly 97%
		{3000, 2909, true},
		{3000, 3001, false},
		{1000, 500, true},
		{1000, 0, false}, // not recorded (an older report)
	} {
		l := latencyRun{Rate: c.rate, AchievedRate: c.achieved}
		if got := l.underRate(); got != c.want {
			t.Errorf("%v/s sent at %v/s: underRate = %v, want %v", c.rate, c.achieved, got, c.want)
		}
	}
}

func TestLatencySetCPU(t *testing.T) {
	l := latencyRun{Answered: 2000}
	l.setCPU(0.05, 2)
	if l.CPUSeconds == nil || *l.CPUSeconds != 0.05 || l.CPUUtil == nil || *l.CPUUtil != 0.025 || l.CPUPerReqUS == nil || math.Abs(*l.CPUPerReqUS-25) > 1e-9 {
		t.Errorf("setCPU(0.05 s, 2 s) over 2000 answers = %v s, %v cores, %v µs/req; want 0.05, 0.025, 25", l.CPUSeconds, l.CPUUtil, l.CPUPerReqUS)
	}
	none := latencyRun{}
	none.setCPU(0.05, 2)
	if none.CPUPerReqUS != nil {
		t.Errorf("setCPU with no answered request gives %v µs/req, want none", *none.CPUPerReqUS)
	}
}

// The syscall tables: one at saturation and one per fixed rate, with the
// context switches perf stat counts alongside (a software event, kept
// under its own name), per request; a name no target makes at least
// 0.05 of gets no column.
func TestSyscallTables(t *testing.T) {
	counts, err := parsePerfStat("600,,raw_syscalls:sys_enter,1,100.00,,\n" +
		"300,,syscalls:sys_enter_read,1,100.00,,\n" +
		"90,,context-switches,1,100.00,,\n" +
		"0,,syscalls:sys_enter_futex,1,100.00,,\n")
	if err != nil {
		t.Fatal(err)
	}
	per, err := perRequest(counts, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{"all": 6, "read": 3, "context-switches": 0.9}; !maps.Equal(per, want) {
		t.Fatalf("perRequest = %v, want %v", per, want)
	}
	if _, err := perRequest(counts, 0); err == nil {
		t.Fatal("perRequest of no requests: no error")
	}
	r := &Report{Summary: []TargetSummary{
		{Target: "keyway", Syscalls: map[string]float64{"all": 6.04, "read": 3}, SyscallsAtRate: map[int]map[string]float64{
			3000: per, 1000: {"all": 9.6, "epoll_pwait": 3.5, "context-switches": 1.7},
		}},
		{Target: "haproxy", Syscalls: map[string]float64{"all": 4.8, "recvfrom": 2, "futex": 0.01}},
	}}
	var b strings.Builder
	r.syscallTable(&b)
	md := b.String()
	for _, want := range []string{
		"### System calls per request (perf stat, extra run in the last round)\n\n| target | all | read | recvfrom |\n|---|---|---|---|\n| keyway | 6.04 | 3.00 | 0.00 |\n| haproxy | 4.80 | 0.00 | 2.00 |\n",
		"### System calls per request at 1000/s (perf stat, extra open-loop run in the last round)\n\n| target | all | epoll_pwait | context-switches |\n|---|---|---|---|\n| keyway | 9.60 | 3.50 | 1.70 |\n",
		"### System calls per request at 3000/s (perf stat, extra open-loop run in the last round)\n\n| target | all | read | context-switches |\n|---|---|---|---|\n| keyway | 6.00 | 3.00 | 0.90 |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("syscall tables lack\n%s\nin\n%s", want, md)
		}
	}
	if i, j := strings.Index(md, "at 1000/s"), strings.Index(md, "at 3000/s"); i < 0 || j < i {
		t.Errorf("the per-rate tables are not in rate order:\n%s", md)
	}
	if strings.Contains(md, "futex") {
		t.Errorf("a column for futex, which no target makes 0.05 of:\n%s", md)
	}
}
