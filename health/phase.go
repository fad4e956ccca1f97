package health

import "keyway/balancer"

// Phase is the phase of a replica set, as a pipeline replica set defines
// it (design.md). A Phase is a plain string; the zero value is not a
// phase.
type Phase string

// The phases.
const (
	PhaseCreated    Phase = "Created"    // declared, no replica seen yet
	PhaseScheduling Phase = "Scheduling" // replicas seen, none ever ready, none in rotation
	PhaseRunning    Phase = "Running"    // every declared replica ready and in rotation
	PhaseDegraded   Phase = "Degraded"   // some in rotation but not all; or none, after the set ran
	PhaseFailed     Phase = "Failed"     // replicas seen, none in rotation, at least one failed
	PhaseStopped    Phase = "Stopped"    // had replicas, all stopped or stopping (draining)
)

// Phases returns every phase in lifecycle order (for a gauge with one
// series per phase). The slice is new on every call.
func Phases() []Phase {
	return []Phase{PhaseCreated, PhaseScheduling, PhaseRunning, PhaseDegraded, PhaseFailed, PhaseStopped}
}

// ComputePhase returns the phase of a replica set from its declared
// replica count and the members its routing table knows
// ([balancer.Table.Members]). It is a pure function. declared < 1 means
// "as many as are seen".
//
// The first rule that applies wins:
//
//  1. no member                                  → Created
//  2. in rotation >= declared                    → Running
//  3. some in rotation                           → Degraded
//  4. every member stopped or draining           → Stopped
//  5. a member failed (state failed, or held out
//     with balancer.ReasonFailed by this proxy)  → Failed
//  6. no member ever ready (none on the ring)    → Scheduling
//  7. otherwise                                  → Degraded
//
// Rules 4–7 cover a set with nothing in rotation. A set whose every
// replica has been told to stop (draining: finishing in-flight work) or has
// stopped is Stopped: a graceful shutdown goes Running → Stopped, not
// through Degraded, and the rotation count still shows what is serving. A
// set whose replicas are all recovering, down in gossip or held out by
// health checks has run before and is not starting: it is Degraded —
// serving nothing — until one is back (Degraded or Running). Stopped wins over Failed because the
// replicas' own lifecycle says more than this proxy's hold. A member that
// is on the ring but restarting (starting again under its name) keeps the
// set Degraded rather than Scheduling, for the same reason.
func ComputePhase(declared int, ms []balancer.Member) Phase {
	if len(ms) == 0 {
		return PhaseCreated
	}
	if declared < 1 {
		declared = len(ms)
	}
	inRotation, stopping, failed, onRing := 0, 0, false, false
	for _, m := range ms {
		if m.InRotation {
			inRotation++
		}
		if m.State == balancer.StateStopped || m.State == balancer.StateDraining {
			stopping++
		}
		if m.State == balancer.StateFailed || m.Excluded&balancer.ReasonFailed != 0 {
			failed = true
		}
		if m.Slot >= 0 {
			onRing = true
		}
	}
	switch {
	case inRotation >= declared:
		return PhaseRunning
	case inRotation > 0:
		return PhaseDegraded
	case stopping == len(ms):
		return PhaseStopped
	case failed:
		return PhaseFailed
	case !onRing:
		return PhaseScheduling
	default:
		return PhaseDegraded
	}
}

// ComputeRunPhase is ComputePhase for a set whose replicas keyway runs (a
// run section): its declared count is the number of jobs asked for, so a
// set with jobs asked for and not yet running — no member yet, or one
// starting for the first time (not on the ring) — is Scheduling, unless a
// member failed or the set is otherwise Running, Failed or Stopped. A
// scale-out is Scheduling until the new replicas are ready, where
// ComputePhase would say Degraded. It is a pure function.
func ComputeRunPhase(declared int, ms []balancer.Member) Phase {
	p := ComputePhase(declared, ms)
	if p != PhaseDegraded && p != PhaseCreated {
		return p
	}
	up := 0
	for _, m := range ms {
		if m.State == balancer.StateFailed || m.Excluded&balancer.ReasonFailed != 0 {
			return p
		}
		if m.Slot >= 0 && m.State != balancer.StateStopped && m.State != balancer.StateDraining {
			up++
		}
	}
	if declared > 0 && up < declared {
		return PhaseScheduling
	}
	return p
}
