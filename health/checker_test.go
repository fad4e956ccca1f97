package health

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

func TestNewCheckerErrors(t *testing.T) {
	t.Parallel()
	if _, err := NewChecker(DefaultConfig(), nil, Options{}); err == nil {
		t.Error("nil sink accepted")
	}
	cfg := DefaultConfig()
	cfg.Active.Rise = 0
	if _, err := NewChecker(cfg, newRecSink(t), Options{}); err == nil || !strings.Contains(err.Error(), "active.rise: ") {
		t.Errorf("bad config: %v", err)
	}
	f := newFixture(t, DefaultConfig())
	if _, err := NewChecker(DefaultConfig(), f.sink, Options{Registerer: f.reg}); err == nil {
		t.Error("second registration accepted")
	}
}

// Removing an ejected replica clears its exclusion from Run's side (here:
// the next decision), never inside SetTargets; its metric series go at
// once.
func TestSetTargetsForgetsFromRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t, passiveConfig())
	var inside atomic.Bool
	f.sink.inside = inside.Load
	set := func(ts []Target) {
		inside.Store(true)
		defer inside.Store(false)
		f.c.SetTargets("s", ts)
	}
	set(targets("s", "a", "b", "c"))
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonEjected, true})

	set(targets("s", "a", "b", "c")[1:])
	callsEqual(t, f.sink.take()) // nothing from SetTargets itself
	if n := testutil.CollectAndCount(f.c.metrics.ejections); n != 2*4 {
		t.Fatalf("%d ejection series after forgetting a, want 8", n)
	}
	f.c.forgetGone() // what Run's loop does on the kick
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonEjected, false})
	if len(f.ev.take()) != 1 {
		t.Fatal("forgetting emitted an event")
	}
	// Observe no longer counts a; b and c are untouched.
	f.fail("s", "a", 10)
	if snap := f.c.Snapshot("s"); len(snap) != 2 || snap[0].Replica != "b" {
		t.Fatalf("snapshot %+v", snap)
	}
}

// A replica removed and added again before Run gets to it starts clean:
// the old self's exclusions are cleared before the new self can be
// excluded, within the same decision.
func TestSetTargetsRemoveAndReAdd(t *testing.T) {
	t.Parallel()
	f := newFixture(t, passiveConfig())
	f.c.SetTargets("s", targets("s", "a", "b"))
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	f.sink.take()
	f.c.SetTargets("s", targets("s", "a", "b")[1:])
	f.c.SetTargets("s", targets("s", "a", "b"))
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take(),
		call{"s", "a", balancer.ReasonEjected, false},
		call{"s", "a", balancer.ReasonEjected, true})
	if f.sink.reasons("s", "a") != balancer.ReasonEjected {
		t.Fatalf("a: %s", f.sink.reasons("s", "a"))
	}
}

// SetTargets with the same list is a no-op without allocation; a changed
// address is taken.
func TestSetTargetsSame(t *testing.T) {
	f := newFixture(t, passiveConfig())
	ts := targets("s", "a", "b", "c")
	f.c.SetTargets("s", ts)
	before := f.c.obs.Load()
	if n := testing.AllocsPerRun(100, func() { f.c.SetTargets("s", ts) }); n != 0 {
		t.Fatalf("SetTargets with the same list: %v allocs", n)
	}
	if f.c.obs.Load() != before {
		t.Fatal("same list republished the index")
	}
	ts[1].Addr = "10.9.9.9:1"
	f.c.SetTargets("s", ts)
	if snap := f.c.Snapshot("s"); snap[1].Addr != "10.9.9.9:1" {
		t.Fatalf("address not updated: %+v", snap[1])
	}
	// Duplicates and empty names: a listed twice does not stand for c.
	f.c.SetTargets("s", []Target{ts[0], ts[0], ts[1], {Replica: ""}})
	if snap := f.c.Snapshot("s"); len(snap) != 2 {
		t.Fatalf("snapshot %+v", snap)
	}
	if f.c.Snapshot("nope") != nil {
		t.Fatal("snapshot of an unknown set")
	}
}

// The proxy's wiring, with a real Router: SetTargets is called from the
// Router's Rebuilt hook under the Router's lock, and the Sink calls
// SetExcluded on the same Router. A Sink call from inside SetTargets would
// deadlock here. A forgotten replica comes back without the exclusion.
func TestWithRouter(t *testing.T) {
	t.Parallel()
	var c *Checker
	var router *balancer.Router[struct{}]
	ringBuilds := 0
	hooks := balancer.Hooks[struct{}]{Rebuilt: func(info balancer.RebuildInfo) {
		if info.RingBuilt {
			ringBuilds++
		}
		tb := router.Table()
		ts := make([]Target, tb.Len())
		for i := range ts {
			ts[i] = Target{Set: info.Set, Replica: tb.Replica(i).Name, Addr: tb.Replica(i).Addr}
		}
		c.SetTargets(info.Set, ts)
	}}
	var err error
	router, err = balancer.NewRouter(balancer.RouterConfig{Set: "s", Hash: balancer.DefaultHashConfig()}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	c, err = NewChecker(passiveConfig(), sinkFunc(func(set, replica string, reason balancer.Reason, excluded bool) {
		router.SetExcluded(replica, reason, excluded)
	}), Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	rep := func(names ...string) []balancer.Replica {
		var rs []balancer.Replica
		for _, n := range names {
			rs = append(rs, balancer.Replica{Name: n, Addr: n + ":80", State: balancer.StateReady})
		}
		return rs
	}
	member := func(name string) (balancer.Member, bool) {
		for _, m := range router.Table().Members() {
			if m.Name == name {
				return m, true
			}
		}
		return balancer.Member{}, false
	}

	router.SetReplicas("static", rep("a", "b", "c"))
	for range 5 {
		c.Observe("s", "a", 500, nil, 0)
	}
	c.sweep(clk.Add(time.Second))
	if m, _ := member("a"); m.InRotation || m.Excluded != balancer.ReasonEjected {
		t.Fatalf("a not ejected: %+v", m)
	}
	c.sweep(clk.Add(10 * time.Second)) // readmitted
	if m, _ := member("a"); !m.InRotation {
		t.Fatalf("a not readmitted: %+v", m)
	}
	if ringBuilds != 1 {
		t.Fatalf("%d ring builds: an ejection or readmission rebuilt the ring", ringBuilds)
	}
	for range 5 {
		c.Observe("s", "a", 500, nil, 0)
	}
	c.sweep(clk.Add(time.Second))               // ejected again
	router.SetReplicas("static", rep("b", "c")) // a leaves the ring
	if _, ok := member("a"); ok {
		t.Fatal("a still a member")
	}
	c.sweep(clk.Add(time.Second)) // forgets a: clears its exclusion
	router.SetReplicas("static", rep("a", "b", "c"))
	if m, _ := member("a"); !m.InRotation || m.Excluded != 0 {
		t.Fatalf("a came back excluded: %+v", m)
	}
	if ringBuilds != 3 {
		t.Fatalf("%d ring builds, want 3 (a, b, c joined; a left; a joined)", ringBuilds)
	}
}

type sinkFunc func(set, replica string, reason balancer.Reason, excluded bool)

func (f sinkFunc) SetExcluded(set, replica string, reason balancer.Reason, excluded bool) {
	f(set, replica, reason, excluded)
}

// RemoveSet forgets a set that left the configuration: no series of it
// remains, and a later set of the same name starts clean.
func TestRemoveSet(t *testing.T) {
	t.Parallel()
	f := newFixture(t, passiveConfig())
	f.c.SetTargets("s", targets("s", "a", "b"))
	f.c.SetTargets("keep", targets("keep", "k"))
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	f.c.RemoveSet("s")
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "set" && l.GetValue() == "s" {
					t.Errorf("%s still has a series of the removed set: %v", mf.GetName(), m.GetLabel())
				}
				if l.GetName() == "set" && l.GetValue() == "keep" {
					kept++
				}
			}
		}
	}
	if kept == 0 {
		t.Fatal("the other set's series went too")
	}
	if snap := f.c.Snapshot("s"); len(snap) != 0 {
		t.Fatalf("snapshot of the removed set: %+v", snap)
	}
	f.c.SetTargets("s", targets("s", "a"))
	if snap := f.c.Snapshot("s"); len(snap) != 1 || snap[0].Ejections != 0 {
		t.Fatalf("the set added again does not start clean: %+v", snap)
	}
}
