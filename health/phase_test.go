package health

import (
	"slices"
	"testing"

	"keyway/balancer"
)

// m builds a Member: state, on the ring or not, in rotation or not, and
// proxy-local reasons.
func m(name string, st balancer.State, onRing, inRotation bool, excl balancer.Reason) balancer.Member {
	slot := -1
	if onRing {
		slot = 0
	}
	return balancer.Member{Replica: balancer.Replica{Name: name, State: st}, Slot: slot, InRotation: inRotation, Excluded: excl}
}

var (
	ready    = func(n string) balancer.Member { return m(n, balancer.StateReady, true, true, 0) }
	starting = func(n string) balancer.Member { return m(n, balancer.StateStarting, false, false, 0) }
	stopped  = func(n string) balancer.Member { return m(n, balancer.StateStopped, true, false, 0) }
	draining = func(n string) balancer.Member { return m(n, balancer.StateDraining, true, false, 0) }
	recov    = func(n string) balancer.Member { return m(n, balancer.StateRecovering, true, false, 0) }
	failedSt = func(n string) balancer.Member { return m(n, balancer.StateFailed, true, false, 0) }
	ejected  = func(n string) balancer.Member {
		return m(n, balancer.StateReady, true, false, balancer.ReasonEjected)
	}
	held = func(n string) balancer.Member {
		return m(n, balancer.StateReady, true, false, balancer.ReasonEjected|balancer.ReasonFailed)
	}
)

func TestComputePhase(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		declared int
		ms       []balancer.Member
		want     Phase
	}{
		"created: nothing seen":                     {3, nil, PhaseCreated},
		"created: declared 0, nothing seen":         {0, nil, PhaseCreated},
		"scheduling: one starting":                  {3, []balancer.Member{starting("a")}, PhaseScheduling},
		"scheduling: all starting":                  {3, []balancer.Member{starting("a"), starting("b"), starting("c")}, PhaseScheduling},
		"scheduling: ready but down, never on ring": {2, []balancer.Member{m("a", balancer.StateReady, false, false, 0)}, PhaseScheduling},
		"running: all in rotation":                  {3, []balancer.Member{ready("a"), ready("b"), ready("c")}, PhaseRunning},
		"running: more than declared":               {2, []balancer.Member{ready("a"), ready("b"), ready("c")}, PhaseRunning},
		"running: declared reached, one starting":   {2, []balancer.Member{ready("a"), ready("b"), starting("c")}, PhaseRunning},
		"running: declared reached, one failed":     {2, []balancer.Member{ready("a"), ready("b"), failedSt("c")}, PhaseRunning},
		"running: declared 0 means all seen":        {0, []balancer.Member{ready("a"), ready("b")}, PhaseRunning},
		"degraded: declared 0, one of two out":      {0, []balancer.Member{ready("a"), ejected("b")}, PhaseDegraded},
		"degraded: fewer seen than declared":        {3, []balancer.Member{ready("a"), ready("b")}, PhaseDegraded},
		"degraded: one starting":                    {3, []balancer.Member{ready("a"), ready("b"), starting("c")}, PhaseDegraded},
		"degraded: one ejected":                     {3, []balancer.Member{ready("a"), ready("b"), ejected("c")}, PhaseDegraded},
		"degraded: one failed, others serve":        {3, []balancer.Member{ready("a"), failedSt("b"), failedSt("c")}, PhaseDegraded},
		"degraded: one stopped":                     {3, []balancer.Member{ready("a"), stopped("b"), stopped("c")}, PhaseDegraded},
		"degraded: none in rotation, all ejected":   {2, []balancer.Member{ejected("a"), ejected("b")}, PhaseDegraded},
		"degraded: none in rotation, recovering":    {2, []balancer.Member{recov("a"), recov("b")}, PhaseDegraded},
		"stopped: stopping (stopped + draining)":    {3, []balancer.Member{stopped("a"), stopped("b"), draining("c")}, PhaseStopped},
		"degraded: restarting under its name":       {1, []balancer.Member{m("a", balancer.StateStarting, true, false, 0)}, PhaseDegraded},
		"failed: none in rotation, one failed":      {3, []balancer.Member{failedSt("a"), recov("b"), starting("c")}, PhaseFailed},
		"failed: all failed":                        {2, []balancer.Member{failedSt("a"), failedSt("b")}, PhaseFailed},
		"failed: failed before ever ready":          {2, []balancer.Member{m("a", balancer.StateFailed, false, false, 0), starting("b")}, PhaseFailed},
		"failed: held out by this proxy":            {2, []balancer.Member{held("a"), ejected("b")}, PhaseFailed},
		"failed: failed and stopped":                {2, []balancer.Member{failedSt("a"), stopped("b")}, PhaseFailed},
		"stopped: all stopped":                      {3, []balancer.Member{stopped("a"), stopped("b"), stopped("c")}, PhaseStopped},
		"stopped: wins over this proxy's hold":      {2, []balancer.Member{m("a", balancer.StateStopped, true, false, balancer.ReasonFailed), stopped("b")}, PhaseStopped},
		"stopped: never on the ring":                {1, []balancer.Member{m("a", balancer.StateStopped, false, false, 0)}, PhaseStopped},
	}
	for name, tc := range cases {
		if got := ComputePhase(tc.declared, tc.ms); got != tc.want {
			t.Errorf("%s: %s, want %s", name, got, tc.want)
		}
	}
}

// A scripted life of a set of 3, as the integration scenario has
// it, plus Failed and the return from it.
func TestComputePhaseSequence(t *testing.T) {
	t.Parallel()
	steps := []struct {
		ms   []balancer.Member
		want Phase
	}{
		{nil, PhaseCreated},
		{[]balancer.Member{starting("a")}, PhaseScheduling},
		{[]balancer.Member{starting("a"), starting("b"), starting("c")}, PhaseScheduling},
		{[]balancer.Member{ready("a"), starting("b"), starting("c")}, PhaseDegraded},
		{[]balancer.Member{ready("a"), ready("b"), ready("c")}, PhaseRunning},
		{[]balancer.Member{ready("a"), ejected("b"), ready("c")}, PhaseDegraded},
		{[]balancer.Member{ready("a"), ready("b"), ready("c")}, PhaseRunning}, // Degraded → Running on recovery
		{[]balancer.Member{held("a"), held("b"), ejected("c")}, PhaseFailed},  // none in rotation
		{[]balancer.Member{held("a"), held("b"), ready("c")}, PhaseDegraded},
		{[]balancer.Member{ready("a"), ready("b"), ready("c")}, PhaseRunning},
		{[]balancer.Member{draining("a"), ready("b"), ready("c")}, PhaseDegraded},
		{[]balancer.Member{stopped("a"), draining("b"), draining("c")}, PhaseStopped},
		{[]balancer.Member{stopped("a"), stopped("b"), stopped("c")}, PhaseStopped},
	}
	for i, s := range steps {
		if p := ComputePhase(3, s.ms); p != s.want {
			t.Errorf("step %d: %s, want %s", i, p, s.want)
		}
	}
	if !slices.Equal(Phases(), []Phase{"Created", "Scheduling", "Running", "Degraded", "Failed", "Stopped"}) {
		t.Fatalf("Phases() = %v", Phases())
	}
}

func TestComputeRunPhase(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		declared int
		ms       []balancer.Member
		want     Phase
	}{
		"scheduling: no job up yet":                {3, nil, PhaseScheduling},
		"scheduling: scale-out, new jobs not seen": {5, []balancer.Member{ready("a"), ready("b"), ready("c")}, PhaseScheduling},
		"scheduling: scale-out, new ones starting": {4, []balancer.Member{ready("a"), ready("b"), ready("c"), starting("d")}, PhaseScheduling},
		"running: every job ready":                 {3, []balancer.Member{ready("a"), ready("b"), ready("c")}, PhaseRunning},
		"running: scale-in, leaving ones draining": {2, []balancer.Member{ready("a"), ready("b"), draining("c")}, PhaseRunning},
		"degraded: a job up but ejected":           {2, []balancer.Member{ready("a"), ejected("b")}, PhaseDegraded},
		"degraded: a job restarting on the ring":   {2, []balancer.Member{ready("a"), m("b", balancer.StateStarting, true, false, 1)}, PhaseDegraded},
		"failed wins over scheduling":              {3, []balancer.Member{failedSt("a"), starting("b")}, PhaseFailed},
		"degraded, not scheduling, with a failure": {3, []balancer.Member{ready("a"), failedSt("b")}, PhaseDegraded},
		"stopped stays stopped":                    {2, []balancer.Member{stopped("a"), stopped("b")}, PhaseStopped},
	}
	for name, c := range cases {
		if got := ComputeRunPhase(c.declared, c.ms); got != c.want {
			t.Errorf("%s: ComputeRunPhase(%d) = %s, want %s", name, c.declared, got, c.want)
		}
	}
}
