package main

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the harness for a few seconds against keyway and direct
// with tiny settings, TLS mode included, and checks the numbers it writes.
// It needs only Go: the load comes from vegeta and the harness's own
// clients, so wrk, HAProxy, nginx and Caddy are not used even when
// installed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyway and runs load for a few seconds; skipped under -short")
	}
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
		LoadGen:         "vegeta",
		TLS:             true,
		Pin:             false, // never pin the test process
		OutDir:          out,
		Repo:            repo,
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
