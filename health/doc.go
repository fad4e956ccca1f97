// Package health decides which replicas a proxy keeps in rotation beyond
// what their agents advertise, and names the phase of a replica set.
//
// A [Checker] watches every ring member of every replica set the proxy
// serves ([Checker.SetTargets]) in two ways, and reports only transitions
// to a [Sink] — the proxy, which turns each into
// [balancer.Router.SetExcluded] on the replica's set. Neither ever changes
// the ring: a replica held out keeps its partitions, and its keys go to
// their stand-ins (failover next) or are refused (failover strict) until
// it returns.
//
// # Active probes (balancer.ReasonProbe)
//
// Off by default (agents already probe their replica's readiness); meant
// for static replicas. One loop in [Checker.Run] sends GET
// http://ADDR/active.path to each target every active.interval, the first
// time after a random delay within one interval, with at most one probe
// in flight per target and at most active.concurrency in all, each bounded
// by active.timeout. The answer passes when its status is in
// active.expect_status. A verdict with rise/fall hysteresis (verdict.go, a
// pure state machine) turns results into up/down: a target starts up,
// goes down after active.fall failures in a row and comes back after
// active.rise passes in a row.
//
// # Passive ejection (balancer.ReasonEjected)
//
// The proxy reports the outcome of every attempt with [Checker.Observe],
// on the request path: a map lookup in an immutable index and a few
// atomics on the replica's counters, no lock, no allocation. Failures are
// classified by error type (connect, timeout, reset) or status (5xx);
// passive.count says which count. The failure that makes a replica's
// count of counted failures in a row reach passive.consecutive_failures
// ejects it before Observe returns, so that request is the last one
// routed to it: for passive.base_ejection, doubled on each repeat up to
// passive.max_ejection; a successful request after its readmission
// resets the backoff. A sweeper ticking every passive.interval ends
// ejections that are due. No more than passive.max_ejected_share of a set
// is held out by passive checks at once (ejections and holds together;
// with two or more replicas at least one may go); a replica kept in by
// that cap is counted by the next sweep, and ejected by a sweep as soon
// as there is room if it is still failing.
//
// # Supervision (balancer.ReasonFailed)
//
// A replica whose ejections reach supervision.max_ejections within
// supervision.window is held out as failed instead of being ejected once
// more, until supervision.cooldown passes or an operator calls
// [Checker.Reset]. It stops a replica that breaks under load from
// flapping in and out forever.
//
// # Phases
//
// [ComputePhase] is a pure function from a set's declared replica count
// and its table's members to its [Phase] (Created, Scheduling, Running,
// Degraded, Failed, Stopped); its doc gives the precedence for the edge
// cases.
//
// # Concurrency
//
// Observe, SetTargets and Snapshot may be called from any goroutine;
// SetTargets and Snapshot never call the Sink, and SetTargets is cheap
// enough for a Router hook. Run owns every goroutine: its loop schedules
// probes, ticks the sweeper, forgets removed targets (clearing the
// reasons it set for them) and delivers transitions, serialized, to the
// Sink and then to Options.OnEvent. Reset, and the Observe call that
// ejects a replica on the threshold, deliver their own transitions from
// the caller's goroutine, serialized with Run's.
//
// # Metrics
//
// keyway_health_probes_total{set,replica,result},
// keyway_health_probe_up{set,replica},
// keyway_ejections_total{set,replica,reason},
// keyway_ejected_replicas{set},
// keyway_ejection_share_capped_total{set} and
// keyway_failed_holds_total{set,replica}; per-replica series are deleted
// when a target is forgotten.
package health
