package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"keyway/admin"
	"keyway/internal/stacktest"
)

func TestCLIPlan(t *testing.T) {
	st := stacktest.StartOrders(t)

	out, _, err := keywayCLI(t, "plan", "--admin", st.Admin, "--set", "orders", "--add", "orders-4", "--add", "orders-3", "--remove", "orders-1")
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	t.Logf("keyway plan:\n%s", out)
	js, _, err := keywayCLI(t, "plan", "--admin", st.Admin, "--json", "--set", "orders", "--remove", "orders-1", "--add", "orders-3", "--add", "orders-4")
	if err != nil {
		t.Fatalf("plan --json: %v", err)
	}
	var p admin.ReplicaSetPlan
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, js)
	}
	if p.Set != "orders" || len(p.Replicas) != 5 || p.MovedPartitions == 0 || p.Now.Members != 3 || p.After.Members != 4 {
		t.Fatalf("plan --json: %+v", p)
	}

	// The table has one aligned row per replica, as the JSON says.
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "plan for orders: add orders-3, orders-4; remove orders-1 (ring 3 → 4 members, "+p.Fingerprint) {
		t.Errorf("header: %q", lines[0])
	}
	head := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "REPLICA") {
			head = i
		}
	}
	if head < 0 {
		t.Fatalf("no table:\n%s", out)
	}
	col := strings.Index(lines[head], "CHANGE")
	for i, r := range p.Replicas {
		l := lines[head+1+i]
		now, after := fmt.Sprintf("%d (%.1f%%)", r.PartitionsNow, 100*r.ShareNow), fmt.Sprintf("%d (%.1f%%)", r.PartitionsAfter, 100*r.ShareAfter)
		switch r.Change {
		case admin.PlanJoins:
			now = "-"
		case admin.PlanLeaves:
			after = "-"
		}
		want := regexp.MustCompile(`^` + regexp.QuoteMeta(r.Name) + ` +` + regexp.QuoteMeta(now) + ` +` + regexp.QuoteMeta(after) + ` +`)
		if !want.MatchString(l) || len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("row %d %q: want %s, now %s, after %s, and CHANGE aligned at column %d", i, l, r.Name, now, after, col)
		}
		switch r.Change {
		case admin.PlanJoins:
			if !strings.HasSuffix(l, fmt.Sprintf("+%.1f%% (joins)", 100*r.GainedShare)) {
				t.Errorf("joining row %q", l)
			}
		case admin.PlanLeaves:
			if !strings.HasSuffix(l, fmt.Sprintf("-%.1f%% (leaves)", 100*r.LostShare)) || r.PartitionsAfter != 0 || r.Lost != r.PartitionsNow {
				t.Errorf("leaving row %q (%+v)", l, r)
			}
		}
	}
	summary := fmt.Sprintf("moves %.1f%% of keys (%d of %d partitions); balance max/mean %.2f, min/mean %.2f (now %.2f, %.2f)",
		100*p.MovedShare, p.MovedPartitions, p.Partitions, p.After.MaxOverMean, p.After.MinOverMean, p.Now.MaxOverMean, p.Now.MinOverMean)
	if !strings.Contains(out, "\n"+summary+"\n") || !strings.Contains(out, "note: The plan places partitions on ring members") ||
		!strings.Contains(out, "note: Weights are not used by placement") {
		t.Errorf("want the summary %q and the notes:\n%s", summary, out)
	}

	// The proxy's own refusals name the flag and the value (the API names
	// its query parameter: the CLI's user gave a flag); usage mistakes
	// never reach it.
	for _, c := range []struct {
		args  []string
		has   string
		usage bool
	}{
		{[]string{"--set", "orders", "--add", "orders-0"}, `--add "orders-0": already a ring member`, false},
		{[]string{"--set", "orders", "--remove", "orders-9"}, `--remove "orders-9": not a ring member`, false},
		{[]string{"--set", "orders", "--add", "a b"}, `--add "a b": not a valid replica name`, false},
		{[]string{"--set", "nope", "--add", "x"}, `unknown replica set "nope"`, false},
		{[]string{"--set", "orders"}, "at least one --add NAME or --remove NAME", true},
		{[]string{"--add", "x"}, "missing --set", true},
	} {
		_, _, err := keywayCLI(t, append([]string{"plan", "--admin", st.Admin}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.has) || strings.Contains(err.Error(), "query parameter") || (exitCode(err) == exitConfig) != c.usage {
			t.Errorf("plan %q: %v (exit %d), want an error saying %q", c.args, err, exitCode(err), c.has)
		}
	}
}
