package health

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/internal/metricstest"
)

// The exposition after one ejection, one capped replica and one hold, on
// a pedantic registry; then the per-replica series of a forgotten target
// are gone.
func TestMetricsExposition(t *testing.T) {
	t.Parallel()
	cfg := supervisionConfig()
	cfg.Supervision.MaxEjections = 2
	cfg.Active.Enabled = true
	f := newFixture(t, cfg)
	f.c.SetTargets("s", targets("s", "a", "b"))
	f.ejectCycle(t, "a") // a: ejection 1 (5xx), readmitted
	// Both trip; b first, so b is ejected and a, finding no room (1 of 2
	// may be out), is capped.
	f.fail("s", "b", 5)
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	f.c.Observe("s", "a", 200, nil, 0) // a recovers: no longer a candidate
	f.sweepAfter(10 * time.Second)     // b readmitted
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second) // a: ejection 2 within the window → a hold

	const names = `keyway_ejections_total keyway_ejected_replicas keyway_ejection_share_capped_total keyway_failed_holds_total keyway_health_probe_up keyway_health_probes_total`
	want := `
# HELP keyway_ejected_replicas Replicas of a set held out of rotation by passive checks now (ejected or in a supervision hold).
# TYPE keyway_ejected_replicas gauge
keyway_ejected_replicas{set="s"} 1
# HELP keyway_ejection_share_capped_total Times a replica that should have been ejected stayed in rotation because passive.max_ejected_share of its set was already out.
# TYPE keyway_ejection_share_capped_total counter
keyway_ejection_share_capped_total{set="s"} 1
# HELP keyway_ejections_total Passive ejections of replicas after consecutive failed requests, by the failure kind that tripped them (connect, timeout, reset, 5xx); includes ejections that started a supervision hold.
# TYPE keyway_ejections_total counter
keyway_ejections_total{reason="5xx",replica="a",set="s"} 2
keyway_ejections_total{reason="5xx",replica="b",set="s"} 1
keyway_ejections_total{reason="connect",replica="a",set="s"} 0
keyway_ejections_total{reason="connect",replica="b",set="s"} 0
keyway_ejections_total{reason="reset",replica="a",set="s"} 0
keyway_ejections_total{reason="reset",replica="b",set="s"} 0
keyway_ejections_total{reason="timeout",replica="a",set="s"} 0
keyway_ejections_total{reason="timeout",replica="b",set="s"} 0
# HELP keyway_failed_holds_total Supervision holds: a replica ejected supervision.max_ejections times within supervision.window, held out as failed.
# TYPE keyway_failed_holds_total counter
keyway_failed_holds_total{replica="a",set="s"} 1
keyway_failed_holds_total{replica="b",set="s"} 0
# HELP keyway_health_probe_up Active probe verdict of a ring member after rise/fall hysteresis: 1 up, 0 down (held out of rotation).
# TYPE keyway_health_probe_up gauge
keyway_health_probe_up{replica="a",set="s"} 1
keyway_health_probe_up{replica="b",set="s"} 1
# HELP keyway_health_probes_total Active health probes of ring members, by result (pass, bad_status, timeout, error).
# TYPE keyway_health_probes_total counter
keyway_health_probes_total{replica="a",result="bad_status",set="s"} 0
keyway_health_probes_total{replica="a",result="error",set="s"} 0
keyway_health_probes_total{replica="a",result="pass",set="s"} 0
keyway_health_probes_total{replica="a",result="timeout",set="s"} 0
keyway_health_probes_total{replica="b",result="bad_status",set="s"} 0
keyway_health_probes_total{replica="b",result="error",set="s"} 0
keyway_health_probes_total{replica="b",result="pass",set="s"} 0
keyway_health_probes_total{replica="b",result="timeout",set="s"} 0
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), strings.Fields(names)...); err != nil {
		t.Fatal(err)
	}

	metricstest.Lint(t, f.reg)

	// Forget a: its series go; b's and the set's stay.
	f.c.SetTargets("s", targets("s", "a", "b")[1:])
	for _, name := range strings.Fields(names) {
		n, err := testutil.GatherAndCount(f.reg, name)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"keyway_ejections_total": 4, "keyway_health_probes_total": 4}[name]
		if want == 0 {
			want = 1
		}
		if n != want {
			t.Errorf("%s: %d series after forgetting a, want %d", name, n, want)
		}
	}
}

// The snapshot's ejection total is the replica's keyway_ejections_total
// series summed over reasons: every ejection, holds included, not only
// those in the supervision window; a Reset keeps it; it starts again from
// 0 with the series when the replica is forgotten and comes back.
func TestSnapshotEjectionsTotal(t *testing.T) {
	t.Parallel()
	cfg := supervisionConfig()
	cfg.Supervision.MaxEjections = 3
	f := newFixture(t, cfg)
	f.c.SetTargets("s", targets("s", "a", "b"))
	f.ejectCycle(t, "a") // a: ejection 1 (5xx), readmitted
	for range 5 {
		f.c.Observe("s", "a", 0, syscall.ECONNREFUSED, 0)
	}
	f.sweepAfter(time.Second) // a: ejection 2 (connect)
	f.sweepAfter(time.Minute) // readmitted
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second) // a: ejection 3 within the window: a hold

	want := map[string]uint64{"a": 3, "b": 0}
	check := func(when string) {
		t.Helper()
		snap := f.c.Snapshot("s")
		if len(snap) != 2 {
			t.Fatalf("%s: snapshot %+v, want a and b", when, snap)
		}
		for _, h := range snap {
			if h.EjectionsTotal != want[h.Replica] {
				t.Errorf("%s: %s has EjectionsTotal %d, want %d", when, h.Replica, h.EjectionsTotal, want[h.Replica])
			}
			if got := ejectionSeries(t, f, h.Replica); got != float64(h.EjectionsTotal) {
				t.Errorf("%s: %s has EjectionsTotal %d, its keyway_ejections_total series sum to %v", when, h.Replica, h.EjectionsTotal, got)
			}
		}
	}
	check("after a hold")
	if h := f.c.Snapshot("s")[0]; h.FailedUntil.IsZero() || h.Ejections != 3 {
		t.Fatalf("a is not held with 3 ejections in the window: %+v", h)
	}

	f.c.Reset("s", "a")
	if h := f.c.Snapshot("s")[0]; h.Ejections != 0 {
		t.Fatalf("Ejections %d after Reset, want 0 (the window is cleared)", h.Ejections)
	}
	check("after Reset")

	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	want["a"] = 4
	check("after a fourth ejection")

	b, err := json.Marshal(f.c.Snapshot("s")[0])
	if err != nil || !strings.Contains(string(b), `"ejections_total":4`) {
		t.Fatalf("JSON %s (%v), want an ejections_total field", b, err)
	}

	// Forgotten and back: the series start again from 0, and so does the total.
	f.c.SetTargets("s", targets("s", "a", "b")[1:])
	f.c.SetTargets("s", targets("s", "a", "b"))
	want["a"] = 0
	check("after a was forgotten and came back")
}

// ejectionSeries sums the replica's keyway_ejections_total series.
func ejectionSeries(t *testing.T, f *fixture, replica string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "keyway_ejections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "replica" && lp.GetValue() == replica {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
