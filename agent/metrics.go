package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"keyway/balancer"
)

// states are the lifecycle states the keyway_agent_state gauge has a
// series for (every state but unknown).
var states = []balancer.State{
	balancer.StateStarting, balancer.StateReady, balancer.StateDraining,
	balancer.StateRecovering, balancer.StateStopped, balancer.StateFailed,
}

type metrics struct {
	state       *prometheus.GaugeVec   // state
	probes      *prometheus.CounterVec // result
	reports     *prometheus.CounterVec // result
	transitions prometheus.Counter
	// commandsRejected counts admin drain commands refused, by reason.
	commandsRejected *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "state",
			Help: "The lifecycle state the agent advertises for its replica: 1 for the current state, 0 for the others.",
		}, []string{"state"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "probes_total",
			Help: "Readiness probes of the replica, by result (pass, fail).",
		}, []string{"result"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "drain_reports_total",
			Help: "Drain reports received from proxies, by result (accepted, before_drain, other_replica, malformed).",
		}, []string{"result"}),
		transitions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "state_changes_total",
			Help: "Lifecycle state changes advertised.",
		}),
		commandsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "commands_rejected_total",
			Help: "Admin drain commands refused because the sender is not an alive proxy, by reason (unknown_sender: no alive member of that name; not_proxy: its metadata does not say role proxy).",
		}, []string{"reason"}),
	}
	for _, r := range []string{rejectUnknownSender, rejectNotProxy} {
		m.commandsRejected.WithLabelValues(r)
	}
	for _, r := range []string{"pass", "fail"} {
		m.probes.WithLabelValues(r)
	}
	for _, r := range []string{"accepted", "before_drain", "other_replica", "malformed"} {
		m.reports.WithLabelValues(r)
	}
	m.setState(balancer.StateStarting)
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.state, m.probes, m.reports, m.transitions, m.commandsRejected} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) setState(s balancer.State) {
	for _, x := range states {
		v := 0.0
		if x == s {
			v = 1
		}
		m.state.WithLabelValues(x.String()).Set(v)
	}
}
