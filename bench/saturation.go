package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Saturation mode (-saturation): the replicas get a fixed service capacity
// (each serves at most Concurrency requests at once, each taking Service),
// and each proxy is loaded open loop past it. For each load level, on a
// fresh proxy process, one vegeta attack runs three phases back to back:
//
//	base      BaseFactor × capacity for Base      the unloaded latency of this run
//	load      Factor × capacity for Duration      goodput, shedding, admitted latency, memory
//	recovery  BaseFactor × capacity for Recovery  how long until latency is normal again
//
// The rate changes inside one attack (satPacer), so the drop to the base
// rate happens on schedule even while answers to the overload are still
// outstanding.

// SatConfig is the saturation run's shape; see the -sat-* flags.
type SatConfig struct {
	Concurrency int           `json:"replica_concurrency"` // requests one replica serves at once
	Service     time.Duration `json:"replica_service"`     // service time of one request
	Factors     []float64     `json:"factors"`             // load levels, × capacity
	BaseFactor  float64       `json:"base_factor"`         // the unloaded rate before and after, × capacity
	Base        time.Duration `json:"base"`                // length of the base phase
	Duration    time.Duration `json:"duration"`            // length of each overload phase
	Recovery    time.Duration `json:"recovery"`            // length of the phase after the drop
	Timeout     time.Duration `json:"client_timeout"`      // the load generator gives up after this
	// Window, Step, Bound and Hold define the time to recover: the first
	// window start after the drop from which every window (Window long,
	// starting every Step) for Hold has a p99 within Bound × the base
	// phase's p99.
	Window time.Duration `json:"recovery_window"`
	Step   time.Duration `json:"recovery_step"`
	Bound  float64       `json:"recovery_bound"`
	Hold   time.Duration `json:"recovery_hold"`
}

// capacity is what the replicas can serve, requests per second.
func (s *SatConfig) capacity(replicas int) float64 {
	return float64(replicas*s.Concurrency) / s.Service.Seconds()
}

func (s *SatConfig) validate() error {
	var errs []error
	if s.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("sat-concurrency %d: must be at least 1", s.Concurrency))
	}
	if s.Service < time.Millisecond {
		errs = append(errs, fmt.Errorf("sat-service %v: must be at least 1ms", s.Service))
	}
	if len(s.Factors) == 0 {
		errs = append(errs, errors.New("sat-levels: no load level"))
	}
	for _, f := range slices.Concat(s.Factors, []float64{s.BaseFactor}) {
		if !(f > 0) {
			errs = append(errs, fmt.Errorf("load factor %v: must be positive", f))
		}
	}
	if s.Base < time.Second || s.Duration < time.Second || s.Recovery < time.Second {
		errs = append(errs, errors.New("sat-base, sat-duration and sat-recovery must be at least 1s"))
	}
	if s.Timeout <= 0 || s.Window <= 0 || s.Step <= 0 || s.Hold < 0 || s.Bound <= 1 {
		errs = append(errs, errors.New("sat-timeout, the recovery window and step must be positive, the hold ≥ 0 and the bound > 1"))
	}
	return errors.Join(errs...)
}

func parseFactors(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		x, err := strconv.ParseFloat(f, 64)
		if err != nil || !(x > 0) {
			return nil, fmt.Errorf("-sat-levels: %q is not a positive number", f)
		}
		out = append(out, x)
	}
	return out, nil
}

// satTargetConfig is what a proxy's overload settings are derived from:
// the replicas' capacity.
type satTargetConfig struct {
	concurrency int
	service     time.Duration
}

// keywayOverload is what saturation mode adds to keyway's configuration,
// as YAML lines without indentation: under server, as new top-level keys,
// and under the replica set.
type keywayOverload struct {
	server, top, set []string
}

// keywaySaturation returns keyway's overload settings, derived from the
// replicas' capacity exactly as HAProxy's are: at most the replica's
// concurrency in flight to it, a queue of as many, each waiting at most
// max(2 × service, 100 ms); beyond, 503 at once. The heap bound is the
// one the acceptance figure is checked against (satHeapBound).
func keywaySaturation(s *satTargetConfig) keywayOverload {
	wait := max(2*s.service, 100*time.Millisecond)
	return keywayOverload{
		server: []string{fmt.Sprintf("max_heap_bytes: %dMiB", satHeapBound>>20)},
		set: []string{fmt.Sprintf("limits: {max_inflight_per_replica: %d, max_queued_per_replica: %d, max_queue_wait: %dms}",
			s.concurrency, s.concurrency, wait.Milliseconds())},
	}
}

// satHeapBound is keyway's server.max_heap_bytes in saturation runs.
const satHeapBound = 64 << 20

// haproxySaturation returns the options added to each server line and
// the lines added to the backend. maxconn caps the connections to a
// replica at its concurrency; requests beyond wait in that server's queue
// (the key stays on its replica: no redispatch). maxqueue bounds the queue
// to one service time's worth of requests, and timeout queue bounds the
// wait; beyond either, HAProxy answers 503 at once.
func haproxySaturation(s *satTargetConfig) (server string, backend []string) {
	wait := max(2*s.service, 100*time.Millisecond)
	return fmt.Sprintf(" maxconn %d maxqueue %d", s.concurrency, s.concurrency),
		[]string{fmt.Sprintf("timeout queue %dms", wait.Milliseconds())}
}

// satSkipped names the targets the saturation mode does not measure, and
// why; keyway and haproxy are measured.
var satSkipped = map[string]string{
	"direct":  "saturation: direct skipped (no proxy to shed)",
	"nginx":   "saturation: nginx skipped: open-source nginx has no bounded queue (the upstream `queue` directive is NGINX Plus only); `max_conns` on a hashed upstream sends the excess to the next server, which breaks key affinity, then answers 502",
	"caddy":   "saturation: caddy skipped: reverse_proxy has no per-upstream queue bound",
	"gofloor": "saturation: gofloor skipped: the floor proxy has no overload bounds",
}

// satPhaseName names the phases of a level's attack.
var satPhaseName = [3]string{"base", "load", "recovery"}

// satPacer sends at a piecewise constant rate: rates[i] requests per
// second for durs[i], one phase after the other.
type satPacer struct {
	durs  []time.Duration
	rates []float64
}

// due returns when hit k (0-based) is due and its phase; ok is false past
// the last phase.
func (p satPacer) due(k uint64) (at time.Duration, phase int, ok bool) {
	var start time.Duration
	acc := 0.0
	for i, d := range p.durs {
		n := p.rates[i] * d.Seconds()
		if float64(k) < acc+n {
			return start + time.Duration((float64(k)-acc)/p.rates[i]*float64(time.Second)), i, true
		}
		acc += n
		start += d
	}
	return start, len(p.durs), false
}

func (p satPacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	at, _, ok := p.due(hits)
	if !ok {
		return 0, true
	}
	return max(at-elapsed, 0), false
}

func (p satPacer) Rate(elapsed time.Duration) float64 {
	var start time.Duration
	for i, d := range p.durs {
		if start += d; elapsed < start {
			return p.rates[i]
		}
	}
	return 0
}

// satOutcome classifies an answer.
type satOutcome uint8

const (
	satOK      satOutcome = iota // 2xx: admitted and served
	satShed                      // any other status: answered without being served
	satTimeout                   // the load generator gave up (client timeout)
	satError                     // any other transport error
)

// satSample is one request of a level's attack.
type satSample struct {
	at      time.Duration // sent, since the attack began
	latency time.Duration
	code    uint16
	outcome satOutcome
	err     string // the transport error, if any
}

// classify sorts an answer. vegeta sets the error to the status line for
// every status outside 2xx-3xx, so a status code decides first.
func classify(code uint16, err string) satOutcome {
	switch {
	case err == "" && code >= 200 && code <= 299:
		return satOK
	case code > 0:
		return satShed
	case strings.Contains(err, "Client.Timeout") || strings.Contains(err, "deadline exceeded") || strings.Contains(err, "timeout"):
		return satTimeout
	default:
		return satError
	}
}

// satPhase is one phase of a level: the requests sent during it and what
// became of them.
type satPhase struct {
	Offered  float64 `json:"offered_rps"`
	Seconds  float64 `json:"seconds"`
	Requests int64   `json:"requests"`
	// Goodput is the 2xx answers that arrived during the phase ÷ its
	// length, whenever their requests were sent: what the proxy served
	// while the phase's load was on. Every other field counts the
	// requests sent during the phase.
	Goodput   float64 `json:"goodput_rps"`
	OKShare   float64 `json:"ok_share"`
	ShedShare float64 `json:"shed_share"` // non-2xx answers
	// ShedByStatus counts the non-2xx answers by status code.
	ShedByStatus map[string]int64 `json:"shed_by_status,omitempty"`
	ShedP99      float64          `json:"shed_p99_ms,omitempty"` // how quickly they came
	TimeoutShare float64          `json:"timeout_share"`
	ErrorShare   float64          `json:"error_share"`
	FirstError   string           `json:"first_error,omitempty"`
	// Latency of the admitted (2xx) requests, ms.
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// summarisePhase summarises the samples of one phase of the given length.
func summarisePhase(samples []satSample, offered float64, length time.Duration) satPhase {
	p := satPhase{Offered: offered, Seconds: length.Seconds(), Requests: int64(len(samples))}
	var ok, shed []time.Duration
	var timeouts, errs int64
	for _, s := range samples {
		switch s.outcome {
		case satOK:
			ok = append(ok, s.latency)
		case satShed:
			shed = append(shed, s.latency)
			if p.ShedByStatus == nil {
				p.ShedByStatus = map[string]int64{}
			}
			p.ShedByStatus[strconv.Itoa(int(s.code))]++
		case satTimeout:
			timeouts++
		default:
			errs++
		}
		if (s.outcome == satTimeout || s.outcome == satError) && p.FirstError == "" {
			p.FirstError = s.err
		}
	}
	if n := float64(len(samples)); n > 0 {
		p.OKShare, p.ShedShare = float64(len(ok))/n, float64(len(shed))/n
		p.TimeoutShare, p.ErrorShare = float64(timeouts)/n, float64(errs)/n
	}
	slices.Sort(ok)
	slices.Sort(shed)
	if len(ok) > 0 {
		p.P50, p.P99, p.Max = ms(percentile(ok, 50)), ms(percentile(ok, 99)), ms(ok[len(ok)-1])
	}
	if len(shed) > 0 {
		p.ShedP99 = ms(percentile(shed, 99))
	}
	return p
}

// goodput is the rate of 2xx answers that arrived in [from, to).
func goodput(samples []satSample, from, to time.Duration) float64 {
	n := 0
	for _, s := range samples {
		if end := s.at + s.latency; s.outcome == satOK && end >= from && end < to {
			n++
		}
	}
	if to <= from {
		return 0
	}
	return float64(n) / (to - from).Seconds()
}

// recoveryTime is how long after from the latency is normal again: the
// start of the first window (window long, starting every step from from)
// such that it and every window starting within hold after it have a p99
// of at most bound. Requests are placed by when they were sent; an answer
// that is not 2xx counts as infinitely slow, so a window that sheds or
// times out more than 1% of its requests is not normal. Windows must end
// by to; a window with no request is not normal either (nothing was
// served). ok is false when no such window exists.
func recoveryTime(samples []satSample, from, to, window, step, hold time.Duration, bound time.Duration) (time.Duration, bool) {
	sorted := slices.Clone(samples)
	slices.SortFunc(sorted, func(a, b satSample) int { return int(a.at - b.at) })
	normal := func(start time.Duration) bool {
		lo, _ := slices.BinarySearchFunc(sorted, start, func(s satSample, t time.Duration) int { return int(s.at - t) })
		hi, _ := slices.BinarySearchFunc(sorted, start+window, func(s satSample, t time.Duration) int { return int(s.at - t) })
		if hi <= lo {
			return false
		}
		lat := make([]time.Duration, 0, hi-lo)
		for _, s := range sorted[lo:hi] {
			if s.outcome != satOK {
				lat = append(lat, time.Duration(math.MaxInt64))
			} else {
				lat = append(lat, s.latency)
			}
		}
		slices.Sort(lat)
		return percentile(lat, 99) <= bound
	}
	var good []bool // good[i]: the window starting at from + i×step
	for start := from; start+window <= to; start += step {
		good = append(good, normal(start))
	}
	need := int(hold / step)
	for i := range good {
		if i+need >= len(good) {
			break
		}
		if !slices.Contains(good[i:i+need+1], false) {
			return time.Duration(i) * step, true
		}
	}
	return 0, false
}

// satLevel is one load level on one fresh proxy process.
type satLevel struct {
	Factor   float64  `json:"factor"`
	Base     satPhase `json:"base"`
	Load     satPhase `json:"load"`
	Recovery satPhase `json:"recovery"`
	// P99OverBase is the load phase's admitted p99 ÷ the base phase's.
	P99OverBase float64 `json:"p99_over_base"`
	// RecoverySeconds is the time to recover (recoveryTime); nil when
	// latency was not normal again within the recovery phase.
	RecoverySeconds *float64 `json:"recovery_seconds"`
	// Memory: VmHWM of the process tree after the level; for keyway, the
	// highest go_memstats_heap_inuse_bytes sampled every 250ms; and the
	// highest VmRSS sampled.
	PeakRSSBytes    int64   `json:"peak_rss_bytes"`
	SampledRSSBytes int64   `json:"sampled_max_rss_bytes"`
	PeakHeapBytes   float64 `json:"peak_heap_inuse_bytes,omitempty"`
	// SendLag is how late vegeta sent requests against the schedule
	// (p99 and max, ms). More than a few ms means the load side was
	// starved: the load was not open loop on schedule, and the latencies
	// include the load generator's own stall.
	SendLagP99 float64 `json:"send_lag_p99_ms"`
	SendLagMax float64 `json:"send_lag_max_ms"`
	// Timeline is the whole attack second by second, by when requests
	// were sent.
	Timeline []satSecond `json:"timeline"`
	Failure  string      `json:"failure,omitempty"`
}

// satSecond is one second of a level's attack.
type satSecond struct {
	Second   int     `json:"second"`
	Sent     int     `json:"sent"`
	OK       int     `json:"ok"`
	Shed     int     `json:"shed"`
	Timeouts int     `json:"timeouts"`
	Errors   int     `json:"errors"`
	P50      float64 `json:"p50_ms"` // of the 2xx answers
	P99      float64 `json:"p99_ms"`
}

// timelineOf buckets samples by the second they were sent in.
func timelineOf(samples []satSample) []satSecond {
	var out []satSecond
	lat := map[int][]time.Duration{}
	for _, s := range samples {
		i := int(s.at / time.Second)
		for len(out) <= i {
			out = append(out, satSecond{Second: len(out)})
		}
		b := &out[i]
		b.Sent++
		switch s.outcome {
		case satOK:
			b.OK++
			lat[i] = append(lat[i], s.latency)
		case satShed:
			b.Shed++
		case satTimeout:
			b.Timeouts++
		default:
			b.Errors++
		}
	}
	for i, l := range lat {
		slices.Sort(l)
		out[i].P50, out[i].P99 = ms(percentile(l, 50)), ms(percentile(l, 99))
	}
	return out
}

// measureSaturation runs every level of the saturation mode against t.
func (h *Harness) measureSaturation(ctx context.Context, t *target, round int) TargetRun {
	run := TargetRun{Round: round + 1, Target: t.name, LoadAvg: loadAvg()}
	sc := h.cfg.Sat
	capacity := sc.capacity(h.cfg.Replicas)
	for li, f := range sc.Factors {
		if ctx.Err() != nil {
			break
		}
		lv := h.satLevel(ctx, t, f, capacity, uint64(round*1000+li*10+501))
		if lv.Failure != "" {
			run.Failures = append(run.Failures, fmt.Sprintf("%g×: %s", f, lv.Failure))
			h.logf("%s round %d: %g× failed: %s", t.name, round+1, f, lv.Failure)
		} else {
			rec := "not recovered"
			if lv.RecoverySeconds != nil {
				rec = fmt.Sprintf("recovered in %.1fs", *lv.RecoverySeconds)
			}
			h.logf("%s round %d: %g× (%.0f/s): goodput %.0f/s, shed %.1f%% %v, timeouts %.1f%%, errors %.1f%%, admitted p50 %.1f p99 %.1f ms (base p99 %.1f ms, ×%.1f), %s, peak RSS %.1f MiB, heap %.1f MiB",
				t.name, round+1, f, lv.Load.Offered, lv.Load.Goodput, 100*lv.Load.ShedShare, lv.Load.ShedByStatus, 100*lv.Load.TimeoutShare, 100*lv.Load.ErrorShare,
				lv.Load.P50, lv.Load.P99, lv.Base.P99, lv.P99OverBase, rec, float64(lv.PeakRSSBytes)/(1<<20), lv.PeakHeapBytes/(1<<20))
		}
		run.Saturation = append(run.Saturation, lv)
	}
	return run
}

// satLevel starts a fresh process, runs the three phases at factor ×
// capacity, stops it and waits until the replicas have served what was
// queued, so that the next level starts from idle replicas.
func (h *Harness) satLevel(ctx context.Context, t *target, factor, capacity float64, seed uint64) (lv satLevel) {
	sc := h.cfg.Sat
	lv.Factor = factor
	defer func() {
		if err := h.waitReplicasIdle(ctx, 2*time.Minute); err != nil && lv.Failure == "" {
			lv.Failure = err.Error()
		}
	}()
	rt, err := h.start(ctx, t, h.cfg.IdleConns+12048, nil)
	if err != nil {
		lv.Failure = "start: " + err.Error()
		return lv
	}
	defer rt.stop()

	base, load := sc.BaseFactor*capacity, factor*capacity
	pacer := satPacer{durs: []time.Duration{sc.Base, sc.Duration, sc.Recovery}, rates: []float64{base, load, base}}
	// Memory sampler: the highest RSS, and keyway's heap.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if m, err := treeMem(rt.p.pid()); err == nil {
				lv.SampledRSSBytes = max(lv.SampledRSSBytes, m.rss)
			}
			if rt.admin != "" {
				sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				if g, err := scrapeGoMem(sctx, rt.admin); err == nil {
					lv.PeakHeapBytes = max(lv.PeakHeapBytes, g.HeapInuse)
				}
				cancel()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	samples := satAttack(ctx, rt.addr, &h.cfg, pacer, seed)
	close(stop)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		lv.Failure = err.Error()
		return lv
	}
	if m, err := treeMem(rt.p.pid()); err == nil {
		lv.PeakRSSBytes = m.hwm
	}
	if !rt.p.alive() {
		lv.Failure = fmt.Sprintf("%s exited during the run: %v\n%s", t.name, rt.p.err, rt.p.tail(1500))
	}
	var byPhase [3][]satSample
	all := make([]satSample, 0, len(samples))
	lags := make([]time.Duration, 0, len(samples))
	for _, s := range samples {
		all = append(all, s.satSample)
		due, ph, ok := pacer.due(uint64(s.seq))
		lags = append(lags, max(s.at-due, 0))
		if ok {
			byPhase[ph] = append(byPhase[ph], s.satSample)
		}
	}
	lv.Timeline = timelineOf(all)
	slices.Sort(lags)
	if len(lags) > 0 {
		lv.SendLagP99, lv.SendLagMax = ms(percentile(lags, 99)), ms(lags[len(lags)-1])
	}
	lv.Base = summarisePhase(byPhase[0], base, sc.Base)
	lv.Load = summarisePhase(byPhase[1], load, sc.Duration)
	lv.Recovery = summarisePhase(byPhase[2], base, sc.Recovery)
	lv.Base.Goodput = goodput(all, 0, sc.Base)
	lv.Load.Goodput = goodput(all, sc.Base, sc.Base+sc.Duration)
	lv.Recovery.Goodput = goodput(all, sc.Base+sc.Duration, sc.Base+sc.Duration+sc.Recovery)
	if lv.Base.P99 > 0 {
		lv.P99OverBase = lv.Load.P99 / lv.Base.P99
		drop := sc.Base + sc.Duration
		bound := time.Duration(sc.Bound * lv.Base.P99 * float64(time.Millisecond))
		if d, ok := recoveryTime(byPhase[2], drop, drop+sc.Recovery, sc.Window, sc.Step, sc.Hold, bound); ok {
			secs := d.Seconds()
			lv.RecoverySeconds = &secs
		}
	} else if lv.Failure == "" {
		lv.Failure = "no 2xx answer in the base phase"
	}
	return lv
}

// waitReplicasIdle waits until no replica has a request in its handler.
func (h *Harness) waitReplicasIdle(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var n int64
		for _, r := range h.replicas {
			n += r.inflight.Load()
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicas still had %d requests after %v", n, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type seqSample struct {
	seq int64
	satSample
}

// satAttack runs one open-loop attack with the pacer and returns every
// request. Each request in flight needs its own connection (HTTP/1.1), so
// the client has no connection limit and vegeta may use as many workers as
// the schedule needs: a load generator that ran out of workers would stop
// sending on schedule and hide the overload.
func satAttack(ctx context.Context, addr string, cfg *Config, pacer satPacer, seed uint64) []seqSample {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        20000,
		MaxIdleConnsPerHost: 20000,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	client := &http.Client{Timeout: cfg.Sat.Timeout, Transport: tr}
	defer client.CloseIdleConnections()
	a := vegeta.NewAttacker(vegeta.Client(client), vegeta.Workers(64), vegeta.MaxWorkers(15000),
		vegeta.KeepAlive(true), vegeta.Redirects(vegeta.NoFollow))
	stop := context.AfterFunc(ctx, func() { a.Stop() })
	defer stop()
	var total time.Duration
	for _, d := range pacer.durs {
		total += d
	}
	targeter := keyTargeter(loadSpec{}.url(addr), cfg.Keys, cfg.Body, seed)
	var out []seqSample
	var began time.Time
	for res := range a.Attack(targeter, pacer, total, "saturation") {
		if began.IsZero() || res.Timestamp.Before(began) {
			// The first request is sent at once; results arrive out of
			// order, so rebase on the earliest seen below.
			began = res.Timestamp
		}
		out = append(out, seqSample{seq: int64(res.Seq), satSample: satSample{
			at: time.Duration(res.Timestamp.UnixNano()), latency: res.Latency, code: res.Code, outcome: classify(res.Code, res.Error), err: res.Error,
		}})
	}
	for i := range out {
		out[i].at -= time.Duration(began.UnixNano())
	}
	return out
}

// SatSummary is one target at one load level over all rounds.
type SatSummary struct {
	Target       string           `json:"target"`
	Factor       float64          `json:"factor"`
	Offered      float64          `json:"offered_rps"`
	Goodput      *Stat            `json:"goodput_rps,omitempty"`
	ShedShare    *Stat            `json:"shed_share,omitempty"`
	ShedByStatus map[string]int64 `json:"shed_by_status,omitempty"` // summed over rounds
	ShedP99      *Stat            `json:"shed_p99_ms,omitempty"`
	TimeoutShare *Stat            `json:"timeout_share,omitempty"`
	ErrorShare   *Stat            `json:"error_share,omitempty"`
	BaseP99      *Stat            `json:"base_p99_ms,omitempty"`
	P50          *Stat            `json:"p50_ms,omitempty"`
	P99          *Stat            `json:"p99_ms,omitempty"`
	P99OverBase  *Stat            `json:"p99_over_base,omitempty"`
	// Recovery is the median time to recover over the rounds that
	// recovered; NotRecovered counts the others.
	Recovery     *Stat `json:"recovery_seconds,omitempty"`
	NotRecovered int   `json:"not_recovered"`
	PeakRSSMiB   *Stat `json:"peak_rss_mib,omitempty"`
	PeakHeapMiB  *Stat `json:"peak_heap_inuse_mib,omitempty"`
	SendLagP99   *Stat `json:"send_lag_p99_ms,omitempty"`
	Rounds       int   `json:"rounds"`
}

// summariseSaturation groups the saturation levels of runs by target and
// factor, in target order then factor order.
func summariseSaturation(runs []TargetRun, factors []float64) []SatSummary {
	var out []SatSummary
	for _, name := range targetNames {
		for _, f := range factors {
			s := SatSummary{Target: name, Factor: f}
			var good, shed, shedP99, tout, errs, base, p50, p99, over, rec, rss, heap, lag []float64
			for _, run := range runs {
				if run.Target != name {
					continue
				}
				for _, lv := range run.Saturation {
					if lv.Factor != f || lv.Base.P99 == 0 {
						continue
					}
					s.Rounds++
					s.Offered = lv.Load.Offered
					good, shed, tout, errs = append(good, lv.Load.Goodput), append(shed, lv.Load.ShedShare), append(tout, lv.Load.TimeoutShare), append(errs, lv.Load.ErrorShare)
					if lv.Load.ShedShare > 0 {
						shedP99 = append(shedP99, lv.Load.ShedP99)
					}
					for code, n := range lv.Load.ShedByStatus {
						if s.ShedByStatus == nil {
							s.ShedByStatus = map[string]int64{}
						}
						s.ShedByStatus[code] += n
					}
					base, over = append(base, lv.Base.P99), append(over, lv.P99OverBase)
					if lv.Load.P99 > 0 {
						p50, p99 = append(p50, lv.Load.P50), append(p99, lv.Load.P99)
					}
					if lv.RecoverySeconds != nil {
						rec = append(rec, *lv.RecoverySeconds)
					} else {
						s.NotRecovered++
					}
					rss, lag = append(rss, float64(lv.PeakRSSBytes)/(1<<20)), append(lag, lv.SendLagP99)
					if lv.PeakHeapBytes > 0 {
						heap = append(heap, lv.PeakHeapBytes/(1<<20))
					}
				}
			}
			if s.Rounds == 0 {
				continue
			}
			s.Goodput, s.ShedShare, s.ShedP99, s.TimeoutShare, s.ErrorShare = newStat(good), newStat(shed), newStat(shedP99), newStat(tout), newStat(errs)
			s.BaseP99, s.P50, s.P99, s.P99OverBase = newStat(base), newStat(p50), newStat(p99), newStat(over)
			s.Recovery, s.PeakRSSMiB, s.PeakHeapMiB, s.SendLagP99 = newStat(rec), newStat(rss), newStat(heap), newStat(lag)
			out = append(out, s)
		}
	}
	return out
}

// satLagFlag is the p99 send lag, ms, beyond which a level's figures are
// flagged: the load generator did not send on schedule.
const satLagFlag = 50

// satMarkdown renders the saturation tables.
func (r *Report) satMarkdown(b *strings.Builder) {
	sc := r.Config.Sat
	capacity := sc.capacity(r.Config.Replicas)
	fmt.Fprintf(b, "### Saturation\n\n")
	fmt.Fprintf(b, "Capacity %.0f req/s: %d replicas × %d concurrent requests ÷ %v service time. Per level, on a fresh process: %v at %g× capacity (base), %v at the level (load), %v at %g× again (recovery); client timeout %v. Load-phase figures; latency of 2xx answers only.\n\n",
		capacity, r.Config.Replicas, sc.Concurrency, sc.Service, sc.Base, sc.BaseFactor, sc.Duration, sc.Recovery, sc.BaseFactor, sc.Timeout)
	b.WriteString("| target | level | offered req/s | goodput req/s | shed (status) | shed p99 ms | timeouts | errors | base p99 ms | admitted p50 ms | admitted p99 ms | p99 ÷ base | recovery s | peak RSS MiB | peak heap MiB | send lag p99 ms |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	pct := func(s *Stat) string {
		if s == nil {
			return "—"
		}
		return fs(&Stat{Median: 100 * s.Median, Min: 100 * s.Min, Max: 100 * s.Max, N: s.N}, "%.1f%%")
	}
	for _, s := range r.SatSummary {
		var codes []string
		for c, n := range s.ShedByStatus {
			codes = append(codes, fmt.Sprintf("%s: %d", c, n))
		}
		slices.Sort(codes)
		shed := pct(s.ShedShare)
		if len(codes) > 0 {
			shed += " (" + strings.Join(codes, ", ") + ")"
		}
		rec := fs(s.Recovery, "%.1f")
		if s.NotRecovered > 0 {
			rec += fmt.Sprintf(" **%d of %d not within %v**", s.NotRecovered, s.Rounds, sc.Recovery)
		}
		lag := fs(s.SendLagP99, "%.0f")
		if s.SendLagP99 != nil && s.SendLagP99.Max > satLagFlag {
			lag = "**" + lag + " (load side starved)**"
		}
		fmt.Fprintf(b, "| %s | %g× | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			s.Target, s.Factor, s.Offered, fs(s.Goodput, "%.0f"), shed, fs(s.ShedP99, "%.1f"), pct(s.TimeoutShare), pct(s.ErrorShare),
			fs(s.BaseP99, "%.1f"), fs(s.P50, "%.1f"), fs(s.P99, "%.1f"), fs(s.P99OverBase, "%.1f"), rec, fs(s.PeakRSSMiB, "%.1f"), fs(s.PeakHeapMiB, "%.1f"), lag)
	}
}
