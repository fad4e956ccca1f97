package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is everything one harness run measured; it is written as JSON.
type Report struct {
	Started  time.Time       `json:"started"`
	Finished time.Time       `json:"finished"`
	Config   Config          `json:"config"`
	Env      Env             `json:"environment"`
	Notes    []string        `json:"notes,omitempty"`
	Runs     []TargetRun     `json:"runs"`
	Summary  []TargetSummary `json:"summary"`
	Ratios   []RatioRow      `json:"keyway_ratios,omitempty"`
	// SatSummary is the saturation mode's summary (-saturation).
	SatSummary []SatSummary `json:"saturation,omitempty"`
	// The paired mode (-pair): every round at every rate, and their
	// summary by rate.
	PairRuns    []PairRun     `json:"pair_runs,omitempty"`
	PairSummary []PairSummary `json:"pair,omitempty"`
	// Instr is the instruction-count mode's result (-instructions).
	Instr []InstrSummary `json:"instructions,omitempty"`
	// The body-throughput mode (-bodies): every run, and their summary
	// by target and size.
	BodyRuns    []BodyRun     `json:"body_runs,omitempty"`
	BodySummary []BodySummary `json:"bodies,omitempty"`
	// The restart mode (-restarts): every case in every round, and their
	// summary by case.
	RestartRuns    []RestartRun     `json:"restart_runs,omitempty"`
	RestartSummary []RestartSummary `json:"restarts,omitempty"`
}

// Env describes the machine and the software measured.
type Env struct {
	CPUs         int      `json:"cpus"`
	CPUModel     string   `json:"cpu_model"`
	Kernel       string   `json:"kernel"`
	GoVersion    string   `json:"go_version"`
	KeywaySource string   `json:"keyway_source"`
	Versions     []string `json:"versions"`
	LoadStart    string   `json:"loadavg_start"` // /proc/loadavg 1, 5, 15 min
	LoadEnd      string   `json:"loadavg_end"`
}

// TargetRun is one target in one round.
type TargetRun struct {
	Round      int            `json:"round"`
	Target     string         `json:"target"`
	LoadAvg    string         `json:"loadavg"` // /proc/loadavg when the target's turn began
	Throughput *throughputRun `json:"throughput,omitempty"`
	Latency    []latencyRun   `json:"latency,omitempty"`
	Idle       *idleRun       `json:"idle,omitempty"`
	Sparse     *sparseRun     `json:"sparse,omitempty"`
	// System calls per request by name ("all": every call), from perf
	// stat during an extra run in the last round (-syscalls), and the
	// process's context switches ("context-switches").
	Syscalls map[string]float64 `json:"syscalls_per_request,omitempty"`
	// The same at each fixed rate of -rates: an extra open-loop run per
	// rate in the last round (-syscalls).
	SyscallsAtRate map[int]map[string]float64 `json:"syscalls_per_request_at_rate,omitempty"`
	// With -tls: NewConn is the plain-HTTP run with a new connection per
	// request (the baseline of TLS's handshake run), and TLS the same
	// proxy terminating TLS (proxies only).
	NewConn *throughputRun `json:"new_conn,omitempty"`
	TLS     *tlsTargetRun  `json:"tls,omitempty"`
	// Saturation has one entry per load level (-saturation).
	Saturation []satLevel `json:"saturation,omitempty"`
	Failures   []string   `json:"failures,omitempty"`
}

// tlsTargetRun is one proxy terminating TLS in one round.
type tlsTargetRun struct {
	Probe *tlsProbe `json:"probe,omitempty"`
	// Throughput is keep-alive (as the plain throughput run); NewConn has
	// a new connection, so a full handshake, per request: its requests
	// are handshakes and its CPU per request is CPU per handshake.
	Throughput *throughputRun `json:"throughput,omitempty"`
	NewConn    *throughputRun `json:"handshakes,omitempty"`
	Idle       *idleRun       `json:"idle,omitempty"`
	Sparse     *sparseRun     `json:"sparse,omitempty"`
}

// Stat is the median and range of one number over rounds.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

func newStat(xs []float64) *Stat {
	xs = slices.DeleteFunc(slices.Clone(xs), func(x float64) bool { return math.IsNaN(x) || math.IsInf(x, 0) })
	if len(xs) == 0 {
		return nil
	}
	slices.Sort(xs)
	m := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		m = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return &Stat{Median: m, Min: xs[0], Max: xs[len(xs)-1], N: len(xs)}
}

// TargetSummary is one target over all rounds.
type TargetSummary struct {
	Target        string  `json:"target"`
	RPS           *Stat   `json:"rps,omitempty"`
	CPUUtil       *Stat   `json:"proxy_cpu_util,omitempty"`
	CPUPerReqUS   *Stat   `json:"proxy_cpu_us_per_request,omitempty"`
	SysPerReqUS   *Stat   `json:"proxy_sys_us_per_request,omitempty"`
	RPSPerCore    *Stat   `json:"rps_per_proxy_core,omitempty"`
	PeakRSSMiB    *Stat   `json:"proxy_peak_rss_mib,omitempty"`
	Errors        int64   `json:"throughput_errors"`
	SplitKeyShare float64 `json:"split_key_share_max"` // worst round
	KeysSeen      int     `json:"keys_seen_min"`
	Balance       *Stat   `json:"balance_max_over_mean,omitempty"`
	IdleBytes     *Stat   `json:"idle_bytes_per_conn,omitempty"`
	IdleRSSMiB    *Stat   `json:"idle_rss_with_mib,omitempty"`
	IdleBaseMiB   *Stat   `json:"idle_rss_before_mib,omitempty"`
	// The sparse-client run: CPU per request and the rate it came to.
	SparseCPUPerReqUS *Stat              `json:"sparse_cpu_us_per_request,omitempty"`
	SparseRate        *Stat              `json:"sparse_rate,omitempty"`
	SparseErrors      int64              `json:"sparse_errors"`
	Latency           []LatencySummary   `json:"latency,omitempty"`
	Syscalls          map[string]float64 `json:"syscalls_per_request,omitempty"` // last round
	// SyscallsAtRate: the same at each fixed rate, last round.
	SyscallsAtRate map[int]map[string]float64 `json:"syscalls_per_request_at_rate,omitempty"`
	TLS            *TLSSummary                `json:"tls,omitempty"`
	Failures       []string                   `json:"failures,omitempty"`
}

// TLSSummary is one proxy's TLS figures over all rounds, with the plain
// figures they are compared with.
type TLSSummary struct {
	// Negotiated is the last round's probe; Unfair lists every round whose
	// probe differs from what all targets must negotiate.
	Negotiated string   `json:"negotiated,omitempty"`
	Unfair     []string `json:"unfair,omitempty"`
	// Keep-alive over TLS.
	RPS         *Stat `json:"rps,omitempty"`
	CPUUtil     *Stat `json:"proxy_cpu_util,omitempty"`
	CPUPerReqUS *Stat `json:"proxy_cpu_us_per_request,omitempty"`
	RPSPerCore  *Stat `json:"rps_per_proxy_core,omitempty"`
	// CPUOverPlain is TLS ÷ plain CPU per request, keep-alive, same round.
	CPUOverPlain *Stat `json:"cpu_per_request_tls_over_plain,omitempty"`
	Errors       int64 `json:"errors"`
	// A new plain-HTTP connection per request: connections/s, proxy CPU,
	// CPU µs per connection, connections per proxy CPU-second.
	ConnRate     *Stat `json:"plain_conns_per_second,omitempty"`
	ConnCPUUtil  *Stat `json:"plain_conn_proxy_cpu_util,omitempty"`
	ConnCPUUS    *Stat `json:"plain_conn_proxy_cpu_us,omitempty"`
	ConnsPerCore *Stat `json:"plain_conns_per_proxy_core,omitempty"`
	ConnErrors   int64 `json:"plain_conn_errors"`
	// A new TLS connection (full handshake) per request.
	HandshakeRate     *Stat `json:"handshakes_per_second,omitempty"`
	HandshakeCPUUtil  *Stat `json:"handshake_proxy_cpu_util,omitempty"`
	HandshakeCPUUS    *Stat `json:"proxy_cpu_us_per_handshake,omitempty"`
	HandshakesPerCore *Stat `json:"handshakes_per_proxy_core,omitempty"`
	HandshakeErrors   int64 `json:"handshake_errors"`
	// HandshakeOverConnUS is the handshake's own CPU: µs per TLS
	// connection − µs per plain connection, same round.
	HandshakeOverConnUS *Stat `json:"proxy_cpu_us_per_handshake_over_plain_conn,omitempty"`
	// Memory per idle keep-alive TLS connection.
	IdleBytes *Stat `json:"idle_bytes_per_conn,omitempty"`
}

// LatencySummary is one target at one fixed rate over all rounds.
type LatencySummary struct {
	Rate     int   `json:"rate"`
	P50      *Stat `json:"p50_ms,omitempty"`
	P99      *Stat `json:"p99_ms,omitempty"`
	P999     *Stat `json:"p99_9_ms,omitempty"`
	Max      *Stat `json:"max_ms,omitempty"`
	AddedP50 *Stat `json:"added_p50_ms,omitempty"`
	AddedP99 *Stat `json:"added_p99_ms,omitempty"`
	Errors   int64 `json:"errors"`
	// The proxy's CPU over the measured part of each run (absent for
	// direct): µs per answered request and cores busy.
	CPUPerReqUS *Stat `json:"proxy_cpu_us_per_request,omitempty"`
	CPUUtil     *Stat `json:"proxy_cpu_util,omitempty"`
	// AchievedRate is what the load side sent, req/s; UnderRate lists the
	// rounds in which that was below heldShare of Rate.
	AchievedRate *Stat        `json:"achieved_rate,omitempty"`
	UnderRate    []int        `json:"under_rate_rounds,omitempty"`
	SendLagP99   *Stat        `json:"send_lag_p99_ms,omitempty"`
	Curve        []CurvePoint `json:"curve,omitempty"` // at each percentile, the median over rounds
}

// CurvePoint is one point of the latency percentile curve.
type CurvePoint struct {
	Percentile float64 `json:"percentile"`
	Ms         float64 `json:"ms"`
}

// RatioRow is keyway's value divided by another target's, computed per
// round (both measured in that round) and summarised over rounds.
type RatioRow struct {
	Metric string           `json:"metric"`
	Better string           `json:"better"` // "higher" or "lower" ratio is better for keyway
	Vs     map[string]*Stat `json:"vs"`
	Note   string           `json:"note,omitempty"`
}

// summarise fills Summary and Ratios from Runs.
func (r *Report) summarise() {
	byTarget := map[string][]TargetRun{}
	var order []string
	for _, run := range r.Runs {
		if _, ok := byTarget[run.Target]; !ok {
			order = append(order, run.Target)
		}
		byTarget[run.Target] = append(byTarget[run.Target], run)
	}
	slices.SortFunc(order, func(a, b string) int { return slices.Index(targetNames, a) - slices.Index(targetNames, b) })
	if r.Config.Instructions > 0 {
		r.Summary, r.Ratios = nil, nil
		return
	}
	if len(r.Config.Pair) > 0 {
		r.PairSummary = summarisePairs(r.PairRuns, r.Config.Rates)
		r.Summary, r.Ratios = nil, nil
		return
	}
	if len(r.Config.Bodies) > 0 {
		r.BodySummary = summariseBodies(r.BodyRuns, r.Config.Bodies)
		r.Summary, r.Ratios = nil, nil
		return
	}
	if r.Config.Restarts {
		r.RestartSummary = summariseRestarts(r.RestartRuns)
		r.Summary, r.Ratios = nil, nil
		return
	}
	r.addLatencyOverDirect()
	r.Summary = nil
	for _, name := range order {
		r.Summary = append(r.Summary, summariseTarget(name, byTarget[name], r.Config.Rates))
	}
	if r.Config.Saturation {
		r.SatSummary = summariseSaturation(r.Runs, r.Config.Sat.Factors)
		r.Ratios = nil
		return
	}
	r.Ratios = r.ratios(order)
}

// addLatencyOverDirect sets AddedP50/AddedP99 of every latency run from
// the direct run of the same round and rate.
func (r *Report) addLatencyOverDirect() {
	direct := map[[2]int]latencyRun{}
	for _, run := range r.Runs {
		if run.Target == "direct" {
			for _, l := range run.Latency {
				direct[[2]int{run.Round, l.Rate}] = l
			}
		}
	}
	for i := range r.Runs {
		for j := range r.Runs[i].Latency {
			l := &r.Runs[i].Latency[j]
			if d, ok := direct[[2]int{r.Runs[i].Round, l.Rate}]; ok {
				a50, a99 := l.P50-d.P50, l.P99-d.P99
				l.AddedP50, l.AddedP99 = &a50, &a99
			}
		}
	}
}

func summariseTarget(name string, runs []TargetRun, rates []int) TargetSummary {
	s := TargetSummary{Target: name, KeysSeen: -1}
	var rps, util, cpu, sys, perCore, peak, bal, idle, idleWith, idleBase, sparseCPU, sparseRate []float64
	for _, run := range runs {
		for _, f := range run.Failures {
			s.Failures = append(s.Failures, fmt.Sprintf("round %d: %s", run.Round, f))
		}
		if t := run.Throughput; t != nil {
			rps = append(rps, t.RPS)
			s.Errors += t.Errors
			if name != "direct" {
				util = append(util, t.CPUUtil)
				cpu = append(cpu, t.CPUPerReqUS)
				sys = append(sys, t.SysPerReqUS)
				perCore = append(perCore, t.RPSPerCore)
				peak = append(peak, float64(t.PeakRSSBytes)/(1<<20))
				bal = append(bal, t.Routing.Balance)
			}
			s.SplitKeyShare = max(s.SplitKeyShare, t.Routing.Affinity)
			if s.KeysSeen < 0 || t.Routing.KeysSeen < s.KeysSeen {
				s.KeysSeen = t.Routing.KeysSeen
			}
		}
		if run.Syscalls != nil {
			s.Syscalls = run.Syscalls
		}
		if run.SyscallsAtRate != nil {
			s.SyscallsAtRate = run.SyscallsAtRate
		}
		if run.TLS != nil || run.NewConn != nil {
			if s.TLS == nil {
				s.TLS = &TLSSummary{}
			}
		}
		if sp := run.Sparse; sp != nil {
			sparseCPU, sparseRate = append(sparseCPU, sp.CPUPerReqUS), append(sparseRate, sp.Rate)
			s.SparseErrors += sp.Errors
		}
		if i := run.Idle; i != nil {
			idle = append(idle, i.BytesPerConn)
			idleWith = append(idleWith, float64(i.RSSWith)/(1<<20))
			idleBase = append(idleBase, float64(i.RSSBefore)/(1<<20))
		}
	}
	s.KeysSeen = max(s.KeysSeen, 0)
	if s.TLS != nil {
		summariseTLS(s.TLS, runs)
	}
	s.RPS, s.CPUUtil, s.CPUPerReqUS, s.RPSPerCore, s.PeakRSSMiB = newStat(rps), newStat(util), newStat(cpu), newStat(perCore), newStat(peak)
	s.Balance, s.IdleBytes, s.IdleRSSMiB, s.IdleBaseMiB = newStat(bal), newStat(idle), newStat(idleWith), newStat(idleBase)
	s.SparseCPUPerReqUS, s.SparseRate, s.SysPerReqUS = newStat(sparseCPU), newStat(sparseRate), newStat(sys)
	for _, rate := range rates {
		ls := LatencySummary{Rate: rate}
		var p50, p99, p999, mx, a50, a99, cpu, util, achieved, lag []float64
		var curves [][]CurvePoint
		for _, run := range runs {
			for _, l := range run.Latency {
				if l.Rate != rate {
					continue
				}
				p50, p99, p999, mx = append(p50, l.P50), append(p99, l.P99), append(p999, l.P999), append(mx, l.Max)
				if l.AddedP50 != nil && name != "direct" {
					a50, a99 = append(a50, *l.AddedP50), append(a99, *l.AddedP99)
				}
				if l.CPUPerReqUS != nil {
					cpu = append(cpu, *l.CPUPerReqUS)
				}
				if l.CPUUtil != nil {
					util = append(util, *l.CPUUtil)
				}
				if l.AchievedRate > 0 {
					achieved, lag = append(achieved, l.AchievedRate), append(lag, l.SendLagP99)
				}
				if l.underRate() {
					ls.UnderRate = append(ls.UnderRate, run.Round)
				}
				ls.Errors += l.Errors
				if len(l.samples) > 0 {
					curves = append(curves, curve(l.samples))
				}
			}
		}
		if len(p50) == 0 {
			continue
		}
		ls.P50, ls.P99, ls.P999, ls.Max = newStat(p50), newStat(p99), newStat(p999), newStat(mx)
		ls.AddedP50, ls.AddedP99 = newStat(a50), newStat(a99)
		ls.CPUPerReqUS, ls.CPUUtil, ls.AchievedRate, ls.SendLagP99 = newStat(cpu), newStat(util), newStat(achieved), newStat(lag)
		ls.Curve = medianCurve(curves)
		s.Latency = append(s.Latency, ls)
	}
	return s
}

// summariseTLS fills s from the TLS and new-connection runs.
func summariseTLS(s *TLSSummary, runs []TargetRun) {
	var rps, util, cpu, perCore, over, cRate, cUtil, cCPU, cPer, hRate, hUtil, hCPU, hPer, hOver, idle []float64
	for _, run := range runs {
		if c := run.NewConn; c != nil {
			cRate, cUtil, cCPU, cPer = append(cRate, c.RPS), append(cUtil, c.CPUUtil), append(cCPU, c.CPUPerReqUS), append(cPer, c.RPSPerCore)
			s.ConnErrors += c.Errors
		}
		t := run.TLS
		if t == nil {
			continue
		}
		if p := t.Probe; p != nil {
			s.Negotiated = p.String()
			if why := p.fair(); why != "" {
				s.Unfair = append(s.Unfair, fmt.Sprintf("round %d: %s", run.Round, why))
			}
		}
		if k := t.Throughput; k != nil {
			rps, util, cpu, perCore = append(rps, k.RPS), append(util, k.CPUUtil), append(cpu, k.CPUPerReqUS), append(perCore, k.RPSPerCore)
			s.Errors += k.Errors
			if p := run.Throughput; p != nil && p.CPUPerReqUS > 0 && k.CPUPerReqUS > 0 {
				over = append(over, k.CPUPerReqUS/p.CPUPerReqUS)
			}
		}
		if h := t.NewConn; h != nil {
			hRate, hUtil, hCPU, hPer = append(hRate, h.RPS), append(hUtil, h.CPUUtil), append(hCPU, h.CPUPerReqUS), append(hPer, h.RPSPerCore)
			s.HandshakeErrors += h.Errors
			if c := run.NewConn; c != nil && c.CPUPerReqUS > 0 && h.CPUPerReqUS > 0 {
				hOver = append(hOver, h.CPUPerReqUS-c.CPUPerReqUS)
			}
		}
		if i := t.Idle; i != nil {
			idle = append(idle, i.BytesPerConn)
		}
	}
	s.RPS, s.CPUUtil, s.CPUPerReqUS, s.RPSPerCore, s.CPUOverPlain = newStat(rps), newStat(util), newStat(cpu), newStat(perCore), newStat(over)
	s.ConnRate, s.ConnCPUUtil, s.ConnCPUUS, s.ConnsPerCore = newStat(cRate), newStat(cUtil), newStat(cCPU), newStat(cPer)
	s.HandshakeRate, s.HandshakeCPUUtil, s.HandshakeCPUUS, s.HandshakesPerCore = newStat(hRate), newStat(hUtil), newStat(hCPU), newStat(hPer)
	s.IdleBytes, s.HandshakeOverConnUS = newStat(idle), newStat(hOver)
}

// curve samples the percentile curve of sorted latencies from p50 to
// p99.99, evenly on the log scale of 1/(1-p).
func curve(sorted []time.Duration) []CurvePoint {
	if len(sorted) == 0 {
		return nil
	}
	const points = 61
	lo, hi := math.Log10(2), 4.0 // p50 .. p99.99
	out := make([]CurvePoint, 0, points)
	for i := range points {
		x := lo + (hi-lo)*float64(i)/(points-1)
		p := 100 * (1 - math.Pow(10, -x))
		out = append(out, CurvePoint{Percentile: p, Ms: ms(percentile(sorted, p))})
	}
	return out
}

// medianCurve is, at each percentile, the median of the curves' values:
// the plot's counterpart of the tables' median over rounds, which one bad
// round cannot dominate the way it would dominate pooled samples.
func medianCurve(curves [][]CurvePoint) []CurvePoint {
	if len(curves) == 0 {
		return nil
	}
	out := make([]CurvePoint, len(curves[0]))
	for i := range out {
		var xs []float64
		for _, c := range curves {
			xs = append(xs, c[i].Ms)
		}
		out[i] = CurvePoint{Percentile: curves[0][i].Percentile, Ms: newStat(xs).Median}
	}
	return out
}

// ratioMetric extracts one number from a run; ok is false when the run
// does not have it.
type ratioMetric struct {
	name, better, note string
	value              func(TargetRun) (float64, bool)
	proxiesOnly        bool // meaningless against direct
	// rate is the fixed rate of a latency run's metric (0: none): a round
	// where either side's load generator did not hold it is noted.
	rate int
}

func (r *Report) ratioMetrics() []ratioMetric {
	ms := []ratioMetric{
		{name: "throughput, req/s with the proxy on one core", better: "higher", value: func(run TargetRun) (float64, bool) {
			return tput(run, func(t *throughputRun) float64 { return t.RPS })
		}},
		{name: "throughput per proxy core, req per CPU-second", better: "higher", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			return tput(run, func(t *throughputRun) float64 { return t.RPSPerCore })
		}},
		{name: "proxy CPU µs per request, saturated (throughput run)", better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			return tput(run, func(t *throughputRun) float64 { return t.CPUPerReqUS })
		}},
	}
	for _, rate := range r.Config.Rates {
		ms = append(ms,
			ratioMetric{name: fmt.Sprintf("proxy CPU µs per request at %d/s", rate), better: "lower", proxiesOnly: true, rate: rate, value: lat(rate, func(l latencyRun) *float64 { return l.CPUPerReqUS })},
			ratioMetric{name: fmt.Sprintf("p50 latency at %d/s", rate), better: "lower", rate: rate, value: lat(rate, func(l latencyRun) *float64 { return &l.P50 })},
			ratioMetric{name: fmt.Sprintf("p99 latency at %d/s", rate), better: "lower", rate: rate, value: lat(rate, func(l latencyRun) *float64 { return &l.P99 })},
			ratioMetric{name: fmt.Sprintf("added p50 over direct at %d/s", rate), better: "lower", proxiesOnly: true, rate: rate, value: lat(rate, func(l latencyRun) *float64 { return l.AddedP50 })},
			ratioMetric{name: fmt.Sprintf("added p99 over direct at %d/s", rate), better: "lower", proxiesOnly: true, rate: rate, value: lat(rate, func(l latencyRun) *float64 { return l.AddedP99 })},
		)
	}
	ms = append(ms,
		ratioMetric{name: "balance, max/mean requests per replica", better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			return tput(run, func(t *throughputRun) float64 { return t.Routing.Balance })
		}},
		ratioMetric{name: "bytes per idle keep-alive connection", better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			if run.Idle == nil {
				return 0, false
			}
			return run.Idle.BytesPerConn, true
		}},
		ratioMetric{name: fmt.Sprintf("proxy CPU µs per request, %d connections each sending every %v", r.Config.SparseConns, r.Config.SparsePeriod), better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			if run.Sparse == nil {
				return 0, false
			}
			return run.Sparse.CPUPerReqUS, true
		}},
		ratioMetric{name: "peak RSS under the throughput run", better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			return tput(run, func(t *throughputRun) float64 { return float64(t.PeakRSSBytes) })
		}},
	)
	if r.Config.TLS {
		ms = append(ms, tlsRatioMetrics()...)
	}
	return ms
}

// tlsRatioMetrics are the -tls figures compared between proxies.
func tlsRatioMetrics() []ratioMetric {
	tlsKA := func(f func(*throughputRun) float64) func(TargetRun) (float64, bool) {
		return func(run TargetRun) (float64, bool) {
			if run.TLS == nil || run.TLS.Throughput == nil {
				return 0, false
			}
			return f(run.TLS.Throughput), true
		}
	}
	tlsHS := func(f func(*throughputRun) float64) func(TargetRun) (float64, bool) {
		return func(run TargetRun) (float64, bool) {
			if run.TLS == nil || run.TLS.NewConn == nil {
				return 0, false
			}
			return f(run.TLS.NewConn), true
		}
	}
	rps := func(t *throughputRun) float64 { return t.RPS }
	cpu := func(t *throughputRun) float64 { return t.CPUPerReqUS }
	perCore := func(t *throughputRun) float64 { return t.RPSPerCore }
	return []ratioMetric{
		{name: "TLS keep-alive: req/s with the proxy on one core", better: "higher", proxiesOnly: true, value: tlsKA(rps)},
		{name: "TLS keep-alive: proxy CPU µs per request", better: "lower", proxiesOnly: true, value: tlsKA(cpu)},
		{name: "TLS keep-alive: req per proxy CPU-second", better: "higher", proxiesOnly: true, value: tlsKA(perCore)},
		{name: "TLS ÷ plain proxy CPU per request (keep-alive)", better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			if run.TLS == nil || run.TLS.Throughput == nil || run.Throughput == nil || run.Throughput.CPUPerReqUS <= 0 {
				return 0, false
			}
			return run.TLS.Throughput.CPUPerReqUS / run.Throughput.CPUPerReqUS, true
		}},
		{name: "plain, new connection per request: proxy CPU µs per connection", better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			if run.NewConn == nil {
				return 0, false
			}
			return run.NewConn.CPUPerReqUS, true
		}},
		{name: "TLS handshakes/s with the proxy on one core", better: "higher", proxiesOnly: true, value: tlsHS(rps)},
		{name: "TLS handshakes per proxy CPU-second", better: "higher", proxiesOnly: true, value: tlsHS(perCore)},
		{name: "proxy CPU µs per TLS handshake (new connection per request)", better: "lower", proxiesOnly: true, value: tlsHS(cpu)},
		{name: "bytes per idle keep-alive TLS connection", better: "lower", proxiesOnly: true, value: func(run TargetRun) (float64, bool) {
			if run.TLS == nil || run.TLS.Idle == nil {
				return 0, false
			}
			return run.TLS.Idle.BytesPerConn, true
		}},
	}
}

func tput(run TargetRun, f func(*throughputRun) float64) (float64, bool) {
	if run.Throughput == nil {
		return 0, false
	}
	return f(run.Throughput), true
}

// underRateAt reports whether run has a latency run at rate whose load
// generator did not hold the rate.
func underRateAt(run TargetRun, rate int) bool {
	for _, l := range run.Latency {
		if l.Rate == rate && l.underRate() {
			return true
		}
	}
	return false
}

func lat(rate int, f func(latencyRun) *float64) func(TargetRun) (float64, bool) {
	return func(run TargetRun) (float64, bool) {
		for _, l := range run.Latency {
			if l.Rate == rate {
				if v := f(l); v != nil {
					return *v, true
				}
			}
		}
		return 0, false
	}
}

// ratios divides keyway's value by each other target's, round by round.
// A round where the other value is zero or negative (an added latency
// lost in noise) gives no ratio.
func (r *Report) ratios(order []string) []RatioRow {
	if !slices.Contains(order, "keyway") {
		return nil
	}
	runs := map[string]map[int]TargetRun{}
	for _, run := range r.Runs {
		if runs[run.Target] == nil {
			runs[run.Target] = map[int]TargetRun{}
		}
		runs[run.Target][run.Round] = run
	}
	var rows []RatioRow
	for _, m := range r.ratioMetrics() {
		row := RatioRow{Metric: m.name, Better: m.better, Vs: map[string]*Stat{}}
		for _, other := range order {
			if other == "keyway" || (m.proxiesOnly && other == "direct") {
				continue
			}
			var xs []float64
			dropped, under := 0, 0
			for round, k := range runs["keyway"] {
				o, ok := runs[other][round]
				if !ok {
					continue
				}
				kv, ok1 := m.value(k)
				ov, ok2 := m.value(o)
				if !ok1 || !ok2 {
					continue
				}
				if ov <= 0 || kv < 0 {
					dropped++
					continue
				}
				xs = append(xs, kv/ov)
				if m.rate > 0 && (underRateAt(k, m.rate) || underRateAt(o, m.rate)) {
					under++
				}
			}
			if st := newStat(xs); st != nil {
				row.Vs[other] = st
			}
			if dropped > 0 {
				row.Note = strings.TrimSpace(row.Note + fmt.Sprintf(" %s: %d round(s) without a ratio (keyway's value < 0 or the other's ≤ 0).", other, dropped))
			}
			if under > 0 {
				row.Note = strings.TrimSpace(row.Note + fmt.Sprintf(" %s: %d of %d ratio(s) include a run whose load side sent under %.0f%% of %d/s.", other, under, len(xs), 100*heldShare, m.rate))
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// writeFiles writes results.json, results.md and one latency plot per rate
// into dir.
func writeFiles(r *Report, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "results.json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	files = append(files, path)
	path = filepath.Join(dir, "results.md")
	if err := os.WriteFile(path, []byte(r.Markdown()), 0o644); err != nil {
		return nil, err
	}
	files = append(files, path)
	for _, rate := range r.Config.Rates {
		if r.Config.Saturation || len(r.Config.Pair) > 0 || r.Config.Instructions > 0 || len(r.Config.Bodies) > 0 || r.Config.Restarts {
			break
		}
		path := filepath.Join(dir, fmt.Sprintf("latency-%d.svg", rate))
		if err := os.WriteFile(path, []byte(r.plot(rate)), 0o644); err != nil {
			return nil, err
		}
		files = append(files, path)
	}
	return files, nil
}
