package proxy

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"keyway/balancer"
)

// ringRecorder keeps the RebuildInfo of every ring rebuild.
type ringRecorder struct {
	mu    sync.Mutex
	rings []balancer.RebuildInfo
}

func (r *ringRecorder) TableChanged(_ string, _ int, _ []balancer.Member, info balancer.RebuildInfo) {
	if !info.RingBuilt {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rings = append(r.rings, info)
}

func (r *ringRecorder) last(t *testing.T) (balancer.RebuildInfo, int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rings) == 0 {
		t.Fatal("no ring rebuild seen")
	}
	return r.rings[len(r.rings)-1], len(r.rings)
}

// A plan's moved partitions and per-replica counts are exactly what the
// set's Router reports when a reload makes the same change to its static
// replicas.
func TestPlanMatchesReload(t *testing.T) {
	reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2"), startReplica(t, "r3"), startReplica(t, "r4")}
	rec := &ringRecorder{}
	p, _ := startProxyOpts(t, Options{Tables: []TableObserver{rec}}, nil, reps[:3]...)

	steps := []struct {
		add, remove []string
		after       []*testReplica
	}{
		{add: []string{"r3"}, after: reps[:4]},
		{remove: []string{"r1"}, after: []*testReplica{reps[0], reps[2], reps[3]}},
		{add: []string{"r4", "r1"}, remove: []string{"r0"}, after: []*testReplica{reps[1], reps[2], reps[3], reps[4]}},
	}
	for i, st := range steps {
		gen := p.Router("orders").Table().Generation()
		plan, err := p.Plan("orders", st.add, st.remove)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		_, before := rec.last(t)
		if g := p.Router("orders").Table().Generation(); g != gen || plan.Generation != gen {
			t.Fatalf("step %d: planning published a table (generation %d → %d) or planned from another (%d)", i, gen, g, plan.Generation)
		}

		mustReload(t, p, testConfig(st.after...))
		info, n := rec.last(t)
		if n != before+1 {
			t.Fatalf("step %d: %d ring rebuilds after the reload, want 1", i, n-before)
		}
		if info.Moved != plan.Moved || !slices.Equal(info.Joined, plan.Added) || !slices.Equal(info.Left, plan.Removed) {
			t.Fatalf("step %d: the Router moved %d partitions (+%v −%v), the plan said %d (+%v −%v)",
				i, info.Moved, info.Joined, info.Left, plan.Moved, plan.Added, plan.Removed)
		}
		owned := map[string]int{}
		for _, m := range p.Router("orders").Table().Members() {
			owned[m.Name] = m.Partitions
		}
		for _, r := range plan.Replicas {
			if owned[r.Name] != r.After {
				t.Errorf("step %d: %s owns %d partitions, the plan said %d", i, r.Name, owned[r.Name], r.After)
			}
		}
		t.Logf("step %d (+%v −%v): planned and moved %d of %d partitions (%.1f%%)", i, st.add, st.remove, info.Moved, plan.Hash.Partitions, 100*plan.MovedShare())
	}
}

func TestPlanErrors(t *testing.T) {
	p, _ := startProxy(t, nil, startReplica(t, "r0"), startReplica(t, "r1"))
	if _, err := p.Plan("nope", []string{"r2"}, nil); !errors.Is(err, ErrUnknownSet) {
		t.Errorf("unknown set: %v", err)
	}
	var pe *balancer.PlanError
	if _, err := p.Plan("orders", []string{"r1"}, nil); !errors.As(err, &pe) || pe.Param != "add" || pe.Value != "r1" {
		t.Errorf("adding a ring member: %v", err)
	}
	if _, err := p.Plan("orders", nil, []string{"r0", "r1"}); !errors.As(err, &pe) || pe.Param != "remove" {
		t.Errorf("emptying the ring: %v", err)
	}
}
