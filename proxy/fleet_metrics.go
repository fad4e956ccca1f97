package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fleetMetrics are the fleet's gauges, per set.
type fleetMetrics struct {
	disagreeing *prometheus.GaugeVec // set
	longest     *prometheus.GaugeVec // set
	held        *prometheus.GaugeVec // set
}

func newFleetMetrics() *fleetMetrics {
	return &fleetMetrics{
		disagreeing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "fleet", Name: "disagreeing_peers",
			Help: "Other proxies whose routing digest of the set differs from this proxy's now.",
		}, []string{"set"}),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "fleet", Name: "disagreement_seconds",
			Help: "How long the oldest current disagreement with another proxy about the set has lasted (0: all agree).",
		}, []string{"set"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "fleet", Name: "held_replicas",
			Help: "Replicas of the set the fleet holds out of rotation on proxies' shared evidence.",
		}, []string{"set"}),
	}
}

func (m *fleetMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.disagreeing, m.longest, m.held}
}

// setFleet publishes the gauges of every served set from the current
// disagreements ((peer, set) → since); the fleet view's lock is held.
func (m *metrics) setFleet(rt *routes, disagree map[[2]string]time.Time, now time.Time) {
	for _, name := range rt.names {
		n, longest := 0, time.Duration(0)
		for k, since := range disagree {
			if k[1] == name {
				n++
				longest = max(longest, now.Sub(since))
			}
		}
		m.fleet.disagreeing.WithLabelValues(name).Set(float64(n))
		m.fleet.longest.WithLabelValues(name).Set(longest.Seconds())
		st := rt.byName[name].st
		st.mu.Lock()
		held := len(st.fleetOut)
		st.mu.Unlock()
		m.fleet.held.WithLabelValues(name).Set(float64(held))
	}
}
