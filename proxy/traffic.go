package proxy

import (
	"context"
	"fmt"
	"math"
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
)

// replicaSample is one replica's counters in one reading.
type replicaSample struct {
	requests  uint64 // answered, any status class
	r5xx      uint64 // answered 5xx
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
	local    uint64 // answered by keyway itself, any status class
	shed     uint64 // of those, shed
	replicas map[string]replicaSample
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
		for i := 1; i < len(s.local); i++ {
			ss.local += s.local[i].Load()
		}
		ss.shed = s.shed.Load()
		for rn, r := range s.replicas {
			var rs replicaSample
			for i := 1; i < len(r.requests); i++ {
				rs.requests += r.requests[i].Load()
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
	return rd
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

// latencyOver is the mean and the 99th percentile of the latencies
// observed between the base and the current reading of a replica; nil when
// none was, or the histogram was not read. A histogram that went down was
// created again (the replica left the ring and came back): it counts from
// 0, as increase does.
func latencyOver(cur, base *replicaSample) (mean, p99 *float64) {
	if cur.latBuckets == nil {
		return nil, nil
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
	n := cur.latCount - baseCount
	if n == 0 {
		return nil, nil
	}
	m := micros((cur.latSum - baseSum) / float64(n))
	delta := func(i int) float64 {
		if i == len(latencyBuckets) { // +Inf: every observation
			return float64(n)
		}
		if baseBuckets == nil {
			return float64(cur.latBuckets[i])
		}
		return float64(cur.latBuckets[i] - baseBuckets[i])
	}
	return m, micros(quantile(0.99, latencyBuckets, delta, float64(n)))
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
	var reqs, errs float64
	for name, c := range cur.replicas {
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
			tr.RequestsPerSecond, tr.ErrorsPerSecond = rate(r, span), rate(e, span)
			tr.MeanLatencySeconds, tr.P99LatencySeconds = latencyOver(&c, &b)
			reqs += r
			errs += e
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
	}
	return out
}
