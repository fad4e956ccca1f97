package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// RestartSummary is one case over every round. Every figure is over the
// rounds measured (Rounds), its min–max in the report; a class that a
// round did not see counts 0 in it.
type RestartSummary struct {
	Case         string           `json:"case"`
	Target       string           `json:"target"`
	Rounds       int              `json:"rounds"`
	Sent         *Stat            `json:"sent,omitempty"`
	OK           *Stat            `json:"ok_2xx,omitempty"`
	Failed       *Stat            `json:"failed,omitempty"`
	FailedBefore *Stat            `json:"failed_before_signal,omitempty"`
	Errors       map[string]*Stat `json:"errors,omitempty"`
	NonOK        map[string]*Stat `json:"non_2xx,omitempty"`
	ReadyMs      *Stat            `json:"ready_ms,omitempty"`
	OldExitMs    *Stat            `json:"old_exit_ms,omitempty"`
	// StartAfterExitMs: from the old process's exit to the new one's
	// first accept (negative: the new one accepted first).
	StartAfterExitMs *Stat `json:"ready_after_old_exit_ms,omitempty"`
	// OldExited of OldExitWatched rounds saw the old process exit.
	OldExited       int   `json:"old_exited_rounds"`
	OldExitWatched  int   `json:"old_exit_watched_rounds"`
	Attempts        *Stat `json:"start_attempts,omitempty"`
	ListenOverflows *Stat `json:"listen_overflows,omitempty"`
	ListenDrops     *Stat `json:"listen_drops,omitempty"`
	P99Ms           *Stat `json:"p99_ms,omitempty"`
	MaxMs           *Stat `json:"max_ms,omitempty"`
	SendLagMaxMs    *Stat `json:"send_lag_max_ms,omitempty"`
	// Failures are the rounds that could not be completed.
	Failures []string `json:"failures,omitempty"`
}

// summariseRestarts groups runs by case, in the order the cases first
// appear in restartCaseNames (then by name).
func summariseRestarts(runs []RestartRun) []RestartSummary {
	var names []string
	for _, r := range runs {
		if !slices.Contains(names, r.Case) {
			names = append(names, r.Case)
		}
	}
	kind := func(name string) int {
		k, _, _ := strings.Cut(name, " ")
		return slices.Index(restartCaseNames, k)
	}
	slices.SortStableFunc(names, func(a, b string) int {
		if c := cmpIndex(kind(a), kind(b)); c != 0 {
			return c
		}
		return strings.Compare(b, a) // drain_idle=5s before drain_idle=1s
	})
	var out []RestartSummary
	for _, name := range names {
		s := RestartSummary{Case: name}
		var sent, ok, failed, before, ready, exit, after, attempts, overflows, drops, p99, maxMs, lag []float64
		errs, nonOK := map[string][]float64{}, map[string][]float64{}
		var measured []RestartRun
		for _, r := range runs {
			if r.Case != name {
				continue
			}
			s.Target = r.Target
			if r.Failure != "" {
				s.Failures = append(s.Failures, fmt.Sprintf("round %d: %s", r.Round, r.Failure))
				continue
			}
			measured = append(measured, r)
			for k := range r.Errors {
				errs[k] = nil
			}
			for k := range r.NonOK {
				nonOK[k] = nil
			}
		}
		for _, r := range measured {
			s.Rounds++
			sent, ok, failed, before = append(sent, float64(r.Sent)), append(ok, float64(r.OK)), append(failed, float64(r.Failed)), append(before, float64(r.FailedBefore))
			for k := range errs {
				errs[k] = append(errs[k], float64(r.Errors[k]))
			}
			for k := range nonOK {
				nonOK[k] = append(nonOK[k], float64(r.NonOK[k]))
			}
			ready, exit, after = appendOpt(ready, r.ReadyMs), appendOpt(exit, r.OldExitMs), appendOpt(after, r.StartAfterExitMs)
			if r.OldExited != nil {
				s.OldExitWatched++
				if *r.OldExited {
					s.OldExited++
				}
			}
			if r.Attempts > 0 {
				attempts = append(attempts, float64(r.Attempts))
			}
			overflows, drops = append(overflows, float64(r.ListenOverflows)), append(drops, float64(r.ListenDrops))
			if r.OK > 0 {
				p99, maxMs = append(p99, r.P99Ms), append(maxMs, r.MaxMs)
			}
			lag = append(lag, r.SendLagMaxMs)
		}
		s.Sent, s.OK, s.Failed, s.FailedBefore = newStat(sent), newStat(ok), newStat(failed), newStat(before)
		s.ReadyMs, s.OldExitMs, s.StartAfterExitMs, s.Attempts = newStat(ready), newStat(exit), newStat(after), newStat(attempts)
		s.ListenOverflows, s.ListenDrops = newStat(overflows), newStat(drops)
		s.P99Ms, s.MaxMs, s.SendLagMaxMs = newStat(p99), newStat(maxMs), newStat(lag)
		for k, v := range errs {
			if s.Errors == nil {
				s.Errors = map[string]*Stat{}
			}
			s.Errors[k] = newStat(v)
		}
		for k, v := range nonOK {
			if s.NonOK == nil {
				s.NonOK = map[string]*Stat{}
			}
			s.NonOK[k] = newStat(v)
		}
		out = append(out, s)
	}
	return out
}

func appendOpt(xs []float64, v *float64) []float64 {
	if v == nil {
		return xs
	}
	return append(xs, *v)
}

// mm formats a Stat as "min–max", one number when they are equal, or "—".
func mm(s *Stat, verb string) string {
	if s == nil {
		return "—"
	}
	lo, hi := noNegZero(fmt.Sprintf(verb, s.Min)), noNegZero(fmt.Sprintf(verb, s.Max))
	if lo == hi {
		return lo
	}
	return lo + "–" + hi
}

// restartsMarkdown renders the restart mode's tables: the summary by
// case, every round, and what each failed request met.
func (r *Report) restartsMarkdown(b *strings.Builder) {
	c := r.Config.Restart
	if c == nil {
		return
	}
	fmt.Fprintf(b, "### Restarts and upgrades: %d req/s open loop, a fresh process per case and round; cells are min–max over rounds\n\n", c.Rate)
	fmt.Fprintf(b, "keyway: `server.drain_idle` %v (sigterm-exit: as named), `server.shutdown_timeout` %v. HAProxy: master-worker (`-W`), `hard-stop-after` %v. Times are ms after the signal.\n\n", c.DrainIdle, c.ShutdownTimeout, c.ShutdownTimeout)
	b.WriteString("| case | rounds | sent | 2xx | failed | refused | reset | eof | timeout | other | non-2xx | new process accepts | old process exits | accepts − exit | old exited | start attempts | ListenOverflows / ListenDrops | p99 / max ms (2xx) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.RestartSummary {
		failed := mm(s.Failed, "%.0f")
		if s.Failed != nil && s.Failed.Max > 0 {
			failed = "**" + failed + "**"
		}
		var classes []string
		for _, k := range restartClasses {
			classes = append(classes, mm(s.Errors[k], "%.0f"))
		}
		var non []string
		for _, k := range slices.Sorted(maps.Keys(s.NonOK)) {
			non = append(non, k+": "+mm(s.NonOK[k], "%.0f"))
		}
		exited := "—"
		if s.OldExitWatched > 0 {
			exited = fmt.Sprintf("%d of %d", s.OldExited, s.OldExitWatched)
		}
		if len(s.Failures) > 0 {
			exited += fmt.Sprintf(" **(%d round(s) failed)**", len(s.Failures))
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s/%s | %s / %s |\n",
			s.Case, s.Rounds, mm(s.Sent, "%.0f"), mm(s.OK, "%.0f"), failed, strings.Join(classes, " | "), orDash(strings.Join(non, ", ")),
			mm(s.ReadyMs, "%.0f"), mm(s.OldExitMs, "%.0f"), mm(s.StartAfterExitMs, "%.0f"), exited, mm(s.Attempts, "%.0f"),
			mm(s.ListenOverflows, "%.0f"), mm(s.ListenDrops, "%.0f"), mm(s.P99Ms, "%.1f"), mm(s.MaxMs, "%.0f"))
	}

	b.WriteString("\n#### Every round\n\n")
	idleCol, idleSep := "", ""
	if c.IdleConns > 0 {
		idleCol, idleSep = " idle conns closed by the proxy |", "---|"
	}
	b.WriteString("| case | round | sent | 2xx | failed | by class | failures sent at (ms) | accepts | exits | old exit | attempts | overflows / drops |" + idleCol + " log events (ms) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|" + idleSep + "---|\n")
	runs := slices.Clone(r.RestartRuns)
	order := map[string]int{}
	for i, s := range r.RestartSummary {
		order[s.Case] = i
	}
	slices.SortStableFunc(runs, func(a, b RestartRun) int {
		if d := order[a.Case] - order[b.Case]; d != 0 {
			return d
		}
		return a.Round - b.Round
	})
	for _, run := range runs {
		if run.Failure != "" {
			empty := 10
			if c.IdleConns > 0 {
				empty++
			}
			fmt.Fprintf(b, "| %s | %d | **failed**: %s |%s\n", run.Case, run.Round, strings.ReplaceAll(firstLine(run.Failure), "|", "/"), strings.Repeat(" |", empty))
			continue
		}
		at := "—"
		if run.FirstFailMs != nil {
			at = fmt.Sprintf("%+.0f … %+.0f", *run.FirstFailMs, *run.LastFailMs)
		}
		idle := ""
		if c.IdleConns > 0 {
			idle = fmt.Sprintf(" %d of %d |", run.IdleClosed, run.IdleConns)
		}
		fmt.Fprintf(b, "| %s | %d | %d | %d | %d | %s | %s | %s | %s | %s | %s | %d / %d |%s %s |\n",
			run.Case, run.Round, run.Sent, run.OK, run.Failed, orDash(byClass(run)), at,
			fmtOpt(run.ReadyMs), fmtOpt(run.OldExitMs), orDash(run.OldExitStatus), attemptsCell(run),
			run.ListenOverflows, run.ListenDrops, idle, orDash(eventsCell(run)))
	}

	var digest []string
	for _, run := range runs {
		for _, d := range failureDigest(run.Failures) {
			digest = append(digest, fmt.Sprintf("%s, round %d: %s", run.Case, run.Round, d))
		}
		if len(run.Failures) < run.Failed {
			digest = append(digest, fmt.Sprintf("%s, round %d: (the first %d of each class are listed, %d of %d failed requests)", run.Case, run.Round, maxFailuresListed, len(run.Failures), run.Failed))
		}
	}
	if len(digest) > 0 {
		b.WriteString("\n#### What the failed requests met\n\nSend and failure times are ms after the signal; \"reused\": on a keep-alive connection that had carried a request before; \"written\": the request was written whole before the failure.\n\n")
		for _, d := range digest {
			fmt.Fprintf(b, "- %s\n", d)
		}
	}
	var notes []string
	for _, run := range runs {
		for _, n := range run.Notes {
			notes = append(notes, fmt.Sprintf("%s, round %d: %s", run.Case, run.Round, n))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n#### Warnings the processes logged\n\n")
		for _, n := range notes {
			fmt.Fprintf(b, "- `%s`\n", strings.ReplaceAll(n, "`", "'"))
		}
	}
	var fails []string
	for _, s := range r.RestartSummary {
		for _, f := range s.Failures {
			fails = append(fails, s.Case+" "+f)
		}
	}
	if len(fails) > 0 {
		b.WriteString("\nFailures:\n")
		for _, f := range fails {
			fmt.Fprintf(b, "- %s\n", strings.ReplaceAll(f, "\n", " "))
		}
	}
}

// noNegZero turns a formatted "-0" (or "-0.0") into "0": a time that
// rounds to zero, from a log timestamp truncated to the millisecond.
func noNegZero(s string) string {
	if strings.HasPrefix(s, "-") && strings.Trim(s, "-0.") == "" {
		return s[1:]
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func fmtOpt(v *float64) string {
	if v == nil {
		return "—"
	}
	return noNegZero(fmt.Sprintf("%.0f", *v))
}

// byClass lists a run's failures by class and status: "eof 2, 503 1".
func byClass(run RestartRun) string {
	var parts []string
	for _, k := range restartClasses {
		if n := run.Errors[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(run.NonOK)) {
		parts = append(parts, fmt.Sprintf("status %s: %d", k, run.NonOK[k]))
	}
	return strings.Join(parts, ", ")
}

func attemptsCell(run RestartRun) string {
	if run.Attempts == 0 {
		return "—"
	}
	return fmt.Sprint(run.Attempts)
}

// eventsCell lists the run's log events in time order: "shutting down 0,
// drained 153 (open 0, closed waiting 2), stopped 154".
func eventsCell(run RestartRun) string {
	keys := slices.Collect(maps.Keys(run.Events))
	slices.SortFunc(keys, func(a, b string) int {
		if run.Events[a] != run.Events[b] {
			if run.Events[a] < run.Events[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		name := strings.TrimPrefix(strings.TrimPrefix(k, "old: "), "proxy ")
		if strings.HasPrefix(name, "upgrade: ") {
			name = "handed over"
		}
		p := name + " " + noNegZero(fmt.Sprintf("%.0f", run.Events[k]))
		if k == "old: proxy drained" && run.DrainOpenAfterGrace != nil && run.DrainClosedWaiting != nil {
			p += fmt.Sprintf(" (open after grace %d, closed waiting %d)", *run.DrainOpenAfterGrace, *run.DrainClosedWaiting)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// failureDigest sums up a run's failed requests by class (or status):
// how many, when they were sent and failed, on which connections, and
// one error.
func failureDigest(fs []restartFailure) []string {
	type group struct {
		n, reused, wrote               int
		sentLo, sentHi, doneLo, doneHi float64
		err                            string
	}
	groups := map[string]*group{}
	var keys []string
	for _, f := range fs {
		k := f.Class
		if k == "status" {
			k = fmt.Sprintf("status %d", f.Status)
		}
		g, ok := groups[k]
		if !ok {
			g = &group{sentLo: f.SentMs, sentHi: f.SentMs, doneLo: f.DoneMs, doneHi: f.DoneMs, err: f.Error}
			groups[k] = g
			keys = append(keys, k)
		}
		g.n++
		g.sentLo, g.sentHi = min(g.sentLo, f.SentMs), max(g.sentHi, f.SentMs)
		g.doneLo, g.doneHi = min(g.doneLo, f.DoneMs), max(g.doneHi, f.DoneMs)
		if f.Reused {
			g.reused++
		}
		if f.Wrote {
			g.wrote++
		}
	}
	var out []string
	for _, k := range keys {
		g := groups[k]
		s := fmt.Sprintf("%s × %d, sent %+.0f … %+.0f, failed %+.0f … %+.0f; %d reused, %d written", k, g.n, g.sentLo, g.sentHi, g.doneLo, g.doneHi, g.reused, g.wrote)
		if g.err != "" {
			s += "; e.g. `" + strings.ReplaceAll(g.err, "`", "'") + "`"
		}
		out = append(out, s)
	}
	return out
}
