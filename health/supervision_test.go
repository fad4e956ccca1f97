package health

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

func supervisionConfig() Config {
	cfg := DefaultConfig()
	cfg.Supervision = SupervisionConfig{MaxEjections: 3, Window: 10 * time.Minute, Cooldown: 30 * time.Minute}
	return cfg
}

// ejectCycle makes a fail (which ejects it on the threshold), sweeps, and
// sweeps again once its ejection is over, returning the events.
func (f *fixture) ejectCycle(t *testing.T, replica string) []Event {
	t.Helper()
	f.fail("s", replica, 5)
	f.sweepAfter(time.Second)
	ev := f.ev.take()
	if len(ev) == 1 && ev[0].Kind == EventEjected {
		f.sweepAfter(ev[0].Until.Sub(f.clock.Now()))
		ev = append(ev, f.ev.take()...)
	}
	return ev
}

// The MaxEjections-th ejection within the window holds the replica out as
// failed until the cooldown passes; trips are ignored meanwhile.
func TestSupervisionHoldUntilCooldown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, supervisionConfig())
	f.c.SetTargets("s", targets("s", "a", "b"))
	f.ejectCycle(t, "a")
	f.ejectCycle(t, "a")
	f.sink.take()

	t0 := f.clock.Add(time.Second)
	f.fail("s", "a", 5)
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonFailed, true})
	ev := f.ev.take()
	if len(ev) != 1 || ev[0].Kind != EventFailed || ev[0].Ejections != 3 || !ev[0].Until.Equal(t0.Add(30*time.Minute)) || ev[0].Reason != "5xx" {
		t.Fatalf("events = %+v", ev)
	}
	if n := testutil.ToFloat64(f.c.metrics.holds.WithLabelValues("s", "a")); n != 1 {
		t.Fatalf("keyway_failed_holds_total = %v", n)
	}
	if n := testutil.ToFloat64(f.c.metrics.ejections.WithLabelValues("s", "a", "5xx")); n != 3 {
		t.Fatalf("keyway_ejections_total = %v, want 3 (the hold's included)", n)
	}
	h := f.c.Snapshot("s")[0]
	if !h.FailedUntil.Equal(t0.Add(30*time.Minute)) || h.Excluded != "failed" || h.Ejections != 3 {
		t.Fatalf("snapshot = %+v", h)
	}

	// Held through the ordinary backoff and further failures.
	for range 29 {
		f.fail("s", "a", 5)
		f.sweepAfter(time.Minute)
	}
	callsEqual(t, f.sink.take())
	f.sweepAfter(t0.Add(30*time.Minute - time.Millisecond).Sub(f.clock.Now()))
	callsEqual(t, f.sink.take())
	f.sweepAfter(time.Millisecond)
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonFailed, false})
	if ev := f.ev.take(); !slices.Equal(kinds(ev), []string{"recovered a"}) || ev[0].Reason != "cooldown elapsed" {
		t.Fatalf("events = %+v", ev)
	}

	// The history starts over: the next ejection is an ordinary one, at
	// the base duration.
	ev = f.ejectCycle(t, "a")
	if !slices.Equal(kinds(ev), []string{"ejected a", "readmitted a"}) || ev[0].Ejections != 1 || ev[0].Until.Sub(ev[0].Time) != 10*time.Second {
		t.Fatalf("after recovery: %+v", ev)
	}
}

// Reset lifts a hold at once, from the caller's goroutine, and clears
// the history; it also ends an ordinary ejection.
func TestSupervisionReset(t *testing.T) {
	t.Parallel()
	f := newFixture(t, supervisionConfig())
	f.c.SetTargets("s", targets("s", "a", "b"))
	for range 3 {
		f.ejectCycle(t, "a")
	}
	f.sink.take()
	if f.sink.reasons("s", "a") != balancer.ReasonFailed {
		t.Fatalf("not held: %s", f.sink.reasons("s", "a"))
	}
	f.c.Reset("s", "a")
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonFailed, false})
	if ev := f.ev.take(); !slices.Equal(kinds(ev), []string{"recovered a"}) || ev[0].Reason != "reset" {
		t.Fatalf("events = %+v", ev)
	}
	if h := f.c.Snapshot("s")[0]; h.Ejections != 0 || !h.FailedUntil.IsZero() || h.NextEjection != 10*time.Second {
		t.Fatalf("snapshot after reset = %+v", h)
	}

	// An ordinary ejection, then Reset: readmitted, backoff back to base.
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	f.sink.take()
	f.ev.take()
	f.c.Reset("s", "a")
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonEjected, false})
	if ev := f.ev.take(); !slices.Equal(kinds(ev), []string{"readmitted a"}) || ev[0].Reason != "reset" {
		t.Fatalf("events = %+v", ev)
	}
	// Unknown replicas and sets are ignored.
	f.c.Reset("s", "zz")
	f.c.Reset("zz", "a")
	callsEqual(t, f.sink.take())
}

// Ejections older than the window do not count.
func TestSupervisionWindow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, supervisionConfig())
	f.c.SetTargets("s", targets("s", "a", "b"))
	for i := range 6 {
		ev := f.ejectCycle(t, "a")
		if ev[0].Kind != EventEjected {
			t.Fatalf("cycle %d: %+v, want an ordinary ejection", i, ev)
		}
		if i > 0 && ev[0].Ejections != 2 {
			t.Fatalf("cycle %d: %d ejections in the window, want 2", i, ev[0].Ejections)
		}
		f.c.Observe("s", "a", 200, nil, 0) // keeps the backoff at base
		f.sweepAfter(6 * time.Minute)      // the window is 10m: at most 2 fall in it
	}
	callsEqual(t, f.sink.take()[:2], call{"s", "a", balancer.ReasonEjected, true}, call{"s", "a", balancer.ReasonEjected, false})
}

// A hold counts against the share cap like an ejection.
func TestSupervisionHoldCountsAgainstCap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, supervisionConfig())
	f.c.SetTargets("s", targets("s", "a", "b"))
	for range 3 {
		f.ejectCycle(t, "a")
	}
	f.sink.take()
	f.fail("s", "b", 5)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take())
	if n := testutil.ToFloat64(f.c.metrics.capped.WithLabelValues("s")); n != 1 {
		t.Fatalf("capped = %v, want 1", n)
	}
}
