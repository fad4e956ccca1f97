package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
)

// TestPlanPredictsTheRebuild takes a plan through the admin API, makes the
// same change by reloading the proxy's static replicas, and compares what
// the proxy then reports — the ring_rebuild audit event's moved
// partitions, joined and left, and every replica's partitions in GET
// /v1/replica_sets/orders — with the plan: they must be exactly equal.
func TestPlanPredictsTheRebuild(t *testing.T) {
	skipShort(t)
	reps := map[string]string{}
	for i := range 6 {
		name := fmt.Sprintf("orders-%d", i)
		reps[name] = stacktest.StartReplica(t, name).Addr
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("plan-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "keyway.yaml")
	var mu sync.Mutex
	yamlOf := func(names []string) string {
		var static strings.Builder
		for _, n := range names {
			fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", n, reps[n])
		}
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token_file: %q}
log: {level: warn}
replica_sets:
  - name: orders
    replicas: %d
    static:
%s`, tokenFile, len(names), static.String())
	}
	current := yamlOf([]string{"orders-0", "orders-1", "orders-2"})
	load := func() (config.Config, error) {
		mu.Lock()
		defer mu.Unlock()
		return config.LoadBytes(file, []byte(current))
	}
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	st := stacktest.StartProxy(t, cfg, stacktest.Opts{File: file, Load: load})
	c := &admin.Client{Addr: st.Admin, Token: "plan-test-token", Timeout: 10 * time.Second}

	for i, step := range []struct {
		add, remove, after []string
	}{
		{add: []string{"orders-3"}, after: []string{"orders-0", "orders-1", "orders-2", "orders-3"}},
		{remove: []string{"orders-1"}, after: []string{"orders-0", "orders-2", "orders-3"}},
		{add: []string{"orders-5", "orders-4"}, remove: []string{"orders-0", "orders-2"}, after: []string{"orders-3", "orders-4", "orders-5"}},
	} {
		plan, _, err := c.Plan("orders", step.add, step.remove)
		if err != nil {
			t.Fatalf("step %d: plan: %v", i, err)
		}
		set, _, err := c.Set("orders")
		if err != nil {
			t.Fatal(err)
		}
		if set.Generation != plan.Generation {
			t.Fatalf("step %d: the plan starts from generation %d, the set is at %d: planning must publish nothing", i, plan.Generation, set.Generation)
		}

		mu.Lock()
		current = yamlOf(step.after)
		mu.Unlock()
		if _, _, err := c.Reload(); err != nil {
			t.Fatalf("step %d: reload: %v", i, err)
		}
		var ev map[string]any
		poll.Until(t, 10*time.Second, fmt.Sprintf("a ring_rebuild event after generation %d", plan.Generation), func() bool {
			var l admin.EventList
			stacktest.GetJSON(t, "http://"+st.Admin+"/v1/events?kind=ring_rebuild&limit=1", &l)
			if len(l.Events) == 0 {
				return false
			}
			ev = l.Events[0].(map[string]any)
			return ev["generation"].(float64) > float64(plan.Generation)
		})
		if got := int(ev["moved_partitions"].(float64)); got != plan.MovedPartitions {
			t.Errorf("step %d: the ring_rebuild event moved %d partitions, the plan said %d", i, got, plan.MovedPartitions)
		}
		if got, want := eventStrings(ev["joined"]), plan.Add; !slices.Equal(got, want) {
			t.Errorf("step %d: joined %v, the plan added %v", i, got, want)
		}
		if got, want := eventStrings(ev["left"]), plan.Remove; !slices.Equal(got, want) {
			t.Errorf("step %d: left %v, the plan removed %v", i, got, want)
		}

		set, _, err = c.Set("orders")
		if err != nil {
			t.Fatal(err)
		}
		owned := map[string]int{}
		for _, r := range set.Replicas {
			owned[r.Name] = r.Partitions
		}
		if set.RingSize != plan.After.Members {
			t.Errorf("step %d: ring size %d, the plan said %d", i, set.RingSize, plan.After.Members)
		}
		for _, r := range plan.Replicas {
			if owned[r.Name] != r.PartitionsAfter {
				t.Errorf("step %d: %s owns %d partitions, the plan said %d", i, r.Name, owned[r.Name], r.PartitionsAfter)
			}
		}
		t.Logf("step %d (+%v −%v): planned and moved %d of %d partitions (%.1f%%); max/mean %.3f",
			i, plan.Add, plan.Remove, plan.MovedPartitions, plan.Partitions, 100*plan.MovedShare, plan.After.MaxOverMean)
	}
}

// eventStrings reads a JSON list of strings (nil when absent).
func eventStrings(v any) []string {
	l, _ := v.([]any)
	out := []string{}
	for _, s := range l {
		out = append(out, s.(string))
	}
	return out
}
