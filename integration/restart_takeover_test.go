package integration

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/slow"
)

// A rolling restart survives the loss of the proxy that started it: the
// proxy is killed (SIGKILL) after the first replica is back, the other
// proxy takes the restart over and completes it, every proxy shows the
// same progress, and every key ends on its owner.
func TestRollingRestartSurvivesItsProxy(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	a := StartProxy(t, "proxy-a", nil, 3)
	var reps []*SupervisedProc
	for i := range 3 {
		reps = append(reps, StartSupervisedReplica(t, fmt.Sprintf("orders-%d", i), []string{a.Gossip}))
	}
	a.WaitRotation(t, 3, 30*time.Second)
	b := StartProxy(t, "proxy-b", []string{a.Gossip}, 3)
	b.WaitRotation(t, 3, 30*time.Second)
	keys := Keys(300)
	c := NewClient()
	before := c.Owners(t, b.Addr, keys, 4)
	fb, _, err := (&admin.Client{Addr: b.Admin}).Fleet()
	if err != nil {
		t.Fatal(err)
	}

	ca := &admin.Client{Addr: a.Admin, Token: "s3cret", Actor: "ops-carol", Timeout: 10 * time.Second}
	st, _, err := ca.Restart("orders", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	owner := st.Owner
	cb := &admin.Client{Addr: b.Admin, Token: "s3cret", Timeout: 10 * time.Second}
	// Every proxy shows the restart; only one runs per set in the fleet.
	poll.Until(t, 30*time.Second, "proxy-b shows orders-0 back", func() bool {
		st, _, err := cb.RestartStatus("orders")
		return err == nil && st.Owner == owner && slices.ContainsFunc(st.Steps, func(s admin.RestartStep) bool { return s.Replica == "orders-0" && s.Step == "ready" })
	})
	if _, _, err := cb.Restart("orders", 0); err == nil {
		t.Fatal("a second restart through the other proxy was accepted while one runs")
	}
	a.Kill(t)
	took := time.Now()
	var final admin.RestartStatus
	poll.Until(t, 90*time.Second, "proxy-b completes the restart", func() bool {
		final, _, err = cb.RestartStatus("orders")
		return err == nil && final.State != "running"
	})
	if final.State != "done" || final.Owner != fb.Self || !slices.ContainsFunc(final.Steps, func(s admin.RestartStep) bool { return s.Step == "takeover" }) {
		t.Fatalf("after the owner's loss: %+v", final)
	}
	t.Logf("restart taken over and completed %s after the owner was killed; steps:", time.Since(took).Round(time.Millisecond))
	for _, s := range final.Steps {
		t.Logf("  %s %-8s %s %s", s.Time.Format("15:04:05.000"), s.Replica, s.Step, s.Detail)
	}
	for _, r := range reps {
		poll.Until(t, 10*time.Second, r.Name+" restarted", func() bool { return len(r.ChildPids()) >= 2 })
	}
	b.WaitRotation(t, 3, 10*time.Second)
	after := c.Owners(t, b.Addr, keys, 4)
	for _, k := range keys {
		if after[k] != before[k] {
			t.Fatalf("key %s: %s before, %s after", k, before[k], after[k])
		}
	}
}
