package main

import (
	"fmt"
	"slices"
	"strings"
)

// fs formats a Stat as "median (min–max)" with the given verb, or "—".
func fs(s *Stat, verb string) string {
	if s == nil {
		return "—"
	}
	m := fmt.Sprintf(verb, s.Median)
	if s.N < 2 {
		return m
	}
	return fmt.Sprintf("%s (%s–%s)", m, fmt.Sprintf(verb, s.Min), fmt.Sprintf(verb, s.Max))
}

// Markdown renders the summary tables.
func (r *Report) Markdown() string {
	var b strings.Builder
	c := r.Config
	title := "keyway side-by-side benchmark"
	if c.Restarts {
		title = "keyway restarts and upgrades"
	}
	fmt.Fprintf(&b, "## %s, %s\n\n", title, r.Started.Format("2006-01-02 15:04 UTC"))
	if c.Restarts {
		fmt.Fprintf(&b, "%d round(s), cases interleaved; every cell is the min–max over rounds.\n", c.Rounds)
	} else {
		fmt.Fprintf(&b, "%d round(s), targets interleaved; every cell is the median over rounds with (min–max).\n", c.Rounds)
	}
	fmt.Fprintf(&b, "Machine: %d CPU (%s), Linux %s, %s; load average (1, 5, 15 min) %s at start, %s at end.\n",
		r.Env.CPUs, r.Env.CPUModel, r.Env.Kernel, r.Env.GoVersion, r.Env.LoadStart, r.Env.LoadEnd)
	fmt.Fprintf(&b, "keyway: %s.\n", r.Env.KeywaySource)
	tool := "wrk"
	for _, run := range r.Runs {
		if run.Throughput != nil {
			tool = run.Throughput.Tool
			break
		}
	}
	if c.Restarts && c.Restart != nil {
		rc := c.Restart
		warm := "opened as the load needs them"
		if rc.Warm {
			warm = fmt.Sprintf("all opened %v before the load, so that most are idle (parked by keyway) at the signal", warmIdle)
		}
		idle := ""
		if rc.IdleConns > 0 {
			idle = fmt.Sprintf(" Also %d idle keep-alive connections, each opened with one request before the load and silent afterwards.", rc.IdleConns)
		}
		fmt.Fprintf(&b, "Load: POST /ingest, %d-byte body, X-Key uniform over %d keys, %d replicas; %d req/s open loop from a net/http Transport of %d keep-alive connections (%s), no retries, client timeout %v; %v before the signal, %v after the operation is over.%s\n",
			c.Body, c.Keys, c.Replicas, rc.Rate, rc.Conns, warm, rc.Timeout, rc.Before, rc.After, idle)
	} else if len(c.Bodies) > 0 {
		fmt.Fprintf(&b, "Load: POST /ingest with request bodies of %s, the harness's own client, %d connections, closed loop; one replica reading each body from its stream into a reused buffer and answering 200 ok.\n", joinSizes(c.Bodies), c.BodyConns)
	} else if c.Saturation || len(c.Pair) > 0 || c.Instructions > 0 {
		fmt.Fprintf(&b, "Load: POST /ingest, %d-byte body, X-Key uniform over %d keys, %d replicas; vegeta, open loop.\n", c.Body, c.Keys, c.Replicas)
	} else {
		fmt.Fprintf(&b, "Load: POST /ingest, %d-byte body, X-Key uniform over %d keys, %d replicas; throughput with %s, %d connections, %v per run.\n",
			c.Body, c.Keys, c.Replicas, tool, c.Connections, c.Duration)
	}
	if c.Pin {
		b.WriteString("Pinning: proxy on CPU 0 (`taskset -c 0`), load generator and replicas on CPU 1, unless a note says otherwise.\n")
	}
	if c.ForwardHeaders {
		b.WriteString("Forwarding headers (`-forward-headers`): HAProxy and nginx add X-Forwarded-For, -Proto, -Host and an X-Request-Id, as keyway does by default.\n")
	}
	b.WriteString("\n")
	if c.Instructions > 0 {
		r.instrMarkdown(&b)
		r.notesAndFailures(&b)
		return b.String()
	}
	if len(c.Pair) > 0 {
		r.pairMarkdown(&b)
		r.notesAndFailures(&b)
		return b.String()
	}
	if c.Restarts {
		r.restartsMarkdown(&b)
		r.notesAndFailures(&b)
		return b.String()
	}
	if len(c.Bodies) > 0 {
		r.bodiesMarkdown(&b)
		r.notesAndFailures(&b)
		return b.String()
	}
	if c.Saturation {
		r.satMarkdown(&b)
		r.notesAndFailures(&b)
		return b.String()
	}

	b.WriteString("### Throughput and CPU\n\n")
	b.WriteString("| target | req/s | proxy CPU (cores) | req/s per proxy core | proxy CPU µs/req | of which in the kernel | peak RSS MiB | errors |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Summary {
		errs := fmt.Sprint(s.Errors)
		if s.Errors > 0 {
			errs = "**" + errs + " (flagged)**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Target, fs(s.RPS, "%.0f"), fs(s.CPUUtil, "%.2f"),
			fs(s.RPSPerCore, "%.0f"), fs(s.CPUPerReqUS, "%.1f"), fs(s.SysPerReqUS, "%.1f"), fs(s.PeakRSSMiB, "%.1f"), errs)
	}
	for _, rate := range c.Rates {
		fmt.Fprintf(&b, "\n### Latency at %d req/s, open loop (vegeta, %v per run), ms\n\n", rate, c.LatencyDuration)
		b.WriteString("| target | p50 | p99 | p99.9 | max | added p50 | added p99 | proxy CPU µs/req | errors |\n|---|---|---|---|---|---|---|---|---|\n")
		var under []string
		for _, s := range r.Summary {
			for _, l := range s.Latency {
				if l.Rate != rate {
					continue
				}
				errs := fmt.Sprint(l.Errors)
				if l.Errors > 0 {
					errs = "**" + errs + " (flagged)**"
				}
				cpu := fs(l.CPUPerReqUS, "%.1f")
				if len(l.UnderRate) > 0 {
					cpu += " **(under rate)**"
					under = append(under, underRateNote(s.Target, l))
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Target, fs(l.P50, "%.3f"), fs(l.P99, "%.3f"),
					fs(l.P999, "%.3f"), fs(l.Max, "%.2f"), fs(l.AddedP50, "%.3f"), fs(l.AddedP99, "%.3f"), cpu, errs)
			}
		}
		for _, n := range under {
			fmt.Fprintf(&b, "\n%s\n", n)
		}
	}
	if c.SparseConns > 0 {
		fmt.Fprintf(&b, "\n### Sparse keep-alive clients: %d connections, each sending one request every %v (%v measured)\n\n", c.SparseConns, c.SparsePeriod, c.LatencyDuration)
		b.WriteString("| target | req/s | proxy CPU µs/req | errors |\n|---|---|---|---|\n")
		for _, s := range r.Summary {
			if s.SparseCPUPerReqUS == nil {
				continue
			}
			errs := fmt.Sprint(s.SparseErrors)
			if s.SparseErrors > 0 {
				errs = "**" + errs + " (flagged)**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", s.Target, fs(s.SparseRate, "%.0f"), fs(s.SparseCPUPerReqUS, "%.1f"), errs)
		}
	}
	fmt.Fprintf(&b, "\n### Routing and memory\n\n")
	fmt.Fprintf(&b, "| target | keys seen by >1 replica | balance max/mean |")
	if c.IdleConns > 0 {
		fmt.Fprintf(&b, " RSS before MiB | RSS with %d idle conns MiB | bytes per idle conn |\n|---|---|---|---|---|---|\n", c.IdleConns)
	} else {
		b.WriteString("\n|---|---|---|\n")
	}
	for _, s := range r.Summary {
		aff := fmt.Sprintf("%.4f (of %d keys)", s.SplitKeyShare, s.KeysSeen)
		if s.SplitKeyShare == 0 {
			aff = fmt.Sprintf("0 (of %d keys)", s.KeysSeen)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |", s.Target, aff, fs(s.Balance, "%.3f"))
		if c.IdleConns > 0 {
			fmt.Fprintf(&b, " %s | %s | %s |", fs(s.IdleBaseMiB, "%.1f"), fs(s.IdleRSSMiB, "%.1f"), fs(s.IdleBytes, "%.0f"))
		}
		b.WriteString("\n")
	}
	r.syscallTable(&b)
	r.tlsTables(&b)
	if len(r.Ratios) > 0 {
		var others []string
		for _, s := range r.Summary {
			if s.Target != "keyway" {
				others = append(others, s.Target)
			}
		}
		b.WriteString("\n### keyway ÷ other, per-round ratio\n\n| metric | better |")
		for _, o := range others {
			fmt.Fprintf(&b, " vs %s |", o)
		}
		b.WriteString("\n|---|---|" + strings.Repeat("---|", len(others)) + "\n")
		for _, row := range r.Ratios {
			if len(row.Vs) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s |", row.Metric, row.Better)
			for _, o := range others {
				fmt.Fprintf(&b, " %s |", fs(row.Vs[o], "%.2f"))
			}
			b.WriteString("\n")
		}
		var affs []string
		for _, s := range r.Summary {
			if s.Target != "direct" {
				affs = append(affs, fmt.Sprintf("%s %g", s.Target, s.SplitKeyShare))
			}
		}
		fmt.Fprintf(&b, "\nKey affinity (share of keys seen by more than one replica, worst round): %s.\n", strings.Join(affs, ", "))
		for _, row := range r.Ratios {
			if row.Note != "" {
				fmt.Fprintf(&b, "- %s: %s\n", row.Metric, row.Note)
			}
		}
	}
	r.notesAndFailures(&b)
	return b.String()
}

// underRateNote says which rounds of a target's latency runs at one rate
// were not at that rate, so that their figures are not read as such.
func underRateNote(target string, l LatencySummary) string {
	rounds := make([]string, len(l.UnderRate))
	for i, r := range l.UnderRate {
		rounds[i] = fmt.Sprint(r)
	}
	return fmt.Sprintf("**Under rate: %s at %d/s**, round(s) %s: the load generator sent less than %.0f%% of the requested rate (sent %s req/s over the rounds, send lag p99 %s ms). "+
		"Its CPU per request and latencies there are from a lower rate than the table's, and the ratios that use them say so.",
		target, l.Rate, strings.Join(rounds, ", "), 100*heldShare, fs(l.AchievedRate, "%.0f"), fs(l.SendLagP99, "%.1f"))
}

// notesAndFailures renders the run's notes and every target's failures.
func (r *Report) notesAndFailures(b *strings.Builder) {
	if len(r.Notes) > 0 {
		b.WriteString("\nNotes:\n")
		for _, n := range r.Notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
	var fails []string
	for _, s := range r.Summary {
		for _, f := range s.Failures {
			fails = append(fails, s.Target+" "+f)
		}
	}
	if len(fails) > 0 {
		b.WriteString("\nFailures:\n")
		for _, f := range fails {
			fmt.Fprintf(b, "- %s\n", strings.ReplaceAll(f, "\n", " "))
		}
	}
}

// syscallTable renders system calls per request, one column per call that
// some target makes at least once per 20 requests.
func (r *Report) syscallTable(b *strings.Builder) {
	r.syscallRows(b, "System calls per request (perf stat, extra run in the last round)",
		func(s TargetSummary) map[string]float64 { return s.Syscalls })
	var rates []int
	for _, s := range r.Summary {
		for rate := range s.SyscallsAtRate {
			if !slices.Contains(rates, rate) {
				rates = append(rates, rate)
			}
		}
	}
	slices.Sort(rates)
	for _, rate := range rates {
		r.syscallRows(b, fmt.Sprintf("System calls per request at %d/s (perf stat, extra open-loop run in the last round)", rate),
			func(s TargetSummary) map[string]float64 { return s.SyscallsAtRate[rate] })
	}
}

// syscallRows renders one table of system calls (and context switches)
// per request, a column for each name some target makes at least 0.05 of.
func (r *Report) syscallRows(b *strings.Builder, title string, get func(TargetSummary) map[string]float64) {
	var cols []string
	for _, name := range append(append([]string{"all"}, countedSyscalls...), "context-switches") {
		for _, s := range r.Summary {
			if get(s)[name] >= 0.05 {
				cols = append(cols, name)
				break
			}
		}
	}
	if len(cols) == 0 {
		return
	}
	fmt.Fprintf(b, "\n### %s\n\n| target |", title)
	for _, c := range cols {
		fmt.Fprintf(b, " %s |", c)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, s := range r.Summary {
		m := get(s)
		if m == nil {
			continue
		}
		fmt.Fprintf(b, "| %s |", s.Target)
		for _, c := range cols {
			fmt.Fprintf(b, " %.2f |", m[c])
		}
		b.WriteString("\n")
	}
}

// tlsTables renders the -tls figures next to the plain ones.
func (r *Report) tlsTables(b *strings.Builder) {
	var rows []TargetSummary
	for _, s := range r.Summary {
		if s.TLS != nil {
			rows = append(rows, s)
		}
	}
	if len(rows) == 0 {
		return
	}
	flag := func(n int64) string {
		if n > 0 {
			return fmt.Sprintf("**%d (flagged)**", n)
		}
		return "0"
	}
	fmt.Fprintf(b, "\n### TLS: the cost of terminating TLS 1.3\n\n")
	fmt.Fprintf(b, "Each proxy on a fresh process with the run's ECDSA P-256 certificate, TLS 1.3 only, %s with %s, session tickets off where the proxy has a setting for them (see Negotiated below), plain HTTP to the replicas. New connections come from a client that never resumes a session. The plain columns are the same round's plain-HTTP runs.\n", tlsSuite, tlsGroup)
	fmt.Fprintf(b, "\n#### Keep-alive (%d connections, %v per run): CPU per request\n\n", r.Config.Connections, r.Config.Duration)
	b.WriteString("| target | plain proxy CPU µs/req | TLS proxy CPU µs/req | TLS ÷ plain | TLS req/s | TLS proxy CPU (cores) | TLS req/s per proxy core | TLS errors |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range rows {
		t := s.TLS
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Target, fs(s.CPUPerReqUS, "%.1f"), fs(t.CPUPerReqUS, "%.1f"), fs(t.CPUOverPlain, "%.2f"),
			fs(t.RPS, "%.0f"), fs(t.CPUUtil, "%.2f"), fs(t.RPSPerCore, "%.0f"), flag(t.Errors))
	}
	fmt.Fprintf(b, "\n#### A new connection per request (`Connection: close`, %d connections, %v per run): handshakes\n\n", r.Config.Connections, r.Config.Duration)
	b.WriteString("| target | plain conn/s | plain proxy CPU µs/conn | TLS handshakes/s | TLS proxy CPU (cores) | handshakes per proxy core-second | proxy CPU µs/handshake | handshake's own µs (TLS − plain) | errors plain · TLS |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range rows {
		t := s.TLS
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s · %s |\n", s.Target, fs(t.ConnRate, "%.0f"), fs(t.ConnCPUUS, "%.1f"),
			fs(t.HandshakeRate, "%.0f"), fs(t.HandshakeCPUUtil, "%.2f"), fs(t.HandshakesPerCore, "%.0f"), fs(t.HandshakeCPUUS, "%.1f"),
			fs(t.HandshakeOverConnUS, "%.1f"), flag(t.ConnErrors), flag(t.HandshakeErrors))
	}
	if r.Config.IdleConns > 0 {
		fmt.Fprintf(b, "\n#### Memory with %d idle keep-alive connections\n\n| target | bytes per idle conn, plain | bytes per idle conn, TLS |\n|---|---|---|\n", r.Config.IdleConns)
		for _, s := range rows {
			fmt.Fprintf(b, "| %s | %s | %s |\n", s.Target, fs(s.IdleBytes, "%.0f"), fs(s.TLS.IdleBytes, "%.0f"))
		}
	}
	b.WriteString("\nNegotiated (Go client offering what OpenSSL offers; then `openssl s_client` with OpenSSL's defaults, as wrk):\n")
	for _, s := range rows {
		n := s.TLS.Negotiated
		if n == "" {
			n = "not probed"
		}
		fmt.Fprintf(b, "- %s: %s\n", s.Target, n)
		for _, u := range s.TLS.Unfair {
			fmt.Fprintf(b, "  - **differs from the others**, %s\n", u)
		}
	}
}
