package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"keyway/config"
	"keyway/internal/slow"
)

func TestParseCasesAndValidate(t *testing.T) {
	if got := parseCases("all"); !slices.Equal(got, restartCaseNames) {
		t.Errorf("all: %v", got)
	}
	if got := parseCases(" upgrade, sigterm-start,upgrade,,activated"); !slices.Equal(got, []string{"sigterm-start", "activated", "upgrade"}) {
		t.Errorf("got %v, want the known order without duplicates", got)
	}
	ok := RestartConfig{Cases: restartCaseNames, Rate: 1000, Conns: 64, Before: 2 * time.Second, After: 3 * time.Second, Timeout: 5 * time.Second,
		DrainIdle: 5 * time.Second, ExitDrainIdles: []time.Duration{5 * time.Second, time.Second}, ShutdownTimeout: 30 * time.Second, Retry: 10 * time.Millisecond}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for name, modify := range map[string]func(*RestartConfig){
		"no rate":           func(c *RestartConfig) { c.Rate = 0 },
		"no connection":     func(c *RestartConfig) { c.Conns = 0 },
		"unknown case":      func(c *RestartConfig) { c.Cases = []string{"reboot"} },
		"no case":           func(c *RestartConfig) { c.Cases = nil },
		"drain too long":    func(c *RestartConfig) { c.DrainIdle = 11 * time.Minute },
		"exit without idle": func(c *RestartConfig) { c.ExitDrainIdles = nil },
		"shutdown too soon": func(c *RestartConfig) { c.ShutdownTimeout = time.Millisecond },
		"no retry":          func(c *RestartConfig) { c.Retry = 0 },
	} {
		c := ok
		modify(&c)
		if err := c.validate(); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
	if ds, err := parseDurations("-x", "5s, 1s,"); err != nil || !slices.Equal(ds, []time.Duration{5 * time.Second, time.Second}) {
		t.Errorf("parseDurations: %v, %v", ds, err)
	}
	if _, err := parseDurations("-x", "5"); err == nil {
		t.Error("a duration without unit parsed")
	}
}

func TestRestartCases(t *testing.T) {
	kw, hap := &target{name: "keyway"}, &target{name: "haproxy"}
	c := RestartConfig{Cases: []string{"upgrade", "sigterm-exit", "haproxy-reload", "haproxy-reload-idle-close"},
		DrainIdle: 5 * time.Second, ExitDrainIdles: []time.Duration{5 * time.Second, time.Second}}
	cases, notes := restartCases(c, []*target{kw, hap})
	var got []string
	for _, rc := range cases {
		got = append(got, fmt.Sprintf("%s/%s/%s/%v/%v", rc.name, rc.kind, rc.target.name, rc.drainIdle, rc.idleClose))
	}
	want := []string{"upgrade/upgrade/keyway/5s/false", "sigterm-exit drain_idle=5s/sigterm-exit/keyway/5s/false", "sigterm-exit drain_idle=1s/sigterm-exit/keyway/1s/false",
		"haproxy-reload/haproxy-reload/haproxy/0s/false", "haproxy-reload-idle-close/haproxy-reload/haproxy/0s/true"}
	if !slices.Equal(got, want) || len(notes) != 0 {
		t.Errorf("got %v (notes %v), want %v", got, notes, want)
	}
	cases, notes = restartCases(c, []*target{kw})
	if len(cases) != 3 || len(notes) != 2 {
		t.Errorf("without haproxy: %d cases, notes %v", len(cases), notes)
	}
}

func TestCountOutcomes(t *testing.T) {
	ms := time.Millisecond
	var outs []reqOutcome
	for i := range 100 {
		outs = append(outs, reqOutcome{Due: time.Duration(i) * ms, Latency: time.Duration(i%10+1) * ms, Status: 200})
	}
	outs[10] = reqOutcome{Due: 10 * ms, Latency: ms, Class: classEOF, Err: "EOF", Reused: true, Wrote: true}
	outs[60] = reqOutcome{Due: 60 * ms, Latency: 2 * ms, Class: classRefused, Err: "connection refused"}
	outs[70] = reqOutcome{Due: 70 * ms, Latency: 3 * ms, Status: 503}
	outs[80] = reqOutcome{Due: 80 * ms, Latency: 5 * time.Second, Class: classTimeout, Lag: 4 * ms}
	var run RestartRun
	countOutcomes(&run, outs, 50*ms)
	if run.Sent != 100 || run.OK != 96 || run.Failed != 4 || run.FailedBefore != 1 {
		t.Errorf("sent %d ok %d failed %d before %d", run.Sent, run.OK, run.Failed, run.FailedBefore)
	}
	if fmt.Sprint(run.Errors) != "map[eof:1 refused:1 timeout:1]" || fmt.Sprint(run.NonOK) != "map[503:1]" {
		t.Errorf("errors %v, non-2xx %v", run.Errors, run.NonOK)
	}
	if *run.FirstFailMs != -40 || *run.LastFailMs != 30 || run.SendLagMaxMs != 4 {
		t.Errorf("failures sent %v … %v ms, lag %v", *run.FirstFailMs, *run.LastFailMs, run.SendLagMaxMs)
	}
	if len(run.Failures) != 4 || run.Failures[0] != (restartFailure{SentMs: -40, DoneMs: -39, Class: classEOF, Reused: true, Wrote: true, Error: "EOF"}) ||
		run.Failures[2].Class != "status" || run.Failures[2].Status != 503 {
		t.Errorf("failures %+v", run.Failures)
	}
	// 96 answers: latency 1 ms six times (the failures took four), 2..10 ms ten
	// times each: the 48th is 6 ms; p99 and max 10 ms.
	if run.P50Ms != 6 || run.P99Ms != 10 || run.MaxMs != 10 {
		t.Errorf("p50 %v p99 %v max %v", run.P50Ms, run.P99Ms, run.MaxMs)
	}

	// Each class lists at most maxFailuresListed failures; all count.
	outs = nil
	for i := range 3 * maxFailuresListed {
		cl := classRefused
		if i%3 == 0 {
			cl = classEOF
		}
		outs = append(outs, reqOutcome{Due: time.Duration(i) * ms, Class: cl})
	}
	countOutcomes(&run, outs, 0)
	if run.Failed != 3*maxFailuresListed || len(run.Failures) != 2*maxFailuresListed || run.Errors[classEOF] != maxFailuresListed {
		t.Errorf("failed %d, listed %d, eof %d", run.Failed, len(run.Failures), run.Errors[classEOF])
	}
}

func TestSummariseRestarts(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	yes, no := true, false
	runs := []RestartRun{
		{Round: 1, Case: "upgrade", Target: "keyway", Sent: 5000, OK: 5000, ReadyMs: f(10), OldExitMs: f(90), StartAfterExitMs: f(-80), OldExited: &yes, ListenOverflows: 0},
		{Round: 1, Case: "sigterm-exit drain_idle=1s", Target: "keyway", Sent: 2000, OK: 1990, Failed: 10, Errors: map[string]int{classRefused: 10}, OldExitMs: f(70), OldExited: &yes},
		{Round: 1, Case: "sigterm-exit drain_idle=5s", Target: "keyway", Sent: 2000, OK: 2000, OldExitMs: f(5000), OldExited: &yes},
		{Round: 2, Case: "upgrade", Target: "keyway", Sent: 5010, OK: 5008, Failed: 2, Errors: map[string]int{classEOF: 2}, ReadyMs: f(14), OldExitMs: f(95), OldExited: &no, ListenOverflows: 3},
		{Round: 3, Case: "upgrade", Target: "keyway", Failure: "keyway did not start"},
		{Round: 1, Case: "wait-start", Target: "keyway", Sent: 5000, OK: 4980, Failed: 20, Errors: map[string]int{classRefused: 20}},
	}
	sum := summariseRestarts(runs)
	var names []string
	for _, s := range sum {
		names = append(names, s.Case)
	}
	if want := []string{"wait-start", "upgrade", "sigterm-exit drain_idle=5s", "sigterm-exit drain_idle=1s"}; !slices.Equal(names, want) {
		t.Fatalf("cases %v, want %v", names, want)
	}
	up := sum[1]
	if up.Rounds != 2 || len(up.Failures) != 1 || up.OldExited != 1 || up.OldExitWatched != 2 {
		t.Errorf("upgrade: %d rounds, failures %v, exited %d of %d", up.Rounds, up.Failures, up.OldExited, up.OldExitWatched)
	}
	if e := up.Errors[classEOF]; e == nil || e.Min != 0 || e.Max != 2 || up.Failed.Max != 2 || up.ReadyMs.Min != 10 || up.ReadyMs.Max != 14 {
		t.Errorf("upgrade: eof %+v, failed %+v, ready %+v", e, up.Failed, up.ReadyMs)
	}
	if up.ListenOverflows.Max != 3 || up.Sent.Min != 5000 || up.Sent.Max != 5010 {
		t.Errorf("upgrade: overflows %+v, sent %+v", up.ListenOverflows, up.Sent)
	}
	rep := &Report{Config: Config{Restarts: true, Rounds: 3, Restart: &RestartConfig{Rate: 1000, Conns: 64, DrainIdle: 5 * time.Second, ShutdownTimeout: 30 * time.Second}},
		RestartRuns: runs, RestartSummary: sum}
	md := rep.Markdown()
	for _, want := range []string{
		"| upgrade | 2 | 5000–5010 | 5000–5008 | **0–2** | — | — | 0–2 | — | — | — | 10–14 | 90–95 | -80 | 1 of 2 **(1 round(s) failed)** |",
		"| upgrade | 3 | **failed**: keyway did not start",
		"upgrade round 3: keyway did not start",
		"| sigterm-exit drain_idle=1s | 1 | 2000 | 1990 | **10** | 10 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestFailureDigestAndMM(t *testing.T) {
	d := failureDigest([]restartFailure{
		{SentMs: 31.8, DoneMs: 34.9, Class: classEOF, Reused: true, Wrote: true, Error: "EOF"},
		{SentMs: 60, DoneMs: 61, Class: classRefused, Error: "dial: connection refused"},
		{SentMs: 33.2, DoneMs: 35.1, Class: classEOF, Reused: true, Error: "EOF"},
		{SentMs: 40, DoneMs: 41, Class: "status", Status: 503},
	})
	want := []string{
		"eof × 2, sent +32 … +33, failed +35 … +35; 2 reused, 1 written; e.g. `EOF`",
		"refused × 1, sent +60 … +60, failed +61 … +61; 0 reused, 0 written; e.g. `dial: connection refused`",
		"status 503 × 1, sent +40 … +40, failed +41 … +41; 0 reused, 0 written",
	}
	if !slices.Equal(d, want) {
		t.Errorf("digest:\n%s\nwant:\n%s", strings.Join(d, "\n"), strings.Join(want, "\n"))
	}
	for _, c := range []struct {
		s    *Stat
		want string
	}{{nil, "—"}, {&Stat{Min: 3, Max: 3}, "3"}, {&Stat{Min: 2, Max: 7.4}, "2–7"}, {&Stat{Min: -0.3, Max: -0.2}, "0"}} {
		if got := mm(c.s, "%.0f"); got != c.want {
			t.Errorf("mm(%+v) = %q, want %q", c.s, got, c.want)
		}
	}
}

func TestParseNetstat(t *testing.T) {
	text := "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPHPHits\n" +
		"TcpExt: 0 19607 19610 12\n" +
		"IpExt: InNoRoutes ListenOverflows\n" +
		"IpExt: 1 99\n"
	m := parseNetstat(text, "TcpExt")
	if m["ListenOverflows"] != 19607 || m["ListenDrops"] != 19610 || m["TCPHPHits"] != 12 || len(m) != 4 {
		t.Errorf("TcpExt: %v", m)
	}
	if m := parseNetstat(text, "IpExt"); m["ListenOverflows"] != 99 {
		t.Errorf("IpExt: %v", m)
	}
	if _, err := os.Stat("/proc/net/netstat"); err == nil {
		if _, _, err := listenCounters(); err != nil {
			t.Error(err)
		}
	}
}

// TestActivationCommand: the process started as systemd would start it
// has LISTEN_PID equal to its own PID (the shell execs it), LISTEN_FDS=1,
// the names, and the harness's socket as fd 3.
func TestActivationCommand(t *testing.T) {
	argv, env := activationCommand("/usr/bin/keyway", []string{"proxy", "-c", "k.yaml"}, 1, "proxy")
	if want := []string{"/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, "/usr/bin/keyway", "proxy", "-c", "k.yaml"}; !slices.Equal(argv, want) {
		t.Errorf("argv %q, want %q", argv, want)
	}
	if !slices.Equal(env, []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=proxy"}) {
		t.Errorf("env %q", env)
	}
	skipOffLinux(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	// The "binary" is a shell printing what keyway would read.
	argv, env = activationCommand("/bin/sh", []string{"-c", `echo "$LISTEN_PID $$ $LISTEN_FDS $LISTEN_FDNAMES $(readlink /proc/$$/fd/3)"`}, 1, "proxy")
	dir := t.TempDir()
	p, err := startProcFiles("activated", dir, -1, env, []*os.File{f}, argv...)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.stop(time.Second)
		t.Fatal("the shell did not exit")
	}
	got := strings.Fields(p.tail(500))
	pid := strconv.Itoa(p.pid())
	if len(got) != 5 || got[0] != pid || got[1] != pid || got[2] != "1" || got[3] != "proxy" || got[4] != want {
		t.Errorf("the process saw %q; want LISTEN_PID and $$ %s, 1, proxy, fd 3 = %s", got, pid, want)
	}
}

func TestLogWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.log")
	if err := os.WriteFile(path, []byte(`{"level":"info","ts":"2026-12-03T05:57:40.580Z","msg":"keyway starting"}`+"\n"+`{"level":"info","ts":"2026-12-03T05:57:40.5`), 0o644); err != nil {
		t.Fatal(err)
	}
	w := &logWatch{path: path}
	w.poll()
	if len(w.lines) != 1 {
		t.Fatalf("%d lines, want 1 (the second is not whole)", len(w.lines))
	}
	if at := w.lines[0].at(); !at.Equal(time.Date(2026, 12, 3, 5, 57, 40, 580e6, time.UTC)) {
		t.Errorf("at %v", at)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`81Z","msg":"proxy listening","addr":"127.0.0.1:1"}` + "\n[NOTICE]   (27292) : Loading success.\n")
	f.Close()
	l, err := waitLine(context.Background(), w, 0, listening, nil, time.Now().Add(5*time.Second))
	if err != nil || !l.at().Equal(time.Date(2026, 12, 3, 5, 57, 40, 581e6, time.UTC)) {
		t.Errorf("waitLine: %v, %v", l, err)
	}
	if l, _, ok := w.find(1, "Loading success."); !ok || !l.at().Equal(l.seen) {
		t.Errorf("a line without ts is timed when read: %+v", l)
	}
	exited := make(chan struct{})
	close(exited)
	if _, err := waitLine(context.Background(), w, 0, "never", exited, time.Now().Add(5*time.Second)); err != errProcExited {
		t.Errorf("waitLine after the exit: %v", err)
	}
}

// TestRestartConfigs: keyway's configuration in the restart mode loads
// with the case's drain and no admin listener; HAProxy's is valid (when
// HAProxy is installed), master-worker, with or without
// idle-close-on-response.
func TestRestartConfigs(t *testing.T) {
	dir := t.TempDir()
	e := &targetEnv{replicas: []string{"127.0.0.1:1", "127.0.0.1:2"}, maxConns: 100,
		restart: &restartTargetConfig{drainIdle: time.Second, shutdownTimeout: 30 * time.Second}}
	args, err := keywayConfig(dir, 8080, e)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(args[len(args)-1])
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.DrainIdle != time.Second || cfg.Server.ShutdownTimeout != 30*time.Second || cfg.Admin.Listen != "" || cfg.Log.Level != "info" {
		t.Errorf("drain_idle %v, shutdown_timeout %v, admin %q, log level %q", cfg.Server.DrainIdle, cfg.Server.ShutdownTimeout, cfg.Admin.Listen, cfg.Log.Level)
	}
	for _, idleClose := range []bool{false, true} {
		e := &targetEnv{replicas: []string{"127.0.0.1:1"}, maxConns: 100, restart: &restartTargetConfig{shutdownTimeout: 30 * time.Second, idleClose: idleClose}}
		d := filepath.Join(dir, strconv.FormatBool(idleClose))
		os.MkdirAll(d, 0o755)
		args, err := haproxyConfig(d, 8080, e)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(args[1])
		if !slices.Contains(args, "-W") || !strings.Contains(string(b), "hard-stop-after 30000ms") || strings.Contains(string(b), "idle-close-on-response") != idleClose {
			t.Errorf("idle close %v: args %v, config:\n%s", idleClose, args, b)
		}
		if hap, err := exec.LookPath("haproxy"); err == nil {
			if out, err := exec.Command(hap, "-c", "-f", args[1]).CombinedOutput(); err != nil {
				t.Errorf("haproxy -c: %v\n%s", err, out)
			}
		}
	}
}

// TestRestartsSmoke runs the mode's keyway cases once, briefly, with the
// real binary.
func TestRestartsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyway and runs load for about 20 seconds; skipped under -short")
	}
	slow.Skip(t)
	skipOffLinux(t)
	repo, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Duration: time.Second, Replicas: 2, Body: 256, Keys: 300, Rounds: 1, Connections: 1,
		Targets: []string{"keyway"}, LoadGen: "vegeta", Pin: false, Restarts: true,
		Restart: &RestartConfig{Cases: []string{"sigterm-start", "activated", "upgrade", "sighup", "sigterm-exit"}, Rate: 200, Conns: 8,
			Before: 500 * time.Millisecond, After: 500 * time.Millisecond, Timeout: 5 * time.Second, DrainIdle: time.Second,
			ExitDrainIdles: []time.Duration{time.Second}, ShutdownTimeout: 10 * time.Second, Retry: 10 * time.Millisecond, Warm: true},
		OutDir: t.TempDir(), Repo: repo, Keyway: testKeyway(t), Race: raceEnabled, Log: testLog{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Markdown())
	if len(rep.RestartRuns) != 5 || len(rep.RestartSummary) != 5 {
		t.Fatalf("%d runs, %d summaries; want 5", len(rep.RestartRuns), len(rep.RestartSummary))
	}
	for _, r := range rep.RestartRuns {
		if r.Failure != "" {
			t.Errorf("%s: %s", r.Case, r.Failure)
			continue
		}
		if r.Sent < 100 || r.OK == 0 {
			t.Errorf("%s: sent %d, 2xx %d", r.Case, r.Sent, r.OK)
		}
		switch r.Case {
		case "sighup":
			if r.ReadyMs == nil || r.OldExited != nil {
				t.Errorf("sighup: reloaded %v, old exited %v", r.ReadyMs, r.OldExited)
			}
		case "sigterm-exit drain_idle=1s":
			if r.OldExited == nil || !*r.OldExited || r.OldExitStatus != "exit 0" || r.ReadyMs != nil {
				t.Errorf("sigterm-exit: exited %v (%s), ready %v", r.OldExited, r.OldExitStatus, r.ReadyMs)
			}
		default:
			if r.ReadyMs == nil || r.OldExited == nil || !*r.OldExited || r.OldExitStatus != "exit 0" {
				t.Errorf("%s: ready %v, old exited %v (%s)", r.Case, r.ReadyMs, r.OldExited, r.OldExitStatus)
			}
		}
		if (r.Case == "activated" || r.Case == "upgrade") && r.Errors[classRefused] > 0 {
			t.Errorf("%s: %d connections refused, with the socket held throughout", r.Case, r.Errors[classRefused])
		}
	}
}
