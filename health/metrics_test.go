package health

import (
	"strings"
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
	// Both trip; b has the longer run of failures, so b is ejected and a,
	// finding no room (1 of 2 may be out), is capped.
	f.fail("s", "a", 5)
	f.fail("s", "b", 6)
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
