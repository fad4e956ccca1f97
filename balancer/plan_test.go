package balancer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/buraksezer/consistent"
)

// consistentOwners is the oracle: the owner of every partition as
// consistent v1.1.0 places them on names.
func consistentOwners(names []string, cfg HashConfig) []string {
	out := make([]string, cfg.Partitions)
	if len(names) == 0 {
		return out // no owners
	}
	members := make([]consistent.Member, len(names))
	for i, n := range names {
		members[i] = member(n)
	}
	c := consistent.New(members, consistent.Config{
		Hasher: xxHasher{}, PartitionCount: cfg.Partitions, ReplicationFactor: cfg.ReplicationFactor,
		Load: cfg.Load, ReplicaKey: consistent.DefaultReplicaKey,
	})
	for p := range out {
		out[p] = c.GetPartitionOwner(p).String()
	}
	return out
}

// checkAgainstOracle checks a plan's moved count and per-replica counts
// against consistent's placement of its current and proposed members.
func checkAgainstOracle(t *testing.T, p Plan) {
	t.Helper()
	before, after := consistentOwners(p.Current, p.Hash), consistentOwners(p.Proposed, p.Hash)
	moved := 0
	now, aft, gained, lost := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	for i := range before {
		now[before[i]]++
		aft[after[i]]++
		if before[i] != after[i] {
			moved++
			gained[after[i]]++
			lost[before[i]]++
		}
	}
	if p.Moved != moved {
		t.Errorf("plan moves %d partitions, consistent moves %d", p.Moved, moved)
	}
	for _, r := range p.Replicas {
		if r.Now != now[r.Name] || r.After != aft[r.Name] || r.Gained != gained[r.Name] || r.Lost != lost[r.Name] {
			t.Errorf("%s: plan %+v, consistent now %d after %d gained %d lost %d", r.Name, r, now[r.Name], aft[r.Name], gained[r.Name], lost[r.Name])
		}
	}
}

func row(t *testing.T, p Plan, name string) PlanReplica {
	t.Helper()
	for _, r := range p.Replicas {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no row for %s in %+v", name, p.Replicas)
	return PlanReplica{}
}

func TestPlanAddOneToThree(t *testing.T) {
	t.Parallel()
	cfg := DefaultHashConfig()
	p, err := PlanChange(cfg, replicaNames(3), []string{"orders-003"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3→4: moves %d of %d partitions (%.1f%%); balance max/mean %.3f → %.3f", p.Moved, cfg.Partitions, 100*p.MovedShare(), p.Now.MaxOverMean(), p.After.MaxOverMean())
	if s := p.MovedShare(); s < 0.2 || s > 0.3 {
		t.Errorf("adding one to 3 moves %.1f%% of the partitions, want about a quarter (20–30%%)", 100*s)
	}
	joiner := row(t, p, "orders-003")
	if joiner.Now != 0 || joiner.Lost != 0 || joiner.Gained != p.Moved || joiner.After != p.Moved {
		t.Errorf("the new member %+v: want now 0, gained = after = moved %d", joiner, p.Moved)
	}
	for _, n := range replicaNames(3) {
		r := row(t, p, n)
		if r.Gained != 0 || r.After != r.Now-r.Lost {
			t.Errorf("%s %+v: a member that stays must only lose partitions (to the new one)", n, r)
		}
	}
	if !slices.Equal(p.Current, replicaNames(3)) || !slices.Equal(p.Proposed, replicaNames(4)) ||
		!slices.Equal(p.Added, []string{"orders-003"}) || len(p.Removed) != 0 {
		t.Errorf("members: %+v", p)
	}
	if p.Now.Members != 3 || p.After.Members != 4 || p.After.Mean != float64(cfg.Partitions)/4 ||
		p.After.Max != joinerMax(p) || p.After.MaxOverMean() < 1 || p.After.MaxOverMean() > cfg.Load+0.01 || p.After.MinOverMean() > 1 {
		t.Errorf("balance: now %+v after %+v", p.Now, p.After)
	}
	if p.Fingerprint != cfg.Fingerprint() {
		t.Errorf("fingerprint %q", p.Fingerprint)
	}
	checkAgainstOracle(t, p)
}

// joinerMax is the most partitions any member owns after the plan.
func joinerMax(p Plan) int {
	m := 0
	for _, r := range p.Replicas {
		m = max(m, r.After)
	}
	return m
}

func TestPlanRemoveOne(t *testing.T) {
	t.Parallel()
	cfg := DefaultHashConfig()
	p, err := PlanChange(cfg, replicaNames(3), nil, []string{"orders-001"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3→2: moves %d of %d partitions (%.1f%%)", p.Moved, cfg.Partitions, 100*p.MovedShare())
	leaver := row(t, p, "orders-001")
	if leaver.After != 0 || leaver.Lost != leaver.Now || leaver.Now != p.Moved || leaver.Gained != 0 {
		t.Errorf("the removed member %+v: want all its %d partitions lost, and only those moved (moved %d)", leaver, leaver.Now, p.Moved)
	}
	for _, n := range []string{"orders-000", "orders-002"} {
		if r := row(t, p, n); r.Lost != 0 || r.After != r.Now+r.Gained {
			t.Errorf("%s %+v: a member that stays must keep its partitions", n, r)
		}
	}
	if !slices.Equal(p.Removed, []string{"orders-001"}) || !slices.Equal(p.Proposed, []string{"orders-000", "orders-002"}) {
		t.Errorf("members: %+v", p)
	}
	checkAgainstOracle(t, p)
}

// A larger change, with collateral moves between members that stay (the
// load bound), still matches the oracle partition by partition.
func TestPlanMatchesConsistent(t *testing.T) {
	t.Parallel()
	cfg := HashConfig{Partitions: 997, ReplicationFactor: 50, Load: 1.25}
	p, err := PlanChange(cfg, replicaNames(10), []string{"orders-010", "orders-011"}, []string{"orders-003", "orders-007", "orders-009"})
	if err != nil {
		t.Fatal(err)
	}
	collateral := 0
	for _, r := range p.Replicas {
		if slices.Contains(p.Current, r.Name) && slices.Contains(p.Proposed, r.Name) {
			collateral += r.Lost
		}
	}
	t.Logf("10→9 (+2 −3): moves %d of %d partitions, %d of them between members that stay", p.Moved, cfg.Partitions, collateral)
	checkAgainstOracle(t, p)

	// From an empty ring every partition moves (RebuildInfo.Moved counts so).
	p, err = PlanChange(cfg, nil, []string{"a", "b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Moved != cfg.Partitions || p.Now != (Balance{}) || p.Now.MaxOverMean() != 0 || p.After.Members != 2 {
		t.Errorf("from an empty ring: %+v", p)
	}
	checkAgainstOracle(t, p)
}

func TestPlanOrderIndependent(t *testing.T) {
	t.Parallel()
	cfg := HashConfig{Partitions: 499, ReplicationFactor: 30, Load: 1.25}
	cur := replicaNames(8)
	add := []string{"new-c", "new-a", "new-b"}
	remove := []string{"orders-005", "orders-001"}
	want, err := PlanChange(cfg, cur, add, remove)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 10 {
		c, a, r := slices.Clone(cur), slices.Clone(add), slices.Clone(remove)
		rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		rng.Shuffle(len(a), func(i, j int) { a[i], a[j] = a[j], a[i] })
		rng.Shuffle(len(r), func(i, j int) { r[i], r[j] = r[j], r[i] })
		c = append(c, c[0]) // a repeated current member counts once
		got, err := PlanChange(cfg, c, a, r)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("shuffle %d (%v +%v -%v): the plan differs:\n got %+v\nwant %+v", i, c, a, r, got, want)
		}
	}
	if !slices.Equal(want.Added, []string{"new-a", "new-b", "new-c"}) || !slices.Equal(want.Removed, []string{"orders-001", "orders-005"}) {
		t.Errorf("added %v removed %v, want sorted", want.Added, want.Removed)
	}
}

func TestPlanErrors(t *testing.T) {
	t.Parallel()
	cur := replicaNames(3)
	many := make([]string, MaxReplicas)
	for i := range many {
		many[i] = fmt.Sprintf("x-%d", i)
	}
	tests := map[string]struct {
		add, remove  []string
		param, value string
		says         string
	}{
		"add on the ring":      {[]string{"orders-001"}, nil, "add", "orders-001", "already a ring member"},
		"remove not on ring":   {nil, []string{"orders-9"}, "remove", "orders-9", "ring members: orders-000, orders-001, orders-002"},
		"empty ring":           {nil, []string{"orders-002", "orders-000", "orders-001"}, "remove", "orders-000,orders-001,orders-002", "empty"},
		"invalid name":         {[]string{"orders 3"}, nil, "add", "orders 3", "not a valid replica name"},
		"empty name":           {[]string{""}, nil, "add", "", "not a valid replica name"},
		"invalid remove name":  {nil, []string{"a\tb"}, "remove", "a\tb", "not a valid replica name"},
		"added twice":          {[]string{"n", "n"}, nil, "add", "n", "given twice"},
		"in both":              {[]string{"n"}, []string{"n"}, "remove", "n", "both add and remove"},
		"over the limit":       {many, nil, "add", "1000 names", "1003 members, more than the limit of 1000"},
		"too many names given": {append(slices.Clone(many), "y"), nil, "add", "1001 names", "more than 1000 names"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := PlanChange(DefaultHashConfig(), cur, tc.add, tc.remove)
			var pe *PlanError
			if !errors.Is(err, ErrBadPlan) || !errors.As(err, &pe) {
				t.Fatalf("err %v, want a *PlanError", err)
			}
			if pe.Param != tc.param || pe.Value != tc.value || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("err %q (param %q value %q), want param %q value %q saying %q", err, pe.Param, pe.Value, tc.param, tc.value, tc.says)
			}
		})
	}
	if _, err := PlanChange(DefaultHashConfig(), cur, nil, []string{}); !errors.Is(err, ErrBadPlan) || !strings.Contains(err.Error(), "no change given") {
		t.Errorf("no change: %v", err)
	}
	if _, err := PlanChange(HashConfig{}, cur, []string{"n"}, nil); !errors.Is(err, ErrBadPlan) || !strings.Contains(err.Error(), "partitions") {
		t.Errorf("a zero hash config: %v", err)
	}
}

// The plan of a Router's table is exactly what the Router does when the
// change reaches it: the moved count of its RebuildInfo and the
// partitions of its members.
func TestTablePlanMatchesRouterRebuild(t *testing.T) {
	t.Parallel()
	rc := &recorder{}
	r := newTestRouter(t, RouterConfig{}, rc)
	reps := readyReplicas(5)
	r.SetReplicas("static", reps)
	steps := []struct{ add, remove []string }{
		{[]string{"orders-005"}, nil},
		{nil, []string{"orders-002"}},
		{[]string{"orders-006", "orders-007"}, []string{"orders-000", "orders-004"}},
	}
	for i, st := range steps {
		tbl := r.Table()
		p, err := tbl.Plan(st.add, st.remove)
		if err != nil {
			t.Fatal(err)
		}
		if p.Set != "orders" || p.Generation != tbl.Generation() {
			t.Fatalf("plan of set %q generation %d, table generation %d", p.Set, p.Generation, tbl.Generation())
		}
		// The same plan from the pure function.
		names := make([]string, tbl.Len())
		for s := range names {
			names[s] = tbl.Replica(s).Name
		}
		if pure, err := PlanChange(DefaultHashConfig(), names, st.add, st.remove); err != nil || !reflect.DeepEqual(pure.Replicas, p.Replicas) || pure.Moved != p.Moved {
			t.Fatalf("PlanChange and Table.Plan differ: %v", err)
		}

		// Apply it.
		var next []Replica
		for _, rep := range reps {
			if !slices.Contains(st.remove, rep.Name) {
				next = append(next, rep)
			}
		}
		for j, n := range st.add {
			next = append(next, Replica{Name: n, Addr: fmt.Sprintf("10.1.%d.%d:8080", i, j+1), State: StateReady})
		}
		reps = next
		r.SetReplicas("static", reps)
		info := rc.last(t)
		if !info.RingBuilt || info.Moved != p.Moved || !slices.Equal(info.Joined, p.Added) || !slices.Equal(info.Left, p.Removed) {
			t.Fatalf("step %d: rebuild %+v, plan moved %d +%v -%v", i, info, p.Moved, p.Added, p.Removed)
		}
		got := map[string]int{}
		for _, m := range r.Table().Members() {
			got[m.Name] = m.Partitions
		}
		for _, pr := range p.Replicas {
			if got[pr.Name] != pr.After {
				t.Errorf("step %d: %s owns %d partitions, the plan said %d", i, pr.Name, got[pr.Name], pr.After)
			}
		}
		t.Logf("step %d (+%v −%v): planned and moved %d partitions (%.1f%%)", i, st.add, st.remove, info.Moved, 100*p.MovedShare())
	}
}
