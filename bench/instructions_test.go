package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/internal/slow"
)

func TestReadCachegrind(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cg.out")
	const out = `desc: I1 cache: none
cmd: /tmp/kw proxy -c kw.yaml
events: Ir
fl=/work/main/proxy/headers.go
fn=keyway/proxy.rawFields
127 10
134 90
fn=keyway/proxy.fieldOf
100 7
fl=/usr/local/go/src/runtime/memmove_amd64.s
fn=runtime.memmove
33 1000
fl=/work/main/proxy/headers.go
fn=keyway/proxy.rawFields
150 5
summary: 1112
`
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	byFn := map[string]int64{"runtime.memmove": 1}
	var total int64 = 1
	if err := readCachegrind(path, byFn, &total); err != nil {
		t.Fatal(err)
	}
	if total != 1113 || byFn["keyway/proxy.rawFields"] != 105 || byFn["keyway/proxy.fieldOf"] != 7 || byFn["runtime.memmove"] != 1001 {
		t.Errorf("total %d, by function %v", total, byFn)
	}
	if err := os.WriteFile(path, []byte("fn=x\n12 abc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readCachegrind(path, byFn, &total); err == nil || !strings.Contains(err.Error(), `"12 abc"`) {
		t.Errorf("a malformed count: %v", err)
	}
}

func TestWithGodebug(t *testing.T) {
	got := withGodebug([]string{"GOMAXPROCS=1", "GODEBUG=schedtrace=2147483647"}, "asyncpreemptoff=1")
	if want := []string{"GOMAXPROCS=1", "GODEBUG=schedtrace=2147483647,asyncpreemptoff=1"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := withGodebug([]string{"GOMAXPROCS=1"}, "asyncpreemptoff=1"); !slices.Equal(got, []string{"GOMAXPROCS=1", "GODEBUG=asyncpreemptoff=1"}) {
		t.Errorf("got %q", got)
	}
}

// TestInstructionsSmoke counts keyway's instructions per request under
// cachegrind (skipped without valgrind, which CI does not install).
func TestInstructionsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyway and runs it under valgrind; skipped under -short")
	}
	slow.Skip(t)
	skipOffLinux(t)
	if _, err := exec.LookPath("valgrind"); err != nil {
		t.Skip("valgrind not installed")
	}
	if raceEnabled {
		t.Skip("keyway built with -race does not run under valgrind")
	}
	repo, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Instructions: 100, Targets: []string{"direct", "keyway"}, Duration: time.Second, Connections: 1, Replicas: 3, Body: 256, Keys: 300,
		Rounds: 1, LoadGen: "vegeta", Pin: false, OutDir: t.TempDir(), Repo: repo, Keyway: testKeyway(t), Log: testLog{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	md := rep.Markdown()
	t.Log("\n" + md)
	if len(rep.Runs) != 0 || len(rep.Instr) != 1 {
		t.Fatalf("%d runs, %d instruction counts; want 0 and 1 (keyway; direct has no proxy)", len(rep.Runs), len(rep.Instr))
	}
	s := rep.Instr[0]
	if s.Failure != "" {
		t.Fatal(s.Failure)
	}
	// keyway executes tens of thousands of instructions per proxied
	// request; a count off by orders of magnitude means the difference
	// of the two runs is not what was measured.
	if s.Requests < 95 || s.Requests > 105 || s.PerRequest < 5e3 || s.PerRequest > 1e6 || len(s.Functions) == 0 {
		t.Errorf("%d requests, %.0f instructions each, %d functions", s.Requests, s.PerRequest, len(s.Functions))
	}
	if !slices.ContainsFunc(s.Functions, func(f FnCost) bool { return strings.HasPrefix(f.Fn, "keyway/proxy.") }) {
		t.Errorf("none of keyway's own functions among the top ones: %v", s.Functions)
	}
	if !strings.Contains(md, "instructions per request") {
		t.Error("the report has no instruction table")
	}
}
