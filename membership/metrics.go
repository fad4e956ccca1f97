package membership

import (
	"github.com/prometheus/client_golang/prometheus"
	"slices"

	"keyway/balancer"
)

type metrics struct {
	members      *prometheus.GaugeVec // role, status
	replicas     *prometheus.GaugeVec // state
	healthScore  prometheus.GaugeFunc
	badMeta      prometheus.Counter
	badMsgs      prometheus.Counter
	droppedMsgs  prometheus.Counter
	events       prometheus.Counter
	joinFailures prometheus.Counter
	rejected     *prometheus.CounterVec // reason
}

var (
	roles    = []Role{RoleProxy, RoleReplica}
	statuses = []Status{StatusAlive, StatusDead, StatusLeft}
	// replicaStates are the lifecycle states keyway_gossip_replicas has a
	// series for: every state but unknown, which DecodeMeta accepts but
	// an agent never advertises (such a replica is counted nowhere).
	replicaStates = []balancer.State{
		balancer.StateStarting, balancer.StateReady, balancer.StateDraining,
		balancer.StateRecovering, balancer.StateStopped, balancer.StateFailed,
	}
)

// newMetrics builds the Node's collectors and registers them on reg (if
// non-nil). healthScore reads memberlist's awareness score.
func newMetrics(reg prometheus.Registerer, healthScore func() int) *metrics {
	m := &metrics{
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "members",
			Help: "Gossip members this node knows, by role and status (alive, dead, left), itself included.",
		}, []string{"role", "status"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "replicas",
			Help: "Replica members alive in gossip, by the lifecycle state they advertise (starting, ready, draining, recovering, stopped, failed).",
		}, []string{"state"}),
		healthScore: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "health_score",
			Help: "memberlist's awareness (Lifeguard) score of this node: 0 is healthy; higher means it has been missing probe acks and may itself be slow or degraded (its probe timeouts are stretched accordingly); -1 while gossip is not running.",
		}, func() float64 { return float64(healthScore()) }),
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
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "gossip", Name: "rejected_total",
			Help: "Inbound gossip packets and streams this node discarded, by reason: decrypt (not encrypted with a key of this node's, or encrypted while it has none), label (another cluster label), other (malformed); and user messages and claims (gossip metadata) refused as not authenticated for their role: unsigned, bad_signature, unknown_key, wrong_key (a key of another role or set), stale, future (a stamp outside the one-minute window), replay, not_proxy, unknown_kind, claim_conflict (a second live claim to a replica name).",
		}, []string{"reason"}),
	}
	for _, r := range append(slices.Clip(rejectReasons), authRejectReasons...) {
		m.rejected.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.members, m.replicas, m.healthScore, m.badMeta, m.badMsgs, m.droppedMsgs, m.events, m.joinFailures, m.rejected)
	}
	return m
}

// observe sets the member gauges from a snapshot. Every series always
// exists (0 when no member matches) and is set in place, never reset, so
// that a scrape never finds one missing.
func (m *metrics) observe(ms []Member) {
	type roleStatus struct {
		r Role
		s Status
	}
	members := map[roleStatus]int{}
	replicas := map[balancer.State]int{}
	for _, x := range ms {
		members[roleStatus{x.Meta.Role, x.Status}]++
		if x.Meta.Role == RoleReplica && x.Status == StatusAlive {
			replicas[x.Meta.State]++
		}
	}
	for _, r := range roles {
		for _, s := range statuses {
			m.members.WithLabelValues(r.String(), s.String()).Set(float64(members[roleStatus{r, s}]))
		}
	}
	for _, st := range replicaStates {
		m.replicas.WithLabelValues(st.String()).Set(float64(replicas[st]))
	}
}
