package health

import (
	"maps"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
)

// kind is the failure kind of a request outcome (kindNone: a success).
type kind uint8

const (
	kindNone    kind = iota
	kindConnect      // the connection could not be made
	kindTimeout      // no answer in time
	kindReset        // the exchange failed after the request was sent
	kind5xx          // the replica answered 500-599
	numKinds
)

var kindNames = [numKinds]string{"", "connect", "timeout", "reset", "5xx"}

// String returns the kind's name as used in passive.count and metrics, or
// "" for kindNone.
func (k kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return ""
}

func parseKind(s string) (kind, bool) {
	for k := kindConnect; k < numKinds; k++ {
		if kindNames[k] == s {
			return k, true
		}
	}
	return kindNone, false
}

// classify maps an outcome to a failure kind. The order matters: a dial
// that timed out is a connect failure (the request never left).
func classify(status int, err error) kind {
	switch {
	case err == nil && status >= 500:
		return kind5xx
	case err == nil:
		return kindNone
	case anyInChain(err, isConnectFailure):
		return kindConnect
	case anyInChain(err, isTimeout):
		return kindTimeout
	default:
		return kindReset
	}
}

// isConnectFailure recognises the proxy's DialError (ConnectFailure()
// true) and, for callers that pass plain net errors, a failed dial or a
// refused connection.
func isConnectFailure(err error) bool {
	switch e := err.(type) {
	case interface{ ConnectFailure() bool }:
		return e.ConnectFailure()
	case *net.OpError:
		return e.Op == "dial"
	case syscall.Errno:
		return e == syscall.ECONNREFUSED
	}
	return false
}

func isTimeout(err error) bool {
	if e, ok := err.(interface{ Timeout() bool }); ok {
		return e.Timeout()
	}
	return false
}

// anyInChain reports whether f holds for err or any error it wraps. It
// walks the chain with type assertions: unlike errors.As it does not
// allocate, which matters on the request path.
func anyInChain(err error, f func(error) bool) bool {
	for err != nil {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if anyInChain(e, f) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// counters are one replica's passive inputs, written by Observe on the
// request path (atomics only) and read and reset by the sweeper. Padded to
// a cache line so that replicas do not share one.
type counters struct {
	consec atomic.Int64  // counted failures in a row
	trip   atomic.Uint32 // the kind that made consec reach the threshold, until ejectOnThreshold or the sweeper takes it
	ok     atomic.Bool   // a success since the sweeper last looked
	_      [64 - 8 - 4 - 1]byte
}

// reset clears the counters when an ejection or hold ends, so that
// failures of requests that were in flight meanwhile do not count twice.
func (k *counters) reset() {
	k.consec.Store(0)
	k.trip.Store(0)
	k.ok.Store(false)
}

// observeMap is Observe's immutable index: set → replica → counters.
type observeMap map[string]map[string]*counters

// publishObserveLocked publishes a new index with set s's current
// replicas. c.mu is held.
func (c *Checker) publishObserveLocked(s *setState) {
	old := *c.obs.Load()
	m := make(observeMap, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	inner := make(map[string]*counters, len(s.replicas))
	for name, r := range s.replicas {
		inner[name] = r.c
	}
	m[s.name] = inner
	c.obs.Store(&m)
}

// Observe records the outcome of one request to a replica: err == nil
// means the replica answered status. It has the shape of
// the proxy's Observer, called on the request path: no lock, no
// allocation, a few atomic operations on the replica's counters (and in
// the steady state of successes, atomic loads only). Outcomes for
// replicas that are not targets are ignored. d is not used yet.
//
// The one call whose failure makes the count reach
// passive.consecutive_failures ejects the replica before it returns (see
// ejectOnThreshold): it tells the Sink, so the caller's request is the
// last one routed to the replica. That call takes the Checker's locks and
// allocates; every other call is as above.
//
// Classification: an err with ConnectFailure() true (the proxy's
// DialError), a *net.OpError from a dial or ECONNREFUSED → connect; else
// an err with Timeout() true → timeout; any other err → reset; status >=
// 500 → 5xx; anything else is a success and resets the count of failures
// in a row. Do not pass errors that say nothing about the replica (a
// stale pooled connection, an exhausted local pool). Safe for concurrent
// use.
func (c *Checker) Observe(set, replica string, status int, err error, d time.Duration) {
	if !c.cfg.Passive.Enabled {
		return
	}
	r := (*c.obs.Load())[set][replica]
	if r == nil {
		return
	}
	k := classify(status, err)
	if k == kindNone {
		// Loads first: in the steady state nothing is written, so the
		// replica's cache line is not bounced between cores.
		if r.consec.Load() != 0 {
			r.consec.Store(0)
		}
		if !r.ok.Load() {
			r.ok.Store(true)
		}
		return
	}
	if c.countMask&(1<<k) == 0 {
		return
	}
	if r.consec.Add(1) == c.threshold {
		// Latched until taken: a success right after the N-th failure
		// does not undo the trip. Exactly one call sees the count reach
		// the threshold, so only one request per run of failures goes on.
		r.trip.Store(uint32(k))
		c.ejectOnThreshold(set, replica, r)
	}
}

// ejectOnThreshold ejects the replica whose counters r just tripped, at
// once, as Envoy's outlier detection does: waiting for the next sweep let
// more requests reach a replica already known to fail. It
// makes the sweeper's decision for this one replica, under the same
// locks, and delivers it from the caller's goroutine as Reset does: the
// Sink first, so the routing has changed when Observe returns, then the
// event. A replica the share cap keeps in is marked and counted now, and
// logged once the locks are released; a sweep ejects it when there is
// room. A replica already out (requests that were in flight fail) is left
// to the sweeper, which ignores the trip.
func (c *Checker) ejectOnThreshold(set, name string, r *counters) {
	if n := c.tripNow(set, name, r); n.k != kindNone {
		c.logCapped(set, name, n)
	}
}

// tripNow decides and delivers ejectOnThreshold's transition.
func (c *Checker) tripNow(set, name string, r *counters) cappedNote {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	var st step
	var n cappedNote
	c.mu.Lock()
	c.forgetGoneLocked(&st)
	if s := c.sets[set]; s != nil {
		// The same target, not one of the same name added since.
		if rep := s.replicas[name]; rep != nil && rep.c == r {
			n = c.tripLocked(s, rep, c.now(), &st)
		}
	}
	c.mu.Unlock()
	c.apply(&st)
	return n
}

// cappedNote is what the share-cap warning says: the failure kind
// (kindNone: nothing to log), the replicas of the set out and in all.
type cappedNote struct {
	k      kind
	out, n int
}

// tripLocked ejects r for its latched trip if r is in rotation and not
// already waiting for room under the share cap, and if there is room;
// without room it marks r as capped and counts it, returning what to log.
// c.mu is held.
func (c *Checker) tripLocked(s *setState, r *replica, now time.Time, st *step) cappedNote {
	if r.ejected || r.failed || r.capped != kindNone {
		return cappedNote{}
	}
	k := kind(r.c.trip.Swap(0))
	if k == kindNone {
		return cappedNote{} // a sweep took it first
	}
	out := 0
	for _, x := range s.replicas {
		if x.ejected || x.failed {
			out++
		}
	}
	if out >= c.maxOut(len(s.replicas)) {
		s.capped.Inc()
		r.capped = k
		return cappedNote{k, out, len(s.replicas)}
	}
	c.ejectLocked(r, k, now, st)
	s.ejected.Set(float64(out + 1))
	return cappedNote{}
}

// logCapped warns that a replica stays in rotation because of the share
// cap (once per stretch of being capped).
func (c *Checker) logCapped(set, replica string, n cappedNote) {
	c.log.Warn("replica should be ejected, but the share cap keeps it in rotation",
		zap.String("set", set), zap.String("replica", replica), zap.Stringer("reason", n.k),
		zap.Int("out", n.out), zap.Int("replicas", n.n), zap.Float64("max_ejected_share", c.cfg.Passive.MaxEjectedShare))
}

// ejectionFor returns how long an ejection at backoff level lasts.
func (c *Checker) ejectionFor(level int) time.Duration {
	d := c.cfg.Passive.BaseEjection
	for i := 0; i < level && d < c.cfg.Passive.MaxEjection; i++ {
		d *= 2
	}
	return min(d, c.cfg.Passive.MaxEjection)
}

// maxOut is how many of n replicas passive checks may hold out at once.
func (c *Checker) maxOut(n int) int {
	m := int(float64(n)*c.cfg.Passive.MaxEjectedShare + 1e-9)
	if n >= 2 && m < 1 {
		m = 1
	}
	return m
}

// sweep is one tick of the passive detector at time now: it ends
// ejections and holds that are due, resets the backoff of readmitted
// replicas that answered a request, and ejects, within each set's share
// cap, replicas whose counters tripped but that are still in rotation:
// those the share cap kept in, once there is room (ejectOnThreshold ejects
// the others before their trip's Observe returns). Run calls it every
// Passive.Interval; tests call it directly with their own clock.
func (c *Checker) sweep(now time.Time) {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	var st step
	c.mu.Lock()
	c.forgetGoneLocked(&st)
	for _, name := range slices.Sorted(maps.Keys(c.sets)) {
		c.sweepSetLocked(c.sets[name], now, &st)
	}
	c.mu.Unlock()
	c.apply(&st)
}

func (c *Checker) sweepSetLocked(s *setState, now time.Time, st *step) {
	rs := make([]*replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		rs = append(rs, r)
	}
	// The worst first: when the share cap binds, the replica with the
	// longest run of failures is the one ejected.
	slices.SortFunc(rs, func(a, b *replica) int {
		if x, y := a.c.consec.Load(), b.c.consec.Load(); x != y {
			if x > y {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})

	// 1. Holds and ejections that are over (this frees room under the cap).
	for _, r := range rs {
		if r.failed && !now.Before(r.failedUntil) {
			c.endHoldLocked(r, now, "cooldown elapsed", st)
		}
		if r.ejected && !now.Before(r.ejectUntil) {
			c.readmitLocked(r, now, "backoff elapsed", st)
		}
	}

	// 2. Trips, and successes after readmission.
	out := 0
	for _, r := range rs {
		if r.ejected || r.failed {
			out++
		}
	}
	limit := c.maxOut(len(rs))
	for _, r := range rs {
		k := kind(r.c.trip.Swap(0))
		ok := r.c.ok.Swap(false)
		if r.ejected || r.failed {
			continue // in-flight requests finishing: ignore
		}
		if k == kindNone && r.capped != kindNone {
			if r.c.consec.Load() >= c.threshold {
				k = r.capped // still failing, still waiting for room
			} else {
				r.capped = kindNone // a success since: no longer a candidate
			}
		}
		if k == kindNone {
			if ok && r.probation {
				// A success after readmission (and no new trip): the
				// replica recovered, the next ejection is short again.
				r.level, r.probation = 0, false
			}
			continue
		}
		if out >= limit {
			if r.capped == kindNone {
				s.capped.Inc()
				c.logCapped(r.set, r.name, cappedNote{k, out, len(rs)})
			}
			r.capped = k
			continue
		}
		r.capped = kindNone
		c.ejectLocked(r, k, now, st)
		out++
	}
	s.ejected.Set(float64(out))
}

// ejectLocked ejects r for failure kind k — or, when this ejection reaches
// supervision.max_ejections within the window, holds it out as failed.
func (c *Checker) ejectLocked(r *replica, k kind, now time.Time, st *step) {
	r.lastKind = k
	r.history = append(c.windowLocked(r, now), now)
	r.m.ejections[k].Inc()
	r.ejections++
	if sup := c.cfg.Supervision; sup.MaxEjections > 0 && len(r.history) >= sup.MaxEjections {
		c.startHoldLocked(r, k, now, st)
		return
	}
	d := c.ejectionFor(r.level)
	if d < c.cfg.Passive.MaxEjection {
		r.level++
	}
	r.ejected, r.ejectUntil, r.probation = true, now.Add(d), false
	r.c.reset() // what requests in flight report while ejected starts from zero
	st.exclude(r, balancer.ReasonEjected, true)
	st.event(Event{Time: now, Kind: EventEjected, Set: r.set, Replica: r.name, Reason: k.String(), Ejections: len(r.history), Until: r.ejectUntil})
}

// readmitLocked ends r's ejection.
func (c *Checker) readmitLocked(r *replica, now time.Time, why string, st *step) {
	r.ejected, r.ejectUntil, r.probation = false, time.Time{}, true
	r.c.reset()
	st.exclude(r, balancer.ReasonEjected, false)
	st.event(Event{Time: now, Kind: EventReadmitted, Set: r.set, Replica: r.name, Reason: why})
}

// resetLocked is the operator's reset of r.
func (c *Checker) resetLocked(s *setState, r *replica, now time.Time, st *step) {
	if r.failed {
		c.endHoldLocked(r, now, "reset", st)
	}
	if r.ejected {
		c.readmitLocked(r, now, "reset", st)
	}
	r.history, r.level, r.probation, r.capped = nil, 0, false, kindNone
	r.c.reset()
	out := 0
	for _, x := range s.replicas {
		if x.ejected || x.failed {
			out++
		}
	}
	s.ejected.Set(float64(out))
}
