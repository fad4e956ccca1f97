package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The paired mode (-pair A,B): two proxies run at once on the proxy's
// core, each in front of the same replicas and under its own open-loop
// load at the same fixed rate, and their CPU per request is read over the
// same seconds. Whatever else the machine does in those seconds (a
// neighbour on the host, a timer storm, frequency changes) falls on both,
// so the ratio A ÷ B of one round moves far less than the ratio of two
// targets measured one after the other: two copies of one build agree
// within a few per cent, where the interleaved runs of the full harness
// move ±15% on this machine. It is the instrument for changes of a few
// per cent, and for the moderate-rate goals against HAProxy. With
// -pair-alternate the two take turns instead (runAlternating): each is
// loaded alone, as in the full run, in short slices over the same seconds.
//
// A target is a name of -targets (not direct), or keyway@REV: keyway
// built from the git revision REV, so that two builds can be paired
// (keyway@HEAD,keyway@HEAD~1). Each round starts both on fresh processes
// (the one started first alternates) and measures each rate in turn.
//
// What pairing changes: the two proxies share one core, so when a
// request for one arrives while the other runs, it waits. That costs
// both alike, adds to both latencies, and leaves each proxy's CPU per
// request its own (the CPU time is the process's, not the wall clock).

// PairRun is one round at one rate of the paired mode.
type PairRun struct {
	Round   int        `json:"round"`
	Rate    int        `json:"rate"`
	First   string     `json:"started_first"`
	A       latencyRun `json:"a"`
	B       latencyRun `json:"b"`
	LoadAvg string     `json:"loadavg"`
	Failure string     `json:"failure,omitempty"`
}

// PairSummary is the paired mode at one rate over every round.
type PairSummary struct {
	Rate     int   `json:"rate"`
	ACPU     *Stat `json:"a_cpu_us_per_request,omitempty"`
	BCPU     *Stat `json:"b_cpu_us_per_request,omitempty"`
	ASys     *Stat `json:"a_sys_us_per_request,omitempty"`
	BSys     *Stat `json:"b_sys_us_per_request,omitempty"`
	CPURatio *Stat `json:"cpu_ratio,omitempty"` // A ÷ B per round
	AP50     *Stat `json:"a_p50_ms,omitempty"`
	BP50     *Stat `json:"b_p50_ms,omitempty"`
	P50Ratio *Stat `json:"p50_ratio,omitempty"` // A ÷ B per round
	AP99     *Stat `json:"a_p99_ms,omitempty"`
	BP99     *Stat `json:"b_p99_ms,omitempty"`
	// UnderRate counts the rounds in which the load side of either
	// target sent less than heldShare of the rate.
	UnderRate int `json:"under_rate_rounds"`
	Failures  int `json:"failed_rounds"`
	// Errors are transport errors and non-2xx answers, over every round.
	AErrors int64 `json:"a_errors"`
	BErrors int64 `json:"b_errors"`
}

// parsePair reads -pair: two target specs, or nothing.
func parsePair(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		name, rev, hasRev := strings.Cut(f, "@")
		switch {
		case name == "direct" || !slices.Contains(targetNames, name):
			return nil, fmt.Errorf("-pair: %q is not a proxy target (want one of %s, or keyway@REV)", f, strings.Join(targetNames[1:], ", "))
		case hasRev && (name != "keyway" || rev == ""):
			return nil, fmt.Errorf("-pair: %q: only keyway takes @REV (keyway@HEAD, keyway@<commit>)", f)
		}
		out = append(out, f)
	}
	if len(out) != 2 {
		return nil, fmt.Errorf("-pair: %q names %d targets; want two, A,B (e.g. keyway,haproxy)", s, len(out))
	}
	return out, nil
}

// pairTargets resolves the two specs of -pair. keyway is the harness's
// keyway binary (bin); keyway@REV is built from REV into the scratch
// directory. Two equal specs get " (A)" and " (B)" in their labels.
func (h *Harness) pairTargets(ctx context.Context, specs []string, bin string) ([2]*target, error) {
	var out [2]*target
	for i, spec := range specs {
		name, rev, hasRev := strings.Cut(spec, "@")
		b := bin
		if hasRev {
			dir := filepath.Join(h.dir, fmt.Sprintf("pair-%d", i))
			var err error
			if b, _, err = buildKeyway(ctx, h.cfg.Repo, rev, dir, h.cfg.Race); err != nil {
				return out, fmt.Errorf("%s: %w", spec, err)
			}
		}
		ts, notes, err := newTargets([]string{name}, b)
		if err != nil {
			return out, err
		}
		if len(ts) == 0 {
			return out, fmt.Errorf("-pair: %s", strings.Join(notes, "; "))
		}
		t := ts[0]
		t.name = spec
		if hasRev {
			t.version = "keyway built from " + rev + ": " + t.version
		}
		out[i] = t
	}
	if out[0].name == out[1].name {
		out[0].name += " (A)"
		out[1].name += " (B)"
	}
	return out, nil
}

// measurePairs runs every round of the paired mode.
func (h *Harness) measurePairs(ctx context.Context, ts [2]*target) []PairRun {
	var runs []PairRun
	for round := range h.cfg.Rounds {
		runs = append(runs, h.pairRound(ctx, ts, round)...)
		if ctx.Err() != nil {
			break
		}
	}
	return runs
}

// pairRound starts both targets on fresh processes (the first one to
// start alternates by round) and measures each rate.
func (h *Harness) pairRound(ctx context.Context, ts [2]*target, round int) []PairRun {
	first := round % 2
	fail := func(err error) []PairRun {
		var out []PairRun
		for _, rate := range h.cfg.Rates {
			out = append(out, PairRun{Round: round + 1, Rate: rate, First: ts[first].name, Failure: err.Error()})
		}
		h.logf("pair round %d failed: %v", round+1, err)
		return out
	}
	var rts [2]*running
	for _, i := range []int{first, 1 - first} {
		rt, err := h.start(ctx, ts[i], 2048, nil)
		if err != nil {
			return fail(err)
		}
		defer rt.stop()
		rts[i] = rt
	}
	var out []PairRun
	for _, rate := range h.cfg.Rates {
		pr := PairRun{Round: round + 1, Rate: rate, First: ts[first].name, LoadAvg: loadAvg()}
		run := runPairLatency
		if h.cfg.PairAlternate > 0 {
			run = runAlternating
		}
		a, b, err := run(ctx, rts, &h.cfg, rate, min(h.cfg.Warmup, time.Second), h.cfg.LatencyDuration, uint64(round*1000+rate))
		if err != nil {
			pr.Failure = err.Error()
			h.logf("pair round %d at %d/s: %v", round+1, rate, err)
		} else {
			pr.A, pr.B = a, b
			h.logf("pair round %d at %d/s: %s %.1f µs/req p50 %.3f ms, %s %.1f µs/req p50 %.3f ms: CPU ratio %.3f",
				round+1, rate, ts[0].name, deref(a.CPUPerReqUS), a.P50, ts[1].name, deref(b.CPUPerReqUS), b.P50, deref(a.CPUPerReqUS)/deref(b.CPUPerReqUS))
		}
		out = append(out, pr)
		if ctx.Err() != nil {
			break
		}
	}
	for i, rt := range rts {
		if !rt.p.alive() {
			for j := range out {
				if out[j].Failure == "" {
					out[j].Failure = fmt.Sprintf("%s exited during the round: %v", ts[i].name, rt.p.err)
				}
			}
		}
	}
	return out
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// pairAttacks are the open-loop attacks at rate on the two targets, each
// through a client of its own; closeIdle closes the clients' connections.
func pairAttacks(ctx context.Context, rts [2]*running, cfg *Config, rate int, seed uint64) (attacks [2]func(d time.Duration, keep bool) attackResult, closeIdle func()) {
	var clients [2]*http.Client
	for i, rt := range rts {
		c := newHTTPClient(64, loadSpec{})
		clients[i] = c
		tr := keyTargeter(loadSpec{}.url(rt.addr), cfg.Keys, cfg.Body, seed+uint64(i))
		attacks[i] = func(d time.Duration, keep bool) attackResult { return attack(ctx, c, tr, rate, 16, d, keep) }
	}
	return attacks, func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}
}

// runPairLatency warms both targets up at the rate, then attacks both at
// once for d, reading both processes' CPU time before and after.
//
// The two schedules are half a period apart. In phase, each request for
// one proxy would wake the idle core and the other's, arriving in the
// same microseconds, would find it awake. Apart, the one that leads is
// still not the one that follows (two copies of one build measured p50s
// 10% apart, the follower's higher), so each leads for half of d: the
// first half A's schedule leads, the second half B's.
func runPairLatency(ctx context.Context, rts [2]*running, cfg *Config, rate int, warm, d time.Duration, seed uint64) (a, b latencyRun, err error) {
	attacks, closeIdle := pairAttacks(ctx, rts, cfg, rate, seed)
	defer closeIdle()
	offset := time.Second / time.Duration(2*rate)
	// both runs both attacks for d, the leader's schedule offset ahead.
	both := func(d time.Duration, keep bool, leader int) (res [2]attackResult) {
		var wg sync.WaitGroup
		for _, i := range []int{leader, 1 - leader} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i] = attacks[i](d, keep)
			}()
			if i == leader {
				time.Sleep(offset)
			}
		}
		wg.Wait()
		return res
	}
	if warm > 0 {
		both(warm, false, 0)
	}
	var cpu0, sys0, cpu1, sys1 [2]float64
	for i, rt := range rts {
		if cpu0[i], sys0[i], err = treeCPUSys(rt.p.pid()); err != nil {
			return a, b, fmt.Errorf("proxy stats: %w", err)
		}
	}
	first := both(d/2, true, 0)
	second := both(d-d/2, true, 1)
	for i, rt := range rts {
		if cpu1[i], sys1[i], err = treeCPUSys(rt.p.pid()); err != nil {
			return a, b, fmt.Errorf("proxy stats: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return a, b, err
	}
	var lrs [2]latencyRun
	for i := range lrs {
		res := mergeAttacks(first[i], second[i])
		if lrs[i], err = newLatencyRun(res, rate, d); err != nil {
			return a, b, fmt.Errorf("%s: %w", []string{"A", "B"}[i], err)
		}
		lrs[i].setCPUSys(cpu1[i]-cpu0[i], sys1[i]-sys0[i], res.seconds)
	}
	return lrs[0], lrs[1], nil
}

// runAlternating is runPairLatency in turns (-pair-alternate): each
// target is loaded alone, in slices of cfg.PairAlternate, in the order
// A B B A A B B A ..., until each has had d; its CPU is read around each
// of its slices and added up. So each proxy runs alone on the core while
// it is measured, as in the full run (the other one idles beside it), and
// whatever the machine does over the round's seconds still falls on both
// alike: a drift in the machine's speed cancels over each A B B A.
func runAlternating(ctx context.Context, rts [2]*running, cfg *Config, rate int, warm, d time.Duration, seed uint64) (a, b latencyRun, err error) {
	attacks, closeIdle := pairAttacks(ctx, rts, cfg, rate, seed)
	defer closeIdle()
	if warm > 0 {
		attacks[0](warm, false)
		attacks[1](warm, false)
	}
	var res [2]attackResult
	var cpu, sys [2]float64
	for k, order := range alternation(d, cfg.PairAlternate) {
		for _, i := range order {
			c0, s0, err := treeCPUSys(rts[i].p.pid())
			if err != nil {
				return a, b, fmt.Errorf("proxy stats: %w", err)
			}
			r := attacks[i](cfg.PairAlternate, true)
			c1, s1, err := treeCPUSys(rts[i].p.pid())
			if err != nil {
				return a, b, fmt.Errorf("proxy stats: %w", err)
			}
			cpu[i] += c1 - c0
			sys[i] += s1 - s0
			if k == 0 {
				res[i] = r
			} else {
				res[i] = mergeAttacks(res[i], r)
			}
			if err := ctx.Err(); err != nil {
				return a, b, err
			}
		}
	}
	var lrs [2]latencyRun
	for i := range lrs {
		if lrs[i], err = newLatencyRun(res[i], rate, time.Duration(res[i].seconds*float64(time.Second))); err != nil {
			return a, b, fmt.Errorf("%s: %w", []string{"A", "B"}[i], err)
		}
		lrs[i].setCPUSys(cpu[i], sys[i], res[i].seconds)
	}
	return lrs[0], lrs[1], nil
}

// alternation is the order of runAlternating's slices: for d in slices
// of length slice (at least one each), pairs of turns A B, B A, A B, ...
func alternation(d, slice time.Duration) [][2]int {
	n := max(1, int((d+slice/2)/slice))
	out := make([][2]int, n)
	for k := range out {
		out[k] = [2]int{k % 2, 1 - k%2}
	}
	return out
}

// mergeAttacks is the result of two attacks in a row, as one.
func mergeAttacks(x, y attackResult) attackResult {
	out := attackResult{requests: x.requests + y.requests, errors: x.errors + y.errors, answered: x.answered + y.answered,
		firstErr: x.firstErr, seconds: x.seconds + y.seconds}
	if out.firstErr == "" {
		out.firstErr = y.firstErr
	}
	out.latencies = append(append(make([]time.Duration, 0, len(x.latencies)+len(y.latencies)), x.latencies...), y.latencies...)
	out.sendLags = append(append(make([]time.Duration, 0, len(x.sendLags)+len(y.sendLags)), x.sendLags...), y.sendLags...)
	slices.Sort(out.latencies)
	slices.Sort(out.sendLags)
	return out
}

// summarisePairs summarises the paired runs by rate.
func summarisePairs(runs []PairRun, rates []int) []PairSummary {
	var out []PairSummary
	for _, rate := range rates {
		s := PairSummary{Rate: rate}
		var acpu, bcpu, asys, bsys, ratio, ap50, bp50, p50r, ap99, bp99 []float64
		for _, r := range runs {
			if r.Rate != rate {
				continue
			}
			if r.Failure != "" {
				s.Failures++
				continue
			}
			if r.A.UnderRate || r.B.UnderRate {
				s.UnderRate++
			}
			s.AErrors += r.A.Errors
			s.BErrors += r.B.Errors
			a, b := deref(r.A.CPUPerReqUS), deref(r.B.CPUPerReqUS)
			acpu, bcpu = append(acpu, a), append(bcpu, b)
			asys, bsys = append(asys, deref(r.A.SysPerReqUS)), append(bsys, deref(r.B.SysPerReqUS))
			if b > 0 {
				ratio = append(ratio, a/b)
			}
			ap50, bp50 = append(ap50, r.A.P50), append(bp50, r.B.P50)
			if r.B.P50 > 0 {
				p50r = append(p50r, r.A.P50/r.B.P50)
			}
			ap99, bp99 = append(ap99, r.A.P99), append(bp99, r.B.P99)
		}
		s.ACPU, s.BCPU, s.ASys, s.BSys = newStat(acpu), newStat(bcpu), newStat(asys), newStat(bsys)
		s.CPURatio, s.P50Ratio = newStat(ratio), newStat(p50r)
		s.AP50, s.BP50, s.AP99, s.BP99 = newStat(ap50), newStat(bp50), newStat(ap99), newStat(bp99)
		out = append(out, s)
	}
	return out
}

// pairMarkdown renders the paired mode's table.
func (r *Report) pairMarkdown(b *strings.Builder) {
	a, bn := r.Config.Pair[0], r.Config.Pair[1]
	if a == bn {
		a, bn = a+" (A)", bn+" (B)"
	}
	if alt := r.Config.PairAlternate; alt > 0 {
		fmt.Fprintf(b, "### Paired in turns: A = %s and B = %s on CPU 0, each loaded alone in %v slices (A B B A A B ...), open loop (vegeta, %v each per round)\n\n", a, bn, alt, r.Config.LatencyDuration)
	} else {
		fmt.Fprintf(b, "### Paired: A = %s and B = %s on CPU 0 at once, each under its own open-loop load (vegeta, %v per round)\n\n", a, bn, r.Config.LatencyDuration)
	}
	b.WriteString("| rate | A CPU µs/req (kernel) | B CPU µs/req (kernel) | **A ÷ B CPU per request** | A p50 ms | B p50 ms | A ÷ B p50 | A p99 ms | B p99 ms | rounds |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.PairSummary {
		rounds := fmt.Sprint(s.CPURatio.n())
		if s.UnderRate > 0 {
			rounds += fmt.Sprintf(", **%d under rate**", s.UnderRate)
		}
		if s.Failures > 0 {
			rounds += fmt.Sprintf(", **%d failed**", s.Failures)
		}
		if s.AErrors+s.BErrors > 0 {
			rounds += fmt.Sprintf(", **errors A %d, B %d**", s.AErrors, s.BErrors)
		}
		fmt.Fprintf(b, "| %d/s | %s (%s) | %s (%s) | **%s** | %s | %s | %s | %s | %s | %s |\n", s.Rate,
			fs(s.ACPU, "%.1f"), fs(s.ASys, "%.1f"), fs(s.BCPU, "%.1f"), fs(s.BSys, "%.1f"), fs(s.CPURatio, "%.3f"),
			fs(s.AP50, "%.3f"), fs(s.BP50, "%.3f"), fs(s.P50Ratio, "%.3f"), fs(s.AP99, "%.3f"), fs(s.BP99, "%.3f"), rounds)
	}
	if r.Config.PairAlternate > 0 {
		b.WriteString("\nEach ratio is the median of per-round ratios, both figures of a round taken in alternating slices over the same seconds.\n\n")
	} else {
		b.WriteString("\nEach ratio is the median of per-round ratios, both figures of a round taken over the same seconds. Two copies of one build measured 0.98–1.02 per round here.\n\n")
	}
	for _, run := range r.PairRuns {
		if run.Failure != "" {
			fmt.Fprintf(b, "- round %d at %d/s failed: %s\n", run.Round, run.Rate, run.Failure)
		}
	}
}

func (s *Stat) n() int {
	if s == nil {
		return 0
	}
	return s.N
}
