package proxy

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
)

// TrafficReport is what this proxy sent the replicas of one set and what
// it answered itself for the set: totals since each replica joined this
// proxy's ring (or the set was configured), and rates over the traffic
// sampler's window. Rates are per second, rounded to 0.001, and nil until
// there is an earlier reading of the counters to compare with (RateNote
// then says why). A plain value.
type TrafficReport struct {
	// WindowSeconds is the span the rates cover, nil with no rates.
	WindowSeconds *float64
	// RateNote explains nil rates; "" when they are known.
	RateNote string
	// Replicas holds the replicas on this proxy's ring, by name.
	Replicas map[string]ReplicaTraffic
	// RequestsTotal and ErrorsTotal sum the replicas' (RequestsPerSecond
	// and ErrorsPerSecond their rates).
	RequestsTotal     uint64
	ErrorsTotal       uint64
	RequestsPerSecond *float64
	ErrorsPerSecond   *float64
	// LocalAnswersTotal counts the answers keyway gave the set's requests
	// itself (keyway_requests_total{replica="none"}: no replica, a failed
	// exchange, a bad key, ...).
	LocalAnswersTotal     uint64
	LocalAnswersPerSecond *float64
	// ShedTotal counts the local answers that shed a request (overload,
	// replica-reported pressure, the memory guard; docs/proxy.md).
	ShedTotal     uint64
	ShedPerSecond *float64
	// Codes counts the answers the set's clients got, by status class
	// ("1xx" … "5xx"): the replicas' answers and keyway's own. Classes
	// not seen are left out. CodesPerSecond are their rates (nil with no
	// rates).
	Codes          map[string]uint64
	CodesPerSecond map[string]float64
	// ClientErrorsTotal counts the 5xx answers clients got (a replica's,
	// or keyway's own); ClientErrorsPerSecond its rate.
	ClientErrorsTotal     uint64
	ClientErrorsPerSecond *float64
	// FailedAttemptsTotal counts failed exchanges with the replicas: each
	// was retried on the next candidate or answered by keyway (then
	// counted in Codes), so no client saw it as such.
	FailedAttemptsTotal     uint64
	FailedAttemptsPerSecond *float64
	// P50LatencySeconds and P99LatencySeconds are the set's latency over
	// the window: the replicas' histograms added up (nil with no rates,
	// or no answer in the window).
	P50LatencySeconds *float64
	P99LatencySeconds *float64
}

// TrafficPoint is one step of a set's traffic history: its rates over the
// historyEvery before At. A plain value.
type TrafficPoint struct {
	At time.Time
	// RequestsPerSecond counts the answers clients got, the replicas' and
	// keyway's own; ClientErrorsPerSecond the 5xx among them.
	RequestsPerSecond     float64
	ClientErrorsPerSecond float64
	// P99LatencySeconds is nil without an answer from a replica.
	P99LatencySeconds *float64
}

// ReplicaTraffic is what this proxy sent one replica. A plain value.
type ReplicaTraffic struct {
	// RequestsTotal counts the replica's answers, any status
	// (keyway_requests_total); Responses5xxTotal its 5xx answers.
	RequestsTotal     uint64
	Responses5xxTotal uint64
	// TransportErrorsTotal counts failed exchanges with it; TransportErrors
	// splits them by kind (dial, stale_conn, no_free_conns, timeout, reset,
	// other, tls_handshake, reply_too_large; only kinds seen), as
	// keyway_upstream_errors_total does. A failed exchange is not an
	// answer: the request went to the next candidate or keyway answered it.
	TransportErrorsTotal uint64
	TransportErrors      map[string]uint64
	// ErrorsTotal is Responses5xxTotal + TransportErrorsTotal.
	ErrorsTotal uint64
	// RequestsPerSecond is the rate of its answers; ErrorsPerSecond the
	// rate of its 5xx answers plus failed exchanges.
	RequestsPerSecond *float64
	ErrorsPerSecond   *float64
	// MeanLatencySeconds and P99LatencySeconds are the latency of the
	// requests it answered within the window, as
	// keyway_request_duration_seconds measures it (from receiving the
	// request to having its answer ready, retries included), rounded to
	// 1µs: the mean from the histogram's sum and count, the 99th
	// percentile estimated from its buckets as Prometheus'
	// histogram_quantile does (linear within a bucket, so only as fine as
	// the buckets). nil with no rates, or no answer in the window.
	MeanLatencySeconds *float64
	P99LatencySeconds  *float64
	// Responses5xxPerSecond is the rate of its 5xx answers (clients got
	// them); FailedAttemptsPerSecond the rate of failed exchanges with it
	// (retried on another candidate, or answered by keyway).
	Responses5xxPerSecond   *float64
	FailedAttemptsPerSecond *float64
}

// Traffic reports what this proxy sent each replica of a set (totals since
// the replica joined this proxy's ring, and rates over the sampler's
// window) and what it answered itself for the set. ok is false for an
// unknown set. Every call reads the counters afresh, and the reading may
// serve later rates (see trafficSampler). Safe for concurrent use.
func (p *Proxy) Traffic(set string) (TrafficReport, bool) {
	if p.routes.Load().byName[set] == nil {
		return TrafficReport{}, false
	}
	return p.traffic.read().report(set), true
}

// TrafficHistory returns a set's traffic over the last historyLen steps
// of historyEvery (15 minutes), oldest first; nil for a set with none
// yet. Safe for concurrent use.
func (p *Proxy) TrafficHistory(set string) []TrafficPoint {
	return p.traffic.historyOf(set)
}

// A rate compares two readings of the counters. Every read takes a fresh
// reading and stores it when the last stored one is at least sampleEvery
// old; rates compare the fresh reading with the newest stored one at least
// rateWindow old or, when there is none yet, the oldest stored one at
// least rateMinSpan old. Stored readings older than rateMaxAge are
// forgotten: a rate then needs a second read again. Run adds a reading
// every sampleEvery whatever the reads, so a reader every 2 s (the
// dashboard) sees rates spanning 10 to 12 s.
const (
	rateWindow  = 10 * time.Second
	rateMinSpan = time.Second
	rateMaxAge  = time.Minute
	sampleEvery = time.Second
	// The history: a point every historyEvery, the last historyLen kept.
	historyEvery = 10 * time.Second
	historyLen   = 90
)

// replicaSample is one replica's counters in one reading.
type replicaSample struct {
	requests  uint64    // answered, any status class
	r5xx      uint64    // answered 5xx
	classes   [6]uint64 // answered, by status class (1 … 5)
	transport [errKinds]uint64
	// The latency histogram: observations, their sum in seconds, and the
	// cumulative count of each of latencyBuckets (nil: not read).
	latCount   uint64
	latSum     float64
	latBuckets []uint64
}

func (c *replicaSample) transportSum() uint64 {
	var n uint64
	for _, v := range c.transport {
		n += v
	}
	return n
}

// setSample is one set's counters in one reading.
type setSample struct {
	local        uint64    // answered by keyway itself, any status class
	localClasses [6]uint64 // of those, by status class (1 … 5)
	shed         uint64    // of those, shed
	replicas     map[string]replicaSample
}

// trafficSample is one reading of every set's counters. It is never
// changed once built, so samples are shared freely.
type trafficSample struct {
	at   time.Time
	sets map[string]setSample
}

func (s *trafficSample) replica(set, name string) replicaSample { return s.sets[set].replicas[name] }

// sample reads every set's counters.
func (c *counters) sample(at time.Time) trafficSample {
	out := trafficSample{at: at, sets: map[string]setSample{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, s := range c.sets {
		ss := setSample{replicas: make(map[string]replicaSample, len(s.replicas))}
		for i := 1; i < len(s.local) && i < len(ss.localClasses); i++ {
			ss.localClasses[i] = s.local[i].Load()
			ss.local += ss.localClasses[i]
		}
		ss.shed = s.shed.Load()
		for rn, r := range s.replicas {
			var rs replicaSample
			for i := 1; i < len(r.requests) && i < len(rs.classes); i++ {
				rs.classes[i] = r.requests[i].Load()
				rs.requests += rs.classes[i]
			}
			rs.r5xx = r.requests[5].Load()
			for k := range r.upErrs {
				rs.transport[k] = r.upErrs[k].Load()
			}
			readLatency(r.latency, &rs)
			ss.replicas[rn] = rs
		}
		out.sets[name] = ss
	}
	return out
}

// readLatency reads a replica's latency histogram into rs; nothing when
// it has none or it does not have keyway's buckets.
func readLatency(h prometheus.Metric, rs *replicaSample) {
	if h == nil {
		return
	}
	var m dto.Metric
	if h.Write(&m) != nil || m.Histogram == nil || len(m.Histogram.Bucket) != len(latencyBuckets) {
		return
	}
	rs.latCount, rs.latSum = m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
	rs.latBuckets = make([]uint64, len(latencyBuckets))
	for i, b := range m.Histogram.Bucket {
		rs.latBuckets[i] = b.GetCumulativeCount()
	}
}

// trafficSampler keeps the stored readings of the counters. Safe for
// concurrent use.
type trafficSampler struct {
	c   *counters
	now func() time.Time

	mu     sync.Mutex
	stored []trafficSample // oldest first, at least sampleEvery apart
	// The history: the reading its last points compare with, and the
	// points of each set, oldest first.
	histBase *trafficSample
	history  map[string][]TrafficPoint
}

func newTrafficSampler(c *counters, now func() time.Time) *trafficSampler {
	return &trafficSampler{c: c, now: now}
}

// trafficReading is a fresh reading and the stored one its rates compare
// with (nil: no rate yet, note says why).
type trafficReading struct {
	cur  trafficSample
	base *trafficSample
	note string
}

// read takes a fresh reading, picks the stored one to compare it with, and
// stores the fresh one when the last stored one is sampleEvery old.
func (s *trafficSampler) read() *trafficReading {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Under the lock: stored readings are in the order of their times.
	cur := s.c.sample(s.now())
	now := cur.at
	drop := 0
	for drop < len(s.stored) && now.Sub(s.stored[drop].at) > rateMaxAge {
		drop++
	}
	s.stored = append(s.stored[:0], s.stored[drop:]...)

	rd := &trafficReading{cur: cur}
	for i := len(s.stored) - 1; i >= 0; i-- {
		if now.Sub(s.stored[i].at) >= rateWindow {
			rd.base = &s.stored[i]
			break
		}
	}
	if rd.base == nil && len(s.stored) > 0 && now.Sub(s.stored[0].at) >= rateMinSpan {
		rd.base = &s.stored[0]
	}
	if rd.base != nil {
		b := *rd.base // a copy: s.stored is shifted in place later
		rd.base = &b
	} else {
		switch {
		case len(s.stored) == 0:
			rd.note = "no earlier reading of the counters: rates compare two readings at least 1s apart, taken when a set is read; read again in a second"
		default:
			rd.note = fmt.Sprintf("the earlier reading is only %.1fs old: rates compare two readings at least 1s apart; read again in a second", now.Sub(s.stored[0].at).Seconds())
		}
	}
	if n := len(s.stored); n == 0 || now.Sub(s.stored[n-1].at) >= sampleEvery {
		s.stored = append(s.stored, cur)
	}
	s.addHistory(cur)
	return rd
}

// addHistory adds a point to every set's history once the last one is
// historyEvery old. s.mu is held.
func (s *trafficSampler) addHistory(cur trafficSample) {
	if s.histBase != nil && cur.at.Sub(s.histBase.at) < historyEvery {
		return
	}
	base := s.histBase
	s.histBase = &cur
	if base == nil {
		return
	}
	if s.history == nil {
		s.history = map[string][]TrafficPoint{}
	}
	rd := trafficReading{cur: cur, base: base}
	span := rd.span()
	for set := range s.history {
		if _, ok := cur.sets[set]; !ok {
			delete(s.history, set) // the set is gone
		}
	}
	for set := range cur.sets {
		r := rd.report(set)
		pt := TrafficPoint{At: cur.at, P99LatencySeconds: r.P99LatencySeconds}
		var answers float64
		for _, v := range r.CodesPerSecond {
			answers += v
		}
		pt.RequestsPerSecond = math.Round(answers*1000) / 1000
		if r.ClientErrorsPerSecond != nil {
			pt.ClientErrorsPerSecond = *r.ClientErrorsPerSecond
		}
		if span <= 0 {
			continue
		}
		h := append(s.history[set], pt)
		if len(h) > historyLen {
			h = append(h[:0], h[len(h)-historyLen:]...)
		}
		s.history[set] = h
	}
}

// historyOf returns a copy of a set's history.
func (s *trafficSampler) historyOf(set string) []TrafficPoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.history[set])
}

// run stores a reading at every tick until ctx is done.
func (s *trafficSampler) run(ctx context.Context, ticks <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			s.read()
		}
	}
}

// runTraffic is the sampler's loop for Run: a reading every sampleEvery,
// so that rates are known on the first read of a set rather than the
// second.
func (p *Proxy) runTraffic(ctx context.Context) {
	defer func() {
		if v := recover(); v != nil {
			p.log.Error("panic in the traffic sampler", zap.Any("panic", v), zap.Stack("stack"))
		}
	}()
	ticks, stop := p.clk.NewTicker(sampleEvery)
	defer stop()
	p.traffic.run(ctx, ticks)
}

// span is the rates' window in seconds, or 0 with no base.
func (rd *trafficReading) span() float64 {
	if rd.base == nil {
		return 0
	}
	return rd.cur.at.Sub(rd.base.at).Seconds()
}

// increase is a counter's increase since the base reading. A counter the
// base lacks was created since (a replica joins a proxy's ring with fresh
// counters); one that went down was dropped and created again (the
// replica left the ring and came back): both count from 0, as
// Prometheus' rate() does.
func increase(cur, base uint64) float64 {
	if cur < base {
		return float64(cur)
	}
	return float64(cur - base)
}

// errorsIncrease is the increase of a replica's 5xx answers and failed
// exchanges, kind by kind.
func errorsIncrease(cur, base *replicaSample) float64 {
	n := increase(cur.r5xx, base.r5xx)
	for k, v := range cur.transport {
		n += increase(v, base.transport[k])
	}
	return n
}

// latencyDelta is the count, the sum and the per-bucket counts
// (cumulative, the last being +Inf: every observation) of the latencies
// observed between the base and the current reading of a replica; n is 0
// when none was, or the histogram was not read. A histogram that went
// down was created again (the replica left the ring and came back): it
// counts from 0, as increase does.
func latencyDelta(cur, base *replicaSample) (n uint64, sum float64, buckets []float64) {
	if cur.latBuckets == nil {
		return 0, 0, nil
	}
	baseBuckets, baseCount, baseSum := base.latBuckets, base.latCount, base.latSum
	if baseBuckets == nil || cur.latCount < baseCount {
		baseBuckets, baseCount, baseSum = nil, 0, 0
	}
	for i := range baseBuckets {
		if cur.latBuckets[i] < baseBuckets[i] {
			baseBuckets, baseCount, baseSum = nil, 0, 0
			break
		}
	}
	n = cur.latCount - baseCount
	if n == 0 {
		return 0, 0, nil
	}
	buckets = make([]float64, len(latencyBuckets)+1)
	for i := range latencyBuckets {
		buckets[i] = float64(cur.latBuckets[i])
		if baseBuckets != nil {
			buckets[i] -= float64(baseBuckets[i])
		}
	}
	buckets[len(latencyBuckets)] = float64(n)
	return n, cur.latSum - baseSum, buckets
}

// latencyOver is the mean and the 99th percentile of the latencies
// observed between the base and the current reading of a replica; nil when
// none was, or the histogram was not read.
func latencyOver(cur, base *replicaSample) (mean, p99 *float64) {
	n, sum, buckets := latencyDelta(cur, base)
	if n == 0 {
		return nil, nil
	}
	count := func(i int) float64 { return buckets[i] }
	return micros(sum / float64(n)), micros(quantile(0.99, latencyBuckets, count, float64(n)))
}

// quantile estimates the q-quantile of observations counted in cumulative
// buckets (upper bounds bounds, counts count(i), count(len(bounds)) the
// +Inf bucket, total n > 0) as Prometheus' histogram_quantile does: linear
// within the bucket it falls in, starting from 0 for the first one, and
// the highest finite bound for the +Inf bucket.
func quantile(q float64, bounds []float64, count func(int) float64, n float64) float64 {
	rank := q * n
	prevBound, prevCount := 0.0, 0.0
	for i, ub := range bounds {
		c := count(i)
		if c >= rank {
			if c == prevCount {
				return ub
			}
			return prevBound + (ub-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevBound, prevCount = ub, c
	}
	return bounds[len(bounds)-1]
}

// micros rounds seconds to 1µs.
func micros(s float64) *float64 {
	r := math.Round(s*1e6) / 1e6
	return &r
}

// rate rounds a per-second rate to 0.001 for readable JSON.
func rate(delta, span float64) *float64 {
	r := math.Round(delta/span*1000) / 1000
	return &r
}

// report is one set's traffic in the reading.
func (rd *trafficReading) report(set string) TrafficReport {
	cur := rd.cur.sets[set]
	out := TrafficReport{
		RateNote:          rd.note,
		Replicas:          make(map[string]ReplicaTraffic, len(cur.replicas)),
		LocalAnswersTotal: cur.local,
		ShedTotal:         cur.shed,
	}
	span := rd.span()
	var reqs, errs, r5xx, failed float64
	var classes [6]float64 // increases, by status class
	var latN float64
	var latBuckets []float64
	for i := 1; i < len(cur.localClasses); i++ {
		if n := cur.localClasses[i]; n > 0 {
			if out.Codes == nil {
				out.Codes = map[string]uint64{}
			}
			out.Codes[codeClasses[i]] += n
		}
		if span > 0 {
			classes[i] += increase(cur.localClasses[i], rd.base.sets[set].localClasses[i])
		}
	}
	out.ClientErrorsTotal = cur.localClasses[5]
	for name, c := range cur.replicas {
		for i := 1; i < len(c.classes); i++ {
			if n := c.classes[i]; n > 0 {
				if out.Codes == nil {
					out.Codes = map[string]uint64{}
				}
				out.Codes[codeClasses[i]] += n
			}
		}
		out.ClientErrorsTotal += c.r5xx
		out.FailedAttemptsTotal += c.transportSum()
		tr := ReplicaTraffic{
			RequestsTotal:        c.requests,
			Responses5xxTotal:    c.r5xx,
			TransportErrorsTotal: c.transportSum(),
		}
		tr.ErrorsTotal = tr.Responses5xxTotal + tr.TransportErrorsTotal
		for k, n := range c.transport {
			if n > 0 {
				if tr.TransportErrors == nil {
					tr.TransportErrors = map[string]uint64{}
				}
				tr.TransportErrors[errKind(k).String()] = n
			}
		}
		if span > 0 {
			b := rd.base.replica(set, name)
			r, e := increase(c.requests, b.requests), errorsIncrease(&c, &b)
			r5 := increase(c.r5xx, b.r5xx)
			tr.RequestsPerSecond, tr.ErrorsPerSecond = rate(r, span), rate(e, span)
			tr.Responses5xxPerSecond, tr.FailedAttemptsPerSecond = rate(r5, span), rate(e-r5, span)
			tr.MeanLatencySeconds, tr.P99LatencySeconds = latencyOver(&c, &b)
			reqs += r
			errs += e
			r5xx += r5
			failed += e - r5
			for i := 1; i < len(c.classes); i++ {
				classes[i] += increase(c.classes[i], b.classes[i])
			}
			if n, _, bk := latencyDelta(&c, &b); n > 0 {
				if latBuckets == nil {
					latBuckets = make([]float64, len(bk))
				}
				for i, v := range bk {
					latBuckets[i] += v
				}
				latN += float64(n)
			}
		}
		out.RequestsTotal += tr.RequestsTotal
		out.ErrorsTotal += tr.ErrorsTotal
		out.Replicas[name] = tr
	}
	if span > 0 {
		out.WindowSeconds = rate(span, 1)
		out.RequestsPerSecond = rate(reqs, span)
		out.ErrorsPerSecond = rate(errs, span)
		out.LocalAnswersPerSecond = rate(increase(cur.local, rd.base.sets[set].local), span)
		out.ShedPerSecond = rate(increase(cur.shed, rd.base.sets[set].shed), span)
		out.CodesPerSecond = map[string]float64{}
		for i := 1; i < len(classes); i++ {
			if classes[i] > 0 || out.Codes[codeClasses[i]] > 0 {
				out.CodesPerSecond[codeClasses[i]] = *rate(classes[i], span)
			}
		}
		localErrs := increase(cur.localClasses[5], rd.base.sets[set].localClasses[5])
		out.ClientErrorsPerSecond = rate(r5xx+localErrs, span)
		out.FailedAttemptsPerSecond = rate(failed, span)
		if latN > 0 {
			count := func(i int) float64 { return latBuckets[i] }
			out.P50LatencySeconds = micros(quantile(0.5, latencyBuckets, count, latN))
			out.P99LatencySeconds = micros(quantile(0.99, latencyBuckets, count, latN))
		}
	}
	return out
}
