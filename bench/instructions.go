package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The instruction-count mode (-instructions N): each proxy of -targets
// runs under valgrind's cachegrind (instruction counting only, no cache
// simulation), twice on fresh processes: once for a short load, once for
// the same load plus N requests. The difference of the two counts ÷ N is
// the instructions the proxy executes per request, and the same
// difference per function says where they go.
//
// Instruction counts are the one figure of a proxy's work this machine
// repeats exactly: they do not depend on what else runs, on caches or on
// the clock (valgrind counts what the program executes, on a simulated
// CPU). They are not time: a request that finds its caches cold costs
// more time for the same instructions, and the kernel's part (system
// calls, the TCP work on loopback) is not counted at all. They show what
// a change to the request path adds or removes, where the timed runs
// move ±15% on this machine.
//
// The load is the harness's own (POST /ingest, X-Key uniform over the
// keys), open loop at instrRate req/s from CPU 1: valgrind runs the proxy
// many times slower, and at this rate it still idles between requests,
// as at a moderate rate. Everything the proxy does in the extra seconds
// of the longer run counts, its background work included (a Go
// runtime's monitor thread, keyway's health probes), as in the CPU per
// request of a fixed-rate run.
const (
	instrRate   = 200
	instrWarmup = 400 // requests of the short run (at most N); the long run sends these plus N
)

// InstrSummary is one target's instructions per request.
type InstrSummary struct {
	Target     string  `json:"target"`
	PerRequest float64 `json:"instructions_per_request"`
	Requests   int64   `json:"requests"` // the difference between the two runs' answered requests
	// Functions are the functions executing the most instructions per
	// request, most first.
	Functions []FnCost `json:"functions,omitempty"`
	// All has every function's instructions per request (for the
	// comparison between targets); not written out.
	all     map[string]float64
	Failure string `json:"failure,omitempty"`
}

// FnCost is one function's instructions per request.
type FnCost struct {
	Fn         string  `json:"fn"`
	PerRequest float64 `json:"instructions_per_request"`
}

// measureInstructions runs the instruction-count mode for every proxy
// target.
func (h *Harness) measureInstructions(ctx context.Context) []InstrSummary {
	var out []InstrSummary
	for _, t := range h.targets {
		if t.config == nil {
			continue // direct: no proxy
		}
		s := InstrSummary{Target: t.name}
		var runs [2]instrRun
		var err error
		warm := min(instrWarmup, h.cfg.Instructions)
		for i, n := range []int{warm, warm + h.cfg.Instructions} {
			if runs[i], err = h.instrRun(ctx, t, n, i); err != nil {
				break
			}
		}
		if err == nil && runs[1].answered <= runs[0].answered {
			err = fmt.Errorf("the longer run answered %d requests, the shorter %d", runs[1].answered, runs[0].answered)
		}
		if err != nil {
			s.Failure = err.Error()
			h.logf("%s: instruction count failed: %v", t.name, err)
			out = append(out, s)
			continue
		}
		s.Requests = runs[1].answered - runs[0].answered
		n := float64(s.Requests)
		s.PerRequest = float64(runs[1].total-runs[0].total) / n
		s.all = map[string]float64{}
		for fn, c := range runs[1].byFn {
			if d := float64(c-runs[0].byFn[fn]) / n; d != 0 {
				s.all[fn] = d
			}
		}
		for fn, c := range runs[0].byFn {
			if _, ok := runs[1].byFn[fn]; !ok {
				s.all[fn] = -float64(c) / n
			}
		}
		for fn, c := range s.all {
			s.Functions = append(s.Functions, FnCost{Fn: fn, PerRequest: c})
		}
		slices.SortFunc(s.Functions, func(a, b FnCost) int {
			if a.PerRequest != b.PerRequest {
				if a.PerRequest > b.PerRequest {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Fn, b.Fn)
		})
		s.Functions = s.Functions[:min(len(s.Functions), 40)]
		h.logf("%s: %.0f instructions per request (%d requests)", t.name, s.PerRequest, s.Requests)
		out = append(out, s)
	}
	return out
}

// instrRun is one target under cachegrind for one load.
type instrRun struct {
	answered int64
	total    int64
	byFn     map[string]int64
}

// instrRun starts t under cachegrind, sends it n requests at instrRate,
// stops it and reads its counts.
func (h *Harness) instrRun(ctx context.Context, t *target, n, i int) (instrRun, error) {
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		return instrRun{}, errors.New("valgrind not installed (apt-get install -y valgrind)")
	}
	out := filepath.Join(h.dir, fmt.Sprintf("cachegrind-%s-%d", dirName(t.name), i))
	if err := os.MkdirAll(out, 0o755); err != nil {
		return instrRun{}, err
	}
	vt := *t
	vt.bin = vg
	vt.config = func(dir string, port int, e *targetEnv) ([]string, error) {
		args, err := t.config(dir, port, e)
		// --trace-children follows nginx's worker and keyway's re-exec
		// of itself (for the monitor thread); every process writes its
		// own file.
		return append([]string{"--tool=cachegrind", "--cache-sim=no", "--trace-children=yes",
			"--cachegrind-out-file=" + filepath.Join(out, "cg.%p"), t.bin}, args...), err
	}
	// Go's asynchronous preemption signals confuse valgrind's signal
	// handling; a Go proxy runs as well without them here (one P, short
	// handlers).
	vt.env = withGodebug(t.env, "asyncpreemptoff=1")
	rt, err := h.start(ctx, &vt, 2048, nil)
	if err != nil {
		return instrRun{}, err
	}
	client := newHTTPClient(4, loadSpec{})
	res := attack(ctx, client, keyTargeter(loadSpec{}.url(rt.addr), h.cfg.Keys, h.cfg.Body, uint64(1000+i)),
		instrRate, 4, time.Duration(n)*time.Second/instrRate, false)
	client.CloseIdleConnections()
	rt.stop()
	if err := ctx.Err(); err != nil {
		return instrRun{}, err
	}
	if res.errors > 0 {
		return instrRun{}, fmt.Errorf("%d of %d requests failed under valgrind (first: %s)", res.errors, res.requests, res.firstErr)
	}
	r := instrRun{answered: res.answered, byFn: map[string]int64{}}
	files, _ := filepath.Glob(filepath.Join(out, "cg.*"))
	if len(files) == 0 {
		return instrRun{}, fmt.Errorf("cachegrind wrote no output in %s:\n%s", out, rt.p.tail(1500))
	}
	for _, f := range files {
		if err := readCachegrind(f, r.byFn, &r.total); err != nil {
			return instrRun{}, err
		}
	}
	return r, nil
}

// readCachegrind adds the instruction counts of a cachegrind output file
// (events: Ir) to byFn, by function, and to total.
func readCachegrind(path string, byFn map[string]int64, total *int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	fn := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "fn="):
			fn = line[3:]
		case line == "" || line[0] < '0' || line[0] > '9':
			// desc:, cmd:, events:, fl=, summary: and the like.
		default:
			_, count, ok := strings.Cut(line, " ")
			if !ok {
				return fmt.Errorf("%s: line %q: want \"LINE COUNT\"", path, line)
			}
			n, err := strconv.ParseInt(strings.TrimSpace(count), 10, 64)
			if err != nil {
				return fmt.Errorf("%s: line %q: %w", path, line, err)
			}
			byFn[fn] += n
			*total += n
		}
	}
	return sc.Err()
}

// instrMarkdown renders the instruction-count mode's tables.
func (r *Report) instrMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "### Instructions per request (valgrind cachegrind, %d requests at %d req/s: the difference of two runs)\n\n", r.Config.Instructions, instrRate)
	b.WriteString("| target | instructions per request | requests |\n|---|---|---|\n")
	var base *InstrSummary
	for i := range r.Instr {
		s := &r.Instr[i]
		if s.Failure != "" {
			fmt.Fprintf(b, "| %s | **failed**: %s | — |\n", s.Target, s.Failure)
			continue
		}
		fmt.Fprintf(b, "| %s | %.0f | %d |\n", s.Target, s.PerRequest, s.Requests)
		if s.Target == "gofloor" {
			base = s
		}
	}
	for _, s := range r.Instr {
		if s.Failure != "" || len(s.Functions) == 0 {
			continue
		}
		fmt.Fprintf(b, "\n#### %s: the functions executing the most instructions per request\n\n", s.Target)
		cmp := base != nil && s.Target != "gofloor"
		if cmp {
			b.WriteString("| function | per request | gofloor's |\n|---|---|---|\n")
		} else {
			b.WriteString("| function | per request |\n|---|---|\n")
		}
		for _, f := range s.Functions[:min(len(s.Functions), 25)] {
			if cmp {
				fmt.Fprintf(b, "| `%s` | %.0f | %.0f |\n", f.Fn, f.PerRequest, base.all[f.Fn])
			} else {
				fmt.Fprintf(b, "| `%s` | %.0f |\n", f.Fn, f.PerRequest)
			}
		}
	}
	b.WriteString("\nPer function, the count is the function's own instructions (inlined callees included, callees not inlined excluded); how the compiler inlined differs between binaries, so compare totals between targets, and functions within one.\n\n")
}

// withGodebug is env with setting added to its GODEBUG (one variable: of
// two, the process would see only the last).
func withGodebug(env []string, setting string) []string {
	out := slices.Clone(env)
	for i, kv := range out {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			out[i] = "GODEBUG=" + v + "," + setting
			return out
		}
	}
	return append(out, "GODEBUG="+setting)
}
