package server

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"keyway/admin"
)

// The traffic figures of the set view (issue 5): totals and rates of the
// requests this proxy sent each replica, read from the counters package
// proxy and package health already keep in the metrics registry
// (keyway_requests_total, keyway_upstream_errors_total,
// keyway_ejections_total), so that neither package needs an API for them.
//
// A rate compares two readings of the counters. Every read of a set takes a
// fresh reading and stores it when the last stored one is at least
// sampleEvery old; rates compare the fresh reading with the newest stored
// one at least rateWindow old or, when there is none yet, the oldest stored
// one at least rateMinSpan old. Stored readings older than rateMaxAge are
// forgotten: a rate then needs a second read again. The dashboard reads
// every 2 s, so its rates span 10 to 12 s. Run adds a reading every
// sampleEvery whatever the reads.
const (
	rateWindow  = 10 * time.Second
	rateMinSpan = time.Second
	rateMaxAge  = time.Minute
	sampleEvery = time.Second
)

// The metric families (and label names) the sampler reads.
const (
	metricRequests  = "keyway_requests_total"        // set, replica, code
	metricUpErrors  = "keyway_upstream_errors_total" // set, replica, kind
	metricEjections = "keyway_ejections_total"       // set, replica, reason
	// localReplica is the replica label of answers keyway gave itself.
	localReplica = "none"
)

type replicaKey struct{ set, replica string }

// replicaCounts are one replica's counters in one reading.
type replicaCounts struct {
	requests  float64            // answered, any status class
	r5xx      float64            // answered 5xx
	transport map[string]float64 // failed exchanges by kind
	ejections float64            // passive ejections, any reason
}

func (c *replicaCounts) transportSum() float64 {
	var n float64
	for _, v := range c.transport {
		n += v
	}
	return n
}

// trafficSample is one reading of the counters. Its map is never changed
// once the sample is built, so samples are shared freely.
type trafficSample struct {
	at     time.Time
	counts map[replicaKey]*replicaCounts
}

func (s trafficSample) get(set, replica string) *replicaCounts {
	if c := s.counts[replicaKey{set, replica}]; c != nil {
		return c
	}
	return &replicaCounts{}
}

// trafficSampler keeps the stored readings. Safe for concurrent use.
type trafficSampler struct {
	g   prometheus.Gatherer
	now func() time.Time

	mu     sync.Mutex
	stored []trafficSample // oldest first, at least sampleEvery apart
}

func newTrafficSampler(g prometheus.Gatherer, now func() time.Time) *trafficSampler {
	return &trafficSampler{g: g, now: now}
}

// trafficReading is a fresh reading and the stored one its rates compare
// with (nil: no rate yet, note says why).
type trafficReading struct {
	cur  trafficSample
	base *trafficSample
	note string
}

// gather reads the counters now.
func (s *trafficSampler) gather() trafficSample {
	// A registry answers what it could gather along with an error for the
	// rest; the traffic families come from keyway's own collectors.
	mfs, _ := s.g.Gather()
	cur := trafficSample{at: s.now(), counts: map[replicaKey]*replicaCounts{}}
	for _, mf := range mfs {
		name := mf.GetName()
		if name != metricRequests && name != metricUpErrors && name != metricEjections {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := labels(m)
			k := replicaKey{l["set"], l["replica"]}
			if k.set == "" || k.replica == "" {
				continue
			}
			c := cur.counts[k]
			if c == nil {
				c = &replicaCounts{}
				cur.counts[k] = c
			}
			val := m.GetCounter().GetValue()
			switch name {
			case metricRequests:
				c.requests += val
				if l["code"] == "5xx" {
					c.r5xx += val
				}
			case metricUpErrors:
				if c.transport == nil {
					c.transport = map[string]float64{}
				}
				c.transport[l["kind"]] += val
			case metricEjections:
				c.ejections += val
			}
		}
	}
	return cur
}

func labels(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// read takes a fresh reading, picks the stored one to compare it with, and
// stores the fresh one when the last stored one is sampleEvery old.
func (s *trafficSampler) read() *trafficReading {
	cur := s.gather()
	s.mu.Lock()
	defer s.mu.Unlock()
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
func (s *trafficSampler) run(ctx context.Context, ticks <-chan time.Time) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
			s.read()
		}
	}
}

// Run reads the counters every second until ctx is done, so that rates are
// known on the first read of a set rather than the second. It returns nil,
// or at once when v has no metrics registry.
func (v *view) Run(ctx context.Context) error {
	if v.traffic == nil {
		return nil
	}
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	return v.traffic.run(ctx, t.C)
}

// span is the rates' window in seconds, or 0 with no base.
func (rd *trafficReading) span() float64 {
	if rd.base == nil {
		return 0
	}
	return rd.cur.at.Sub(rd.base.at).Seconds()
}

// increase is a counter's increase since the base reading. A series the
// base lacks was created since (a replica joins a proxy's ring with fresh
// series); one that went down was deleted and created again (the replica
// left the ring and came back): both count from 0, as Prometheus' rate()
// does.
func increase(cur, base float64) float64 {
	if cur < base {
		return cur
	}
	return cur - base
}

// errorsIncrease is the increase of a replica's 5xx answers and failed
// exchanges, kind by kind.
func errorsIncrease(cur, base *replicaCounts) float64 {
	n := increase(cur.r5xx, base.r5xx)
	for kind, v := range cur.transport {
		n += increase(v, base.transport[kind])
	}
	return n
}

// rate rounds a per-second rate to 0.001 for readable JSON.
func rate(delta, span float64) *float64 {
	r := math.Round(delta/span*1000) / 1000
	return &r
}

func count(x float64) uint64 { return uint64(math.Round(x)) }

// replica is one replica's traffic; ejections is the health checker's
// count within its supervision window.
func (rd *trafficReading) replica(set, name string, ejections int) *admin.ReplicaTraffic {
	c := rd.cur.get(set, name)
	tr := &admin.ReplicaTraffic{
		RequestsTotal:        count(c.requests),
		Responses5xxTotal:    count(c.r5xx),
		TransportErrorsTotal: count(c.transportSum()),
		Ejections:            ejections,
		EjectionsTotal:       count(c.ejections),
	}
	tr.ErrorsTotal = tr.Responses5xxTotal + tr.TransportErrorsTotal
	for kind, n := range c.transport {
		if n := count(n); n > 0 {
			if tr.TransportErrors == nil {
				tr.TransportErrors = map[string]uint64{}
			}
			tr.TransportErrors[kind] = n
		}
	}
	if span := rd.span(); span > 0 {
		b := rd.base.get(set, name)
		tr.WindowSeconds = rate(span, 1)
		tr.RequestsPerSecond = rate(increase(c.requests, b.requests), span)
		tr.ErrorsPerSecond = rate(errorsIncrease(c, b), span)
	}
	return tr
}

// set sums the replicas' traffic (reps, as listed) and adds the answers
// keyway gave itself for the set.
func (rd *trafficReading) set(set string, reps []admin.ReplicaStatus) *admin.SetTraffic {
	local := rd.cur.get(set, localReplica)
	st := &admin.SetTraffic{LocalAnswersTotal: count(local.requests), RateNote: rd.note}
	span := rd.span()
	var reqs, errs float64
	for _, r := range reps {
		if r.Traffic == nil {
			continue
		}
		st.RequestsTotal += r.Traffic.RequestsTotal
		st.ErrorsTotal += r.Traffic.ErrorsTotal
		if span > 0 {
			c, b := rd.cur.get(set, r.Name), rd.base.get(set, r.Name)
			reqs += increase(c.requests, b.requests)
			errs += errorsIncrease(c, b)
		}
	}
	if span > 0 {
		st.WindowSeconds = rate(span, 1)
		st.RequestsPerSecond = rate(reqs, span)
		st.ErrorsPerSecond = rate(errs, span)
		st.LocalAnswersPerSecond = rate(increase(local.requests, rd.base.get(set, localReplica).requests), span)
	}
	return st
}
