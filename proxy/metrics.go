package proxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the proxy's collectors. Per-replica series are bound
// once per Backend and deleted when the replica leaves the ring.
type metrics struct {
	counters *counters                // requests_total and upstream_errors_total: set, replica, code (class) or kind
	latency  *prometheus.HistogramVec // set, replica
	retries  *prometheus.CounterVec   // set
	allDown  *prometheus.CounterVec   // set, policy
	rejected *prometheus.CounterVec   // set, reason: answered by keyway itself
	inflight prometheus.Gauge
	// memShedding is 1 while the memory guard sheds (server.max_heap_bytes).
	memShedding prometheus.Gauge
	rebuilds    *prometheus.CounterVec // set, ring ("true"/"false")
	moved       *prometheus.CounterVec // set
	rotation    *prometheus.GaugeVec   // set
	ringSize    *prometheus.GaugeVec   // set
	rebuildSe   *prometheus.HistogramVec
	fleet       *fleetMetrics

	// Pre-bound series for requests that match no set (set "none"); their
	// requests_total{replica="none"} series are counters.noSet.
	noSet        prometheus.Counter // local_responses_total{reason="no_set"}
	setDeleted   prometheus.Counter // local_responses_total{reason="set_deleted"}
	malformed    prometheus.Counter // local_responses_total{reason="malformed"}
	noSetBodyBig prometheus.Counter // local_responses_total{reason="body_too_large"}
}

// latencyBuckets spans 100µs to 30s.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		counters: newCounters(),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "keyway", Name: "request_duration_seconds",
			Help:    "Time from receiving a request to having its response ready, by replica set and the replica that answered.",
			Buckets: latencyBuckets,
		}, []string{"set", "replica"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "retries_total",
			Help: "Requests sent again to the next candidate after a failed attempt.",
		}, []string{"set"}),
		allDown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "all_replicas_unhealthy_total",
			Help: "Requests that found no replica of their set in rotation, by the all-down policy applied (fail_closed: 503; fail_open: routed by hash anyway).",
		}, []string{"set", "policy"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "local_responses_total",
			Help: "Requests keyway answered itself without a replica's answer, by reason.",
		}, []string{"set", "reason"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "inflight_requests",
			Help: "Requests being handled by the proxy now.",
		}),
		memShedding: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "memory_guard_shedding",
			Help: "1 while the heap is above server.max_heap_bytes and new requests are shed with 503, else 0.",
		}),
		rebuilds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "table_rebuilds_total",
			Help: "Routing tables published, by replica set and whether the ring itself changed.",
		}, []string{"set", "ring"}),
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "ring_moved_partitions_total",
			Help: "Partitions whose ring owner changed in ring rebuilds.",
		}, []string{"set"}),
		rotation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "rotation_replicas",
			Help: "Replicas in rotation now.",
		}, []string{"set"}),
		ringSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "ring_replicas",
			Help: "Replicas on the ring now.",
		}, []string{"set"}),
		rebuildSe: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "keyway", Name: "table_rebuild_duration_seconds",
			Help:    "Time to build and publish a routing table.",
			Buckets: []float64{.00001, .0001, .001, .005, .01, .05, .1, .5, 1},
		}, []string{"set"}),
	}
	m.fleet = newFleetMetrics()
	m.noSet = m.rejected.WithLabelValues("none", "no_set")
	m.setDeleted = m.rejected.WithLabelValues("none", "set_deleted")
	m.malformed = m.rejected.WithLabelValues("none", "malformed")
	m.noSetBodyBig = m.rejected.WithLabelValues("none", lrBodyTooLarge.String())
	if reg != nil {
		for _, c := range append([]prometheus.Collector{m.counters, m.latency, m.retries, m.allDown, m.rejected, m.inflight, m.memShedding,
			m.rebuilds, m.moved, m.rotation, m.ringSize, m.rebuildSe}, m.fleet.collectors()...) {
			if err := reg.Register(c); err != nil {
				// A second proxy on the same registry, typically: an error
				// from New rather than MustRegister's panic.
				return nil, fmt.Errorf("register proxy metrics: %w", err)
			}
		}
	}
	return m, nil
}

var codeClasses = [6]string{"error", "1xx", "2xx", "3xx", "4xx", "5xx"}

// bind attaches a backend's counters and latency series: those of its
// replica, if a backend of the same replica has them already (a renewed
// pool).
func (m *metrics) bind(b *Backend, set string) {
	b.ctr = m.counters.bind(set, b.name)
	b.latency = m.latency.WithLabelValues(set, b.name)
	m.counters.attachLatency(b.ctr, b.latency)
}

// unbind deletes a departed replica's counters and series.
func (m *metrics) unbind(set, replica string) {
	m.counters.unbind(set, replica)
	m.latency.DeletePartialMatch(prometheus.Labels{"set": set, "replica": replica})
}

// forgetSet deletes every series of a replica set that left the
// configuration.
func (m *metrics) forgetSet(set string) {
	l := prometheus.Labels{"set": set}
	m.counters.forgetSet(set)
	m.latency.DeletePartialMatch(l)
	m.retries.DeletePartialMatch(l)
	m.allDown.DeletePartialMatch(l)
	m.rejected.DeletePartialMatch(l)
	m.rebuilds.DeletePartialMatch(l)
	m.moved.DeletePartialMatch(l)
	m.rotation.DeletePartialMatch(l)
	m.ringSize.DeletePartialMatch(l)
	m.rebuildSe.DeletePartialMatch(l)
	m.fleet.disagreeing.DeletePartialMatch(l)
	m.fleet.longest.DeletePartialMatch(l)
	m.fleet.held.DeletePartialMatch(l)
}

// noSetAnswer is the keyway_local_responses_total series of an answer to
// a request of no set, by its access-log reason; nil for a panic's
// answer, which is counted nowhere.
func (m *metrics) noSetAnswer(why string) prometheus.Counter {
	switch why {
	case "no_set":
		return m.noSet
	case "set_deleted":
		return m.setDeleted
	case "body_too_large":
		return m.noSetBodyBig
	case "internal":
		return nil
	}
	return m.malformed
}
