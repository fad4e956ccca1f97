package agent

import "keyway/balancer"

// event is an input of the lifecycle state machine.
type event uint8

const (
	evProbePass  event = iota + 1 // the readiness probe passed
	evProbeFail                   // the readiness probe failed
	evDrain                       // shutdown requested (SIGTERM): stop taking new requests
	evStop                        // drained (or drain timed out) and the quiet period is over
	evHold                        // an operator drained the replica (admin API); step ignores it
	evRelease                     // an operator undrained it; step ignores it
	evChildStart                  // the supervised process started (first start, restart or repair)
	evChildExit                   // the supervised process exited unexpectedly; a restart may follow
	evGiveUp                      // the supervisor gave up restarting the process
	evSetStop                     // the replica's set was stopped: drain, then stop (evStop) but stay
	evSetStart                    // the replica's set was started again
)

func (e event) String() string {
	switch e {
	case evProbePass:
		return "probe_pass"
	case evProbeFail:
		return "probe_fail"
	case evDrain:
		return "drain"
	case evStop:
		return "stop"
	case evHold:
		return "hold"
	case evRelease:
		return "release"
	case evChildStart:
		return "process_start"
	case evChildExit:
		return "process_exit"
	case evGiveUp:
		return "give_up"
	case evSetStop:
		return "set_stop"
	case evSetStart:
		return "set_start"
	}
	return "unknown"
}

// lifecycle is the state machine's whole state: the replica's lifecycle
// state and the consecutive probe results that count towards the next
// transition. It is a plain value without a clock: time enters only
// through the events the runner feeds it.
type lifecycle struct {
	State  balancer.State
	Passes int // consecutive passes since the last failure or transition
	Fails  int // consecutive failures since the last pass or transition
	// Down says the supervised process is not running (it exited, or the
	// supervisor gave up): probe results are ignored until it starts
	// again, so that a probe answered before the exit cannot make the
	// replica ready. Always false without supervision.
	Down bool
	// SetStop says the replica drains, or is stopped, because its set was
	// stopped: unlike a shutdown, a set start may start it again. A
	// shutdown (drain) takes the replica over and clears it.
	SetStop bool
}

// step returns the lifecycle after ev and whether the state changed. It is
// a pure function of its inputs (design.md, "Lifecycle states"):
//
//	starting   --rise passes-->  ready
//	ready      --fall fails-->   recovering
//	recovering --rise passes-->  ready
//	starting, ready, recovering, failed --drain--> draining
//	any        --stop-->         stopped
//
// with a supervised process:
//
//	starting, ready, recovering --process exit--> recovering (down)
//	starting, recovering, failed --process start--> starting
//	starting, ready, recovering --give up--> failed (down)
//
// and for a set stop (the operator stopped the replica's set; the agent
// stays):
//
//	starting, ready, recovering, failed --set stop--> draining (set stop)
//	draining (set stop) --stop--> stopped (set stop)
//	draining, stopped (set stop) --set start--> starting
//
// Probe results are ignored once draining, stopped or failed, and while
// the process is down. Stopped is final except after a set stop; a
// shutdown's drain clears the set stop mark, so that a stopped replica
// that is shutting down stays stopped. Once draining, process events
// change nothing: the replica is going away. Counters reset on every
// transition, so each threshold counts results observed in the current
// state only.
func step(l lifecycle, ev event, rise, fall int) (lifecycle, bool) {
	prev := l.State
	live := l.State == balancer.StateStarting || l.State == balancer.StateReady || l.State == balancer.StateRecovering
	switch ev {
	case evProbePass, evProbeFail:
		if !live || l.Down {
			return l, false
		}
		if ev == evProbePass {
			l.Passes, l.Fails = l.Passes+1, 0
		} else {
			l.Passes, l.Fails = 0, l.Fails+1
		}
		switch {
		case l.State == balancer.StateReady && l.Fails >= fall:
			l.State = balancer.StateRecovering
		case l.State != balancer.StateReady && l.Passes >= rise:
			l.State = balancer.StateReady
		}
	case evDrain:
		l.SetStop = false
		if l.State == balancer.StateDraining || l.State == balancer.StateStopped {
			return l, false
		}
		l.State = balancer.StateDraining
	case evSetStop:
		if l.State == balancer.StateDraining || l.State == balancer.StateStopped {
			// Already going (a shutdown wins), or already set stopped.
			return l, false
		}
		l.State, l.SetStop = balancer.StateDraining, true
	case evSetStart:
		if !l.SetStop {
			return l, false
		}
		l.State, l.SetStop, l.Down = balancer.StateStarting, false, false
	case evStop:
		l.State = balancer.StateStopped
	case evChildExit:
		if !live {
			return l, false
		}
		l.Down, l.Passes, l.Fails = true, 0, 0
		l.State = balancer.StateRecovering
	case evChildStart:
		if !live && l.State != balancer.StateFailed {
			return l, false
		}
		l.Down, l.Passes, l.Fails = false, 0, 0
		l.State = balancer.StateStarting
	case evGiveUp:
		if !live {
			return l, false
		}
		l.Down = true
		l.State = balancer.StateFailed
	}
	if l.State != prev {
		l.Passes, l.Fails = 0, 0
		return l, true
	}
	return l, false
}
