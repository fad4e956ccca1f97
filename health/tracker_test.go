package health

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"

	"keyway/internal/metricstest"
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

// The per-replica series follow the tables: each listed replica has its
// rotation and its state; one that is no longer listed loses its series,
// and RemoveSet deletes every series of the set, phase included.
func TestPhaseTrackerReplicaSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tr, err := NewPhaseTracker(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	const names = "keyway_replica_set_phase keyway_replica_in_rotation keyway_replica_state"
	compare := func(step, want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), strings.Fields(names)...); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	const help = `
# HELP keyway_replica_in_rotation Whether a replica may receive new requests from this proxy now: 1 in rotation, 0 held out (not ready, dead in gossip, failing probes, ejected, drained or held as failed).
# TYPE keyway_replica_in_rotation gauge
`
	const stateHelp = `
# HELP keyway_replica_state Lifecycle state a replica advertises (static replicas are ready): 1 for the current state (starting, ready, draining, recovering, stopped, failed), 0 for the others.
# TYPE keyway_replica_state gauge
`
	const phaseHelp = `
# HELP keyway_replica_set_phase Phase of each replica set: 1 for the current phase (Created, Scheduling, Running, Degraded, Failed, Stopped), 0 for the others.
# TYPE keyway_replica_set_phase gauge
`
	phase := func(set, cur string) string {
		var b strings.Builder
		for _, p := range []string{"Created", "Degraded", "Failed", "Running", "Scheduling", "Stopped"} {
			v := 0
			if p == cur {
				v = 1
			}
			fmt.Fprintf(&b, "keyway_replica_set_phase{phase=%q,set=%q} %d\n", p, set, v)
		}
		return b.String()
	}
	states := func(set, replica, cur string) string {
		var b strings.Builder
		for _, s := range []string{"draining", "failed", "ready", "recovering", "starting", "stopped"} {
			v := 0
			if s == cur {
				v = 1
			}
			fmt.Fprintf(&b, "keyway_replica_state{replica=%q,set=%q,state=%q} %d\n", replica, set, s, v)
		}
		return b.String()
	}

	tr.TableChanged("orders", 3, []balancer.Member{
		member("orders-0", balancer.StateReady, 0, true),
		member("orders-1", balancer.StateDraining, 1, false),
		member("orders-2", balancer.StateStarting, -1, false),
	}, balancer.RebuildInfo{})
	tr.TableChanged("users", 1, []balancer.Member{member("users-0", balancer.StateReady, 0, true)}, balancer.RebuildInfo{})
	compare("three and one", help+`
keyway_replica_in_rotation{replica="orders-0",set="orders"} 1
keyway_replica_in_rotation{replica="orders-1",set="orders"} 0
keyway_replica_in_rotation{replica="orders-2",set="orders"} 0
keyway_replica_in_rotation{replica="users-0",set="users"} 1
`+phaseHelp+phase("orders", "Degraded")+phase("users", "Running")+stateHelp+
		states("orders", "orders-0", "ready")+states("orders", "orders-1", "draining")+
		states("orders", "orders-2", "starting")+states("users", "users-0", "ready"))

	// orders-1 is forgotten, orders-2 becomes ready and enters rotation,
	// orders-0 is ejected (still ready, out of rotation).
	tr.TableChanged("orders", 3, []balancer.Member{
		member("orders-0", balancer.StateReady, 0, false),
		member("orders-2", balancer.StateReady, 1, true),
	}, balancer.RebuildInfo{})
	compare("orders-1 forgotten", help+`
keyway_replica_in_rotation{replica="orders-0",set="orders"} 0
keyway_replica_in_rotation{replica="orders-2",set="orders"} 1
keyway_replica_in_rotation{replica="users-0",set="users"} 1
`+phaseHelp+phase("orders", "Degraded")+phase("users", "Running")+stateHelp+
		states("orders", "orders-0", "ready")+states("orders", "orders-2", "ready")+states("users", "users-0", "ready"))

	// The set is removed from the configuration: all of it goes.
	tr.RemoveSet("orders")
	compare("orders removed", help+`
keyway_replica_in_rotation{replica="users-0",set="users"} 1
`+phaseHelp+phase("users", "Running")+stateHelp+states("users", "users-0", "ready"))
	if p := tr.Phase("orders"); p != "" {
		t.Fatalf("phase of a removed set: %q", p)
	}
	// Configured again later, it starts afresh.
	var changes []PhaseChange
	tr.onChange = func(c PhaseChange) { changes = append(changes, c) }
	tr.TableChanged("orders", 1, nil, balancer.RebuildInfo{})
	if len(changes) != 1 || changes[0].From != "" || changes[0].To != PhaseCreated {
		t.Fatalf("changes after re-adding: %+v", changes)
	}

	metricstest.Lint(t, reg)
}

// Tables of different sets come from different Routers at once; with
// RemoveSet racing them, the tracker stays consistent (run with -race).
func TestPhaseTrackerConcurrentSets(t *testing.T) {
	reg := prometheus.NewRegistry()
	tr, err := NewPhaseTracker(reg, func(PhaseChange) {})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		set := fmt.Sprintf("s%d", i)
		wg.Go(func() {
			for j := range 200 {
				ms := []balancer.Member{member(set+"-a", balancer.StateReady, 0, j%2 == 0)}
				if j%3 == 0 {
					ms = append(ms, member(set+"-b", balancer.StateRecovering, 1, false))
				}
				tr.TableChanged(set, 2, ms, balancer.RebuildInfo{})
				_ = tr.Phase(set)
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			tr.RemoveSet("s0")
		}
	})
	wg.Wait()
	tr.RemoveSet("s0")
	if n := testutil.CollectAndCount(tr.inRot); n != 3 {
		t.Fatalf("%d rotation series after the run, want s1..s3's a", n)
	}
	// j=199: b not listed (199%3 != 0), so each set kept only its a.
	if n := testutil.CollectAndCount(tr.state); n != 3*len(replicaStates) {
		t.Fatalf("%d state series, want %d", n, 3*len(replicaStates))
	}
}

// An operator stop makes the set Stopped at once, whatever its replicas
// do (static ones stay in rotation), and a start hands the phase back to
// the tables.
func TestPhaseTrackerSetStopped(t *testing.T) {
	var got []string
	tr, err := NewPhaseTracker(nil, func(c PhaseChange) {
		got = append(got, fmt.Sprintf("%s→%s stopped=%v", c.From, c.To, c.Stopped))
	})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetStopped("orders", false) // before any table: the table decides
	if len(got) != 0 {
		t.Fatalf("a start before the first table reported %v", got)
	}
	running := []balancer.Member{member("a", balancer.StateReady, 0, true), member("b", balancer.StateReady, 1, true)}
	tr.TableChanged("orders", 2, running, balancer.RebuildInfo{})
	tr.SetStopped("orders", true)
	tr.TableChanged("orders", 2, running, balancer.RebuildInfo{}) // still in rotation: still Stopped
	tr.SetStopped("orders", true)                                 // again: nothing
	tr.SetStopped("orders", false)
	want := []string{"→Running stopped=false", "Running→Stopped stopped=true", "Stopped→Running stopped=false"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("changes\n got %v\nwant %v", got, want)
	}
	// A set stopped before its first table starts Stopped.
	tr.SetStopped("users", true)
	if p := tr.Phase("users"); p != PhaseStopped {
		t.Fatalf("users %q", p)
	}
}

// Since follows each replica's state and rotation separately: a change of
// one keeps the other's time; a replica that leaves the tables and comes
// back starts again; an unknown set has none.
func TestPhaseTrackerSince(t *testing.T) {
	tr, err := NewPhaseTracker(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	now := t0
	tr.now = func() time.Time { return now }
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	step := func(d time.Duration, ms ...balancer.Member) {
		now = at(d)
		tr.TableChanged("orders", 2, ms, balancer.RebuildInfo{})
	}
	check := func(name string, want ReplicaSince) {
		t.Helper()
		if got := tr.Since("orders")[name]; got != want {
			t.Errorf("%s at %v: %+v, want %+v", name, now.Sub(t0), got, want)
		}
	}
	step(0, member("a", balancer.StateStarting, -1, false))
	check("a", ReplicaSince{balancer.StateStarting, at(0), false, at(0)})
	step(time.Second, member("a", balancer.StateReady, 0, true), member("b", balancer.StateStarting, -1, false))
	check("a", ReplicaSince{balancer.StateReady, at(time.Second), true, at(time.Second)})
	check("b", ReplicaSince{balancer.StateStarting, at(time.Second), false, at(time.Second)})
	// An ejection: out of rotation, still ready since 1 s.
	step(5*time.Second, member("a", balancer.StateReady, 0, false), member("b", balancer.StateReady, 1, true))
	check("a", ReplicaSince{balancer.StateReady, at(time.Second), false, at(5 * time.Second)})
	check("b", ReplicaSince{balancer.StateReady, at(5 * time.Second), true, at(5 * time.Second)})
	// A table that changes nothing for a replica keeps its times.
	step(7*time.Second, member("a", balancer.StateReady, 0, false), member("b", balancer.StateReady, 1, true))
	check("a", ReplicaSince{balancer.StateReady, at(time.Second), false, at(5 * time.Second)})
	// A drain: state and rotation change together.
	step(9*time.Second, member("a", balancer.StateReady, 0, true), member("b", balancer.StateDraining, 1, false))
	check("a", ReplicaSince{balancer.StateReady, at(time.Second), true, at(9 * time.Second)})
	check("b", ReplicaSince{balancer.StateDraining, at(9 * time.Second), false, at(9 * time.Second)})
	// b forgotten, then back.
	step(10*time.Second, member("a", balancer.StateReady, 0, true))
	if _, ok := tr.Since("orders")["b"]; ok {
		t.Error("b has a since after it left the tables")
	}
	step(12*time.Second, member("a", balancer.StateReady, 0, true), member("b", balancer.StateDraining, 1, false))
	check("b", ReplicaSince{balancer.StateDraining, at(12 * time.Second), false, at(12 * time.Second)})
	if got := tr.Since("nope"); got != nil {
		t.Errorf("unknown set: %v", got)
	}
	// The set's phase: Degraded since 1 s (one of two replicas in
	// rotation at every step since), then Running.
	if p, since := tr.PhaseSince("orders"); p != PhaseDegraded || !since.Equal(at(time.Second)) {
		t.Errorf("PhaseSince = %s since %v, want Degraded since 1s", p, since.Sub(t0))
	}
	step(13*time.Second, member("a", balancer.StateReady, 0, true), member("b", balancer.StateReady, 1, true))
	if p, since := tr.PhaseSince("orders"); p != PhaseRunning || !since.Equal(at(13*time.Second)) {
		t.Errorf("PhaseSince = %s since %v, want Running since 13s", p, since.Sub(t0))
	}
	if p, since := tr.PhaseSince("nope"); p != "" || !since.IsZero() {
		t.Errorf("unknown set: %s since %v", p, since)
	}
}
