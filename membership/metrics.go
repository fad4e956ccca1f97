package membership

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	members      *prometheus.GaugeVec // role, status
	badMeta      prometheus.Counter
	badMsgs      prometheus.Counter
	droppedMsgs  prometheus.Counter
	events       prometheus.Counter
	joinFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "members",
			Help: "Gossip members this node knows, by role and status (alive, dead, left), itself included.",
		}, []string{"role", "status"}),
		badMeta: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "bad_metadata_total",
			Help: "Peers ignored because their metadata was malformed, oversized or of another version.",
		}),
		badMsgs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "bad_messages_total",
			Help: "Malformed user messages received.",
		}),
		droppedMsgs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "dropped_messages_total",
			Help: "User messages dropped because the handler lagged.",
		}),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "events_total",
			Help: "Membership events (join, update, leave) received.",
		}),
		joinFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "join_failures_total",
			Help: "Failed attempts to join the seed addresses.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.members, m.badMeta, m.badMsgs, m.droppedMsgs, m.events, m.joinFailures)
	}
	return m
}

func (m *metrics) observe(ms []Member) {
	m.members.Reset()
	for _, r := range []Role{RoleProxy, RoleReplica} {
		for _, s := range []Status{StatusAlive, StatusDead, StatusLeft} {
			m.members.WithLabelValues(r.String(), s.String()).Set(0)
		}
	}
	for _, x := range ms {
		m.members.WithLabelValues(x.Meta.Role.String(), x.Status.String()).Inc()
	}
}
