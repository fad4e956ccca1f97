package health

import (
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

func member(name string, st balancer.State, slot int, inRot bool) balancer.Member {
	return balancer.Member{Replica: balancer.Replica{Name: name, State: st}, Slot: slot, InRotation: inRot}
}

// A scripted life of a set of two: every phase change is reported once,
// in order, and the gauge follows.
func TestPhaseTrackerScript(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	var got []string
	tr, err := NewPhaseTracker(reg, func(c PhaseChange) { got = append(got, string(c.From)+"→"+string(c.To)) })
	if err != nil {
		t.Fatal(err)
	}
	steps := [][]balancer.Member{
		nil, // declared, nothing seen
		{member("a", balancer.StateStarting, -1, false)},
		{member("a", balancer.StateStarting, -1, false), member("b", balancer.StateStarting, -1, false)}, // no change
		{member("a", balancer.StateReady, 0, true), member("b", balancer.StateReady, 1, true)},
		{member("a", balancer.StateReady, 0, true), member("b", balancer.StateRecovering, 1, false)},
		{member("a", balancer.StateReady, 0, true), member("b", balancer.StateReady, 1, true)},
		{member("a", balancer.StateStopped, 0, false), member("b", balancer.StateStopped, 1, false)},
		nil, // forgotten: still Stopped, no change
	}
	for _, ms := range steps {
		tr.TableChanged("orders", 2, ms, balancer.RebuildInfo{})
	}
	want := []string{"→Created", "Created→Scheduling", "Scheduling→Running", "Running→Degraded", "Degraded→Running", "Running→Stopped"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("changes\n got %v\nwant %v", got, want)
	}
	if tr.Phase("orders") != PhaseStopped {
		t.Fatalf("phase %q", tr.Phase("orders"))
	}
	if v := testutil.ToFloat64(tr.gauge.WithLabelValues("orders", "Stopped")); v != 1 {
		t.Fatalf("Stopped gauge %v", v)
	}
	if v := testutil.ToFloat64(tr.gauge.WithLabelValues("orders", "Running")); v != 0 {
		t.Fatalf("Running gauge %v", v)
	}
}
