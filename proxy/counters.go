package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The traffic counters: what this proxy sent each replica and what it
// answered itself, as atomics that the request path adds to (one atomic
// add per count) and that the metrics exposition (counters.Collect) and
// the traffic sampler (traffic.go) read.

// replicaCounters count the traffic of one replica of one set on this
// proxy, from its joining the proxy's ring until it leaves it: every
// Backend of the replica (a reload may renew its pool) shares them. Safe
// for concurrent use.
type replicaCounters struct {
	created  time.Time
	requests [6]atomic.Uint64 // answers by status class: index 1..5 is 1xx..5xx; 0 is unused
	upErrs   [errKinds]atomic.Uint64
	shed     [shedKinds]atomic.Uint64 // requests for the replica's keys shed, by shedIndex
	// latency is the replica's keyway_request_duration_seconds series,
	// which the traffic sampler reads for the latency over its window (the
	// request path observes it anyway: the sampler adds nothing there).
	// nil until attached; guarded by counters.mu.
	latency prometheus.Metric
}

// setCounters count the answers keyway gave itself for a set (its replica
// "none" series), by status class, and hold the counters of the set's
// ring members.
type setCounters struct {
	created  time.Time
	local    [6]atomic.Uint64            // by status class, as replicaCounters.requests
	shed     atomic.Uint64               // of those, the requests shed (overload, memory guard)
	setShed  [2]atomic.Uint64            // of those, shed by the set's bounds: set_overloaded, memory
	replicas map[string]*replicaCounters // by replica name; guarded by counters.mu
}

// counters holds the traffic counters of every configured set, and is the
// prometheus.Collector of their two metric families,
// keyway_requests_total{set,replica,code} and
// keyway_upstream_errors_total{set,replica,kind}. A series exists while
// its counters do: a set's from its configuration to its removal
// (addSet, forgetSet), a replica's while it is on the set's ring (bind,
// unbind), zero-valued until counted. Safe for concurrent use.
type counters struct {
	requestsDesc *prometheus.Desc
	upErrorsDesc *prometheus.Desc
	shedDesc     *prometheus.Desc

	// noSet counts the answers to requests that match no set (set and
	// replica "none"), by status class.
	noSet        [6]atomic.Uint64
	noSetCreated time.Time

	mu   sync.Mutex
	sets map[string]*setCounters
}

var _ prometheus.Collector = (*counters)(nil)

func newCounters() *counters {
	return &counters{
		requestsDesc: prometheus.NewDesc("keyway_requests_total",
			"Requests answered, by replica set, replica (\"none\" when keyway answered itself) and status class (1xx..5xx).",
			[]string{"set", "replica", "code"}, nil),
		upErrorsDesc: prometheus.NewDesc("keyway_upstream_errors_total",
			"Failed exchanges with a replica, by kind: dial, stale_conn, no_free_conns, timeout, reset, other, reused_closed, tls_handshake, reply_too_large.",
			[]string{"set", "replica", "kind"}, nil),
		shedDesc: prometheus.NewDesc("keyway_shed_total",
			"Requests shed, by replica set, replica (\"none\" for the set's own bounds) and reason: overloaded, replica_saturated, queue_timeout (a replica's), set_overloaded, memory (the set's and the process's).",
			[]string{"set", "replica", "reason"}, nil),
		noSetCreated: time.Now(),
		sets:         map[string]*setCounters{},
	}
}

// addSet returns a set's counters, made if the set has none yet.
func (c *counters) addSet(set string) *setCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sets[set]
	if s == nil {
		s = &setCounters{created: time.Now(), replicas: map[string]*replicaCounters{}}
		c.sets[set] = s
	}
	return s
}

// forgetSet drops the counters of a set that left the configuration, its
// replicas' included.
func (c *counters) forgetSet(set string) {
	c.mu.Lock()
	delete(c.sets, set)
	c.mu.Unlock()
}

// bind returns the counters of a replica of a set, made if it has none
// yet: a renewed pool of a replica on the ring keeps counting where the
// old one stopped. A set that is not (or no longer) configured gets
// counters that nothing exports.
func (c *counters) bind(set, replica string) *replicaCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sets[set]
	if s == nil {
		return &replicaCounters{created: time.Now()}
	}
	r := s.replicas[replica]
	if r == nil {
		r = &replicaCounters{created: time.Now()}
		s.replicas[replica] = r
	}
	return r
}

// attachLatency gives a replica's counters its latency histogram series,
// for the traffic sampler; a histogram that cannot be read is left out.
func (c *counters) attachLatency(r *replicaCounters, h prometheus.Observer) {
	m, ok := h.(prometheus.Metric)
	if !ok {
		return
	}
	c.mu.Lock()
	r.latency = m
	c.mu.Unlock()
}

// unbind drops the counters of a replica that left the set's ring.
func (c *counters) unbind(set, replica string) {
	c.mu.Lock()
	if s := c.sets[set]; s != nil {
		delete(s.replicas, replica)
	}
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *counters) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requestsDesc
	ch <- c.upErrorsDesc
	ch <- c.shedDesc
}

// series is one exported series: its label values and value.
type series struct{ set, replica, label string }

type seriesValue struct {
	v       uint64
	created time.Time
}

// Collect implements prometheus.Collector. Counts that share label values
// (a set or a replica named "none") are exported as one series, their sum,
// as children of one CounterVec would be.
func (c *counters) Collect(ch chan<- prometheus.Metric) {
	reqs := map[series]seriesValue{}
	errs := map[series]seriesValue{}
	sheds := map[series]seriesValue{}
	add := func(m map[series]seriesValue, k series, v uint64, created time.Time) {
		if cur, ok := m[k]; ok {
			v += cur.v
			if cur.created.Before(created) {
				created = cur.created
			}
		}
		m[k] = seriesValue{v, created}
	}
	for i := 1; i < len(codeClasses); i++ {
		add(reqs, series{"none", "none", codeClasses[i]}, c.noSet[i].Load(), c.noSetCreated)
	}
	c.mu.Lock()
	for set, s := range c.sets {
		for i := 1; i < len(codeClasses); i++ {
			add(reqs, series{set, "none", codeClasses[i]}, s.local[i].Load(), s.created)
		}
		for i, r := range []localReason{lrSetOverloaded, lrMemory} {
			add(sheds, series{set, "none", r.String()}, s.setShed[i].Load(), s.created)
		}
		for name, r := range s.replicas {
			for i, reason := range shedKindReasons {
				add(sheds, series{set, name, reason.String()}, r.shed[i].Load(), r.created)
			}
			for i := 1; i < len(codeClasses); i++ {
				add(reqs, series{set, name, codeClasses[i]}, r.requests[i].Load(), r.created)
			}
			for k := errKind(0); k < errKinds; k++ {
				add(errs, series{set, name, k.String()}, r.upErrs[k].Load(), r.created)
			}
		}
	}
	c.mu.Unlock()
	for k, v := range reqs {
		ch <- prometheus.MustNewConstMetricWithCreatedTimestamp(c.requestsDesc, prometheus.CounterValue, float64(v.v), v.created, k.set, k.replica, k.label)
	}
	for k, v := range errs {
		ch <- prometheus.MustNewConstMetricWithCreatedTimestamp(c.upErrorsDesc, prometheus.CounterValue, float64(v.v), v.created, k.set, k.replica, k.label)
	}
	for k, v := range sheds {
		ch <- prometheus.MustNewConstMetricWithCreatedTimestamp(c.shedDesc, prometheus.CounterValue, float64(v.v), v.created, k.set, k.replica, k.label)
	}
}
