package admin

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"keyway/balancer"
)

// fakePlanner plans on a fixed ring of "orders" with balancer.PlanChange
// (the validation is the real one) and records what it was asked.
type fakePlanner struct {
	mu          sync.Mutex
	add, remove []string
}

func (f *fakePlanner) Plan(set string, add, remove []string) (ReplicaSetPlan, error) {
	f.mu.Lock()
	f.add, f.remove = add, remove
	f.mu.Unlock()
	if set != "orders" {
		return ReplicaSetPlan{}, fmt.Errorf("%w %q", ErrUnknownSet, set)
	}
	p, err := balancer.PlanChange(balancer.DefaultHashConfig(), []string{"orders-0", "orders-1"}, add, remove)
	if err != nil {
		return ReplicaSetPlan{}, err
	}
	out := ReplicaSetPlan{Set: set, Partitions: p.Hash.Partitions, Add: p.Added, Remove: p.Removed, MovedPartitions: p.Moved, MovedShare: p.MovedShare()}
	for _, r := range p.Replicas {
		out.Replicas = append(out.Replicas, PlanReplica{Name: r.Name, PartitionsNow: r.Now, PartitionsAfter: r.After})
	}
	return out, nil
}

func (f *fakePlanner) asked() ([]string, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.add, f.remove
}

func TestAPIPlan(t *testing.T) {
	v, pl := testView(), &fakePlanner{}
	base := startAPI(t, Options{Sets: v, Planner: pl})

	code, body := call(t, "GET", base+"/v1/replica_sets/orders/plan?add=orders-3&remove=orders-0&add=orders-2")
	reps, _ := body["replicas"].([]any)
	if code != 200 || body["set"] != "orders" || len(reps) != 4 || body["moved_partitions"].(float64) <= 0 {
		t.Fatalf("plan: %d %v", code, body)
	}
	if add, remove := pl.asked(); !slices.Equal(add, []string{"orders-3", "orders-2"}) || !slices.Equal(remove, []string{"orders-0"}) {
		t.Fatalf("the planner was asked +%q −%q, want every repeated parameter in order", add, remove)
	}
	if a, _ := body["add"].([]any); len(a) != 2 || a[0] != "orders-2" {
		t.Fatalf("add in the answer: %v", body["add"])
	}
	// Lists are [] when empty, never null.
	code, body = call(t, "GET", base+"/v1/replica_sets/orders/plan?remove=orders-1")
	if l, ok := body["add"].([]any); code != 200 || !ok || len(l) != 0 {
		t.Fatalf("remove only: add must be []: %d %v", code, body)
	}

	for _, c := range []struct{ q, has string }{
		{"", "missing query parameter add or remove"},
		{"?add=", `query parameter add "": not a valid replica name`},
		{"?add=orders%203", `query parameter add "orders 3": not a valid replica name`},
		{"?add=orders-1", `query parameter add "orders-1": already a ring member`},
		{"?remove=orders-7", `query parameter remove "orders-7": not a ring member of the set: remove only ring members (ring members: orders-0, orders-1)`},
		{"?remove=orders-0&remove=orders-1", `query parameter remove "orders-0,orders-1": would leave the ring empty`},
		{"?add=x&remove=x", `query parameter remove "x": given to both add and remove`},
		{"?add=x&rmove=orders-0", "unknown query parameter rmove"},
		{"?" + strings.Repeat("add=n&", balancer.MaxReplicas+1), fmt.Sprintf(`query parameter add "%d names": more than %d names`, balancer.MaxReplicas+1, balancer.MaxReplicas)},
	} {
		code, body := call(t, "GET", base+"/v1/replica_sets/orders/plan"+c.q)
		if msg, _ := body["error"].(string); code != 400 || !strings.Contains(msg, c.has) {
			t.Errorf("plan%s: %d %v, want 400 saying %q", c.q, code, body, c.has)
		}
	}
	// A refused name also comes apart: a client names its own flag for it.
	code, body = call(t, "GET", base+"/v1/replica_sets/orders/plan?add=orders-1")
	if code != 400 || body["param"] != "add" || body["value"] != "orders-1" || !strings.HasPrefix(body["problem"].(string), "already a ring member") {
		t.Errorf("plan?add=orders-1: %d %v, want param, value and problem", code, body)
	}
	code, body = call(t, "GET", base+"/v1/replica_sets/nope/plan?add=a")
	if msg, _ := body["error"].(string); code != 404 || !strings.Contains(msg, `"nope"`) || !strings.Contains(msg, "orders, billing") {
		t.Errorf("unknown set: %d %v", code, body)
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		if code, body := call(t, m, base+"/v1/replica_sets/orders/plan?add=a"); code != 405 || !strings.Contains(body["error"].(string), "use GET") {
			t.Errorf("%s: %d %v, want a JSON 405", m, code, body)
		}
	}
	if code, body := call(t, "GET", startAPI(t, Options{})+"/v1/replica_sets/orders/plan?add=a"); code != 501 {
		t.Errorf("without a planner: %d %v, want 501", code, body)
	}
}
