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
	// info is 1 with the agent's set and replica as labels, so that
	// dashboards can name the replica behind an agent's other series
	// (they carry no set or replica label of their own).
	info        *prometheus.GaugeVec   // set, replica
	state       *prometheus.GaugeVec   // state
	probes      *prometheus.CounterVec // result
	reports     *prometheus.CounterVec // result
	transitions prometheus.Counter
	// drainProbe counts drain probe waits by result (done, timeout).
	drainProbe *prometheus.CounterVec
	// setCommands counts set stop and start commands applied, by command.
	setCommands *prometheus.CounterVec
	// retires counts retire commands carried out (0 or 1 per agent).
	retires prometheus.Counter
}

// childMetrics count what happens to the supervised process; the
// Supervisor owns them, so they exist only when the agent supervises one.
type childMetrics struct {
	starts   prometheus.Counter
	exits    *prometheus.CounterVec // reason
	restarts prometheus.Counter
	gaveUp   prometheus.Counter
	repairs  prometheus.Counter
	running  prometheus.Gauge
}

func newChildMetrics() *childMetrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "keyway", Subsystem: "agent", Name: name, Help: help}
	}
	m := &childMetrics{
		starts: prometheus.NewCounter(opts("child_starts_total", "Starts of the supervised replica process (the first, restarts and repairs).")),
		exits: prometheus.NewCounterVec(opts("child_exits_total",
			"Exits of the supervised replica process, by reason: exit_code (it exited by itself), signal (a signal the agent did not send), stop (the agent stopped it: shutdown, rolling restart, set stop), start_error (it could not be started)."),
			[]string{"reason"}),
		restarts: prometheus.NewCounter(opts("child_restarts_total", "Restarts of the replica process scheduled after an unexpected exit.")),
		gaveUp:   prometheus.NewCounter(opts("child_gave_up_total", "Times the agent gave up restarting the replica process (supervise.max_restarts within supervise.window) and advertised failed.")),
		repairs:  prometheus.NewCounter(opts("child_repairs_total", "Repairs: restarts of a given-up replica process with a fresh restart budget.")),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "child_running",
			Help: "1 while the supervised replica process runs, else 0.",
		}),
	}
	for _, r := range exitReasons {
		m.exits.WithLabelValues(r)
	}
	return m
}

// count records one report of the supervisor.
func (m *childMetrics) count(ev childEvent) {
	switch ev.Kind {
	case childStart:
		m.starts.Inc()
		m.running.Set(1)
	case childExit:
		m.exits.WithLabelValues(ev.Reason).Inc()
		m.running.Set(0)
	case childRestart:
		m.restarts.Inc()
	case childGiveUp:
		m.gaveUp.Inc()
	case childRepair:
		m.repairs.Inc()
	}
}

func (m *childMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.starts, m.exits, m.restarts, m.gaveUp, m.repairs, m.running} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func newMetrics() *metrics {
	m := &metrics{
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "info",
			Help: "Always 1; its labels name the replica set and the replica this agent advertises.",
		}, []string{"set", "replica"}),
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
		drainProbe: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "drain_probes_total",
			Help: "Waits on the replica's drain probe (drain.probe_path) after a drain, by result: done (it answered 200) or timeout (drain.probe_timeout passed; the agent left anyway).",
		}, []string{"result"}),
		setCommands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "set_commands_total",
			Help: "Set stop and start commands applied (each changed what the agent does with its replica; repeats and stale ones are not counted), by command (stop, start).",
		}, []string{"command"}),
		retires: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "agent", Name: "retires_total",
			Help: "Retire commands carried out: the replica's ordinal was beyond its set's count, and it was drained and stopped for good (advertised with remove).",
		}),
	}
	m.setCommands.WithLabelValues("stop")
	m.setCommands.WithLabelValues("start")
	m.drainProbe.WithLabelValues("done")
	m.drainProbe.WithLabelValues("timeout")
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
	for _, c := range []prometheus.Collector{m.info, m.state, m.probes, m.reports, m.transitions, m.drainProbe, m.setCommands, m.retires} {
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
