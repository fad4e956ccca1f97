package health

import (
	"time"

	"keyway/balancer"
)

// Supervision: a replica ejected supervision.max_ejections times within
// supervision.window is held out as failed (balancer.ReasonFailed) until
// supervision.cooldown passes or an operator resets it. The ejection that
// reaches the limit starts the hold instead of an ordinary ejection, so
// the replica leaves rotation once, with one reason. While held, trips
// are ignored; when the hold ends, the history and the backoff start
// over.

// windowLocked drops ejections older than the window from r's history and
// returns what is left.
func (c *Checker) windowLocked(r *replica, now time.Time) []time.Time {
	w := c.cfg.Supervision.Window
	i := 0
	for i < len(r.history) && now.Sub(r.history[i]) >= w {
		i++
	}
	if i > 0 {
		r.history = append(r.history[:0], r.history[i:]...)
	}
	return r.history
}

// startHoldLocked holds r out as failed; k is the kind that tripped the
// last ejection.
func (c *Checker) startHoldLocked(r *replica, k kind, now time.Time, st *step) {
	r.failed, r.failedUntil = true, now.Add(c.cfg.Supervision.Cooldown)
	r.ejected, r.ejectUntil, r.probation = false, time.Time{}, false
	r.m.holds.Inc()
	st.exclude(r, balancer.ReasonEjected, false) // normally not set: trips are ignored while ejected
	st.exclude(r, balancer.ReasonFailed, true)
	st.event(Event{Time: now, Kind: EventFailed, Set: r.set, Replica: r.name, Reason: k.String(), Ejections: len(r.history), Until: r.failedUntil})
}

// endHoldLocked lifts r's hold; why is "cooldown elapsed" or "reset".
func (c *Checker) endHoldLocked(r *replica, now time.Time, why string, st *step) {
	r.failed, r.failedUntil = false, time.Time{}
	r.history, r.level, r.probation = nil, 0, false
	r.c.reset()
	st.exclude(r, balancer.ReasonFailed, false)
	st.event(Event{Time: now, Kind: EventRecovered, Set: r.set, Replica: r.name, Reason: why})
}
