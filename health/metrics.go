package health

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Checker's collectors. Per-replica series are created
// when a target appears (pre-bound in its replicaMetrics) and deleted when
// it is forgotten; per-set series when a set first gets targets.
type metrics struct {
	probes    *prometheus.CounterVec // set, replica, result
	probeUp   *prometheus.GaugeVec   // set, replica
	ejections *prometheus.CounterVec // set, replica, reason
	ejected   *prometheus.GaugeVec   // set
	capped    *prometheus.CounterVec // set
	holds     *prometheus.CounterVec // set, replica
}

// replicaMetrics are one target's pre-bound series. With active probing
// off the probe series are no-op collectors that are never exported, and
// likewise the ejection series with passive checks off.
type replicaMetrics struct {
	probes    [numResults]prometheus.Counter
	up        prometheus.Gauge
	ejections [numKinds]prometheus.Counter // index kindNone unused
	holds     prometheus.Counter
}

func (m replicaMetrics) setUp(up bool) {
	if up {
		m.up.Set(1)
	} else {
		m.up.Set(0)
	}
}

func newMetrics() *metrics {
	return &metrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "health", Name: "probes_total",
			Help: "Active health probes of ring members, by result (pass, bad_status, timeout, error).",
		}, []string{"set", "replica", "result"}),
		probeUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "health", Name: "probe_up",
			Help: "Active probe verdict of a ring member after rise/fall hysteresis: 1 up, 0 down (held out of rotation).",
		}, []string{"set", "replica"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "ejections_total",
			Help: "Passive ejections of replicas after consecutive failed requests, by the failure kind that tripped them (connect, timeout, reset, 5xx); includes ejections that started a supervision hold.",
		}, []string{"set", "replica", "reason"}),
		ejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "ejected_replicas",
			Help: "Replicas of a set held out of rotation by passive checks now (ejected or in a supervision hold).",
		}, []string{"set"}),
		capped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "ejection_share_capped_total",
			Help: "Times a replica that should have been ejected stayed in rotation because passive.max_ejected_share of its set was already out.",
		}, []string{"set"}),
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Name: "failed_holds_total",
			Help: "Supervision holds: a replica ejected supervision.max_ejections times within supervision.window, held out as failed.",
		}, []string{"set", "replica"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.probes, m.probeUp, m.ejections, m.ejected, m.capped, m.holds} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// forSet creates a set's series.
func (m *metrics) forSet(set string) (prometheus.Gauge, prometheus.Counter) {
	return m.ejected.WithLabelValues(set), m.capped.WithLabelValues(set)
}

// forReplica creates a target's series: the probe series only when active
// probing is on, the ejection series only when passive checks are on.
func (m *metrics) forReplica(set, replica string, active, passive bool) replicaMetrics {
	var rm replicaMetrics
	if active {
		for i := range rm.probes {
			rm.probes[i] = m.probes.WithLabelValues(set, replica, resultNames[i])
		}
		rm.up = m.probeUp.WithLabelValues(set, replica)
		rm.up.Set(1)
	} else {
		for i := range rm.probes {
			rm.probes[i] = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
		}
		rm.up = prometheus.NewGauge(prometheus.GaugeOpts{Name: "unused"})
	}
	for k := kindConnect; k < numKinds; k++ {
		if passive {
			rm.ejections[k] = m.ejections.WithLabelValues(set, replica, k.String())
		} else {
			rm.ejections[k] = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
		}
	}
	if passive {
		rm.holds = m.holds.WithLabelValues(set, replica)
	} else {
		rm.holds = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
	}
	return rm
}

// forget deletes a target's series.
func (m *metrics) forget(set, replica string) {
	for _, r := range resultNames {
		m.probes.DeleteLabelValues(set, replica, r)
	}
	m.probeUp.DeleteLabelValues(set, replica)
	for k := kindConnect; k < numKinds; k++ {
		m.ejections.DeleteLabelValues(set, replica, k.String())
	}
	m.holds.DeleteLabelValues(set, replica)
}
