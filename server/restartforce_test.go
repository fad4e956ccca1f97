package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/admin"
	"keyway/balancer"
	"keyway/health"
	"keyway/internal/poll"
	"keyway/membership"
)

// startFakeAgent joins a gossip member advertising a ready replica of
// orders with meta's supervision flags, at an address nothing serves.
func startFakeAgent(t *testing.T, name string, supervised, known bool, join string) {
	t.Helper()
	g := membership.DefaultConfig()
	g.BindAddr, g.BindPort, g.Profile, g.Join = "127.0.0.1", 0, "fast", []string{join}
	n, err := membership.New(g, membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: name, Addr: "127.0.0.1:1",
		State: balancer.StateReady, Boot: time.Now().UnixNano(), Supervised: supervised, SupervisionKnown: known},
		// No test logger: memberlist's goroutines may log a moment after
		// the member has shut down, when the test has ended.
		membership.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-n.Started():
	case err := <-done:
		t.Fatalf("%s did not start: %v", name, err)
	}
	t.Cleanup(func() { cancel(); <-done })
}

// A restart of a set whose agents cannot restart a replica is refused at
// once, naming the replicas that run without -- CMD (an agent too old to
// say whether it supervises is not named), and nothing is written or
// audited. A repair with nothing failed and everything in rotation is
// refused too; the restart's acknowledgement needs a failed restart.
func TestRestartAndRepairRefusedAtOnce(t *testing.T) {
	p := startGossipProxy(t, "edge-a")
	startFakeAgent(t, "orders-1", true, true, p.GossipAddr())
	startFakeAgent(t, "orders-2", false, true, p.GossipAddr())
	startFakeAgent(t, "orders-3", false, false, p.GossipAddr()) // an older agent
	startFakeAgent(t, "orders-4", false, true, p.GossipAddr())
	poll.Until(t, 10*time.Second, "four gossip replicas of orders on the ring", func() bool {
		n := 0
		for _, m := range p.p.Router("orders").Table().Members() {
			if m.Source == "gossip" && m.Slot >= 0 {
				n++
			}
		}
		return n == 4
	})

	start := time.Now()
	_, err := p.view.StartRestart("orders", admin.RestartOptions{StepTimeout: time.Minute, Force: true}, admin.Actor{Name: "ops"})
	var refused *admin.RefusedError
	if !errors.As(err, &refused) || strings.Join(refused.Replicas, ",") != "orders-2,orders-4" ||
		refused.Reason != "orders-2, orders-4 run without -- CMD: their agents supervise no process, so keyway cannot restart them" ||
		refused.Fix != "restart the replicas yourself, or run the agents with -- CMD" {
		t.Fatalf("restart: %v (%+v), want a refusal naming orders-2 and orders-4", err, refused)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if _, ok := p.view.RestartStatus("orders"); ok {
		t.Fatal("a refused restart left a record")
	}
	if evs := p.audit.Recent(start, []string{"admin_action"}, 0); len(evs) != 0 {
		t.Fatalf("a refused restart was audited: %+v", evs)
	}
	if !p.restarts.claim("orders") {
		t.Fatal("a refused restart kept its claim")
	}
	p.restarts.release("orders")

	poll.Until(t, 10*time.Second, "every replica in rotation", func() bool {
		for _, m := range p.p.Router("orders").Table().Members() {
			if !m.InRotation {
				return false
			}
		}
		return true
	})
	_, err = p.view.Repair("orders")
	if !errors.As(err, &refused) || !strings.Contains(refused.Reason, "nothing to repair: no replica of orders is failed, and all 5 are in rotation") ||
		!strings.Contains(refused.Fix, "keyway restart --set orders") {
		t.Fatalf("repair: %v, want nothing to repair", err)
	}

	if _, err := p.view.AckRestart("orders", admin.Actor{Name: "ops"}); !errors.Is(err, admin.ErrNoRestart) {
		t.Fatalf("ack without a restart: %v", err)
	}
	if _, err := p.view.AckRestart("nope", admin.Actor{Name: "ops"}); !errors.Is(err, admin.ErrUnknownSet) {
		t.Fatalf("ack of an unknown set: %v", err)
	}
}

// A failed restart is marked until the set is Running after the failure
// or an operator acknowledges it; the acknowledgement is kept in the
// record, which stays, and is audited once.
func TestFailedRestartMarkAndAck(t *testing.T) {
	p := startGossipProxy(t, "edge-a")
	failedAt := time.Now()
	if _, err := p.updateRestart(nil, "orders", "ops", func(st *admin.RestartStatus, _ bool) error {
		*st = admin.RestartStatus{Set: "orders", State: "failed", Owner: "edge-a", Replicas: []string{"orders-0"}, StepTimeout: "10s",
			Started: failedAt.Add(-10 * time.Second), Finished: failedAt.Add(time.Millisecond), Error: "orders-0 started: not within 10s",
			Steps: []admin.RestartStep{{Time: failedAt, Replica: "orders-0", Step: "failed", Detail: "started: not within 10s"}}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The static set has been Running since before the failure: marked.
	st, ok := p.view.RestartStatus("orders")
	if !ok || !st.Mark || st.Cleared != "" {
		t.Fatalf("a failed restart: %+v, want it marked", st)
	}
	for name, tc := range map[string]struct {
		phase      health.Phase
		since      time.Time
		acked      bool
		mark       bool
		cleared    string
		state      string
		sinceShown bool
	}{
		"running since before":      {health.PhaseRunning, failedAt.Add(-time.Minute), false, true, "", "failed", false},
		"running since after":       {health.PhaseRunning, failedAt.Add(time.Second), false, false, admin.ClearedRunning, "failed", true},
		"running between":           {health.PhaseRunning, failedAt.Add(time.Microsecond), false, false, admin.ClearedRunning, "failed", true},
		"degraded since after":      {health.PhaseDegraded, failedAt.Add(time.Second), false, true, "", "failed", false},
		"acknowledged":              {health.PhaseDegraded, failedAt.Add(time.Second), true, false, admin.ClearedAcknowledged, "failed", false},
		"interrupted":               {health.PhaseFailed, failedAt, false, true, "", "interrupted", false},
		"done is never marked":      {health.PhaseDegraded, failedAt, false, false, "", "done", false},
		"running is never marked":   {health.PhaseDegraded, failedAt, false, false, "", "running", false},
		"acknowledged, running too": {health.PhaseRunning, failedAt.Add(time.Second), true, false, admin.ClearedAcknowledged, "failed", false},
	} {
		t.Run(name, func(t *testing.T) {
			s := st
			s.State, s.Mark, s.Cleared = tc.state, false, ""
			if tc.acked {
				s.Acknowledged = failedAt.Add(time.Second)
			}
			markRestart(&s, tc.phase, tc.since)
			if s.Mark != tc.mark || s.Cleared != tc.cleared || s.RunningSince.IsZero() == tc.sinceShown {
				t.Fatalf("mark %v cleared %q running since %v; want %v %q", s.Mark, s.Cleared, s.RunningSince, tc.mark, tc.cleared)
			}
		})
	}

	start := time.Now()
	acked, err := p.view.AckRestart("orders", admin.Actor{Name: "alice"})
	if err != nil || acked.Mark || acked.Cleared != admin.ClearedAcknowledged || acked.AcknowledgedBy != "alice" || acked.Acknowledged.IsZero() {
		t.Fatalf("ack: %+v %v", acked, err)
	}
	again, err := p.view.AckRestart("orders", admin.Actor{Name: "bob"})
	if err != nil || again.AcknowledgedBy != "alice" || !again.Acknowledged.Equal(acked.Acknowledged) {
		t.Fatalf("second ack: %+v %v; want the first one kept", again, err)
	}
	st, ok = p.view.RestartStatus("orders")
	if !ok || st.Mark || st.State != "failed" || st.Error != "orders-0 started: not within 10s" || len(st.Steps) != 1 || st.AcknowledgedBy != "alice" {
		t.Fatalf("after the ack: %+v; want the record kept, no mark", st)
	}
	evs := p.audit.Recent(start, []string{"admin_action"}, 0)
	if len(evs) != 1 || evs[0].Fields["action"] != "restart_ack" || evs[0].Fields["by"] != "alice" {
		t.Fatalf("audit: %+v; want one restart_ack by alice", evs)
	}

	// A restart that succeeded, or runs, has nothing to acknowledge. (The
	// claim keeps this proxy from resuming the "running" one.)
	if !p.restarts.claim("orders") {
		t.Fatal("orders' restart already claimed")
	}
	defer p.restarts.release("orders")
	for _, state := range []string{"done", "running"} {
		if _, err := p.updateRestart(nil, "orders", "ops", func(st *admin.RestartStatus, _ bool) error {
			st.State, st.Acknowledged, st.AcknowledgedBy = state, time.Time{}, ""
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		want := admin.ErrNoRestart
		if state == "running" {
			want = admin.ErrRestartRunning
		}
		if _, err := p.view.AckRestart("orders", admin.Actor{Name: "alice"}); !errors.Is(err, want) {
			t.Fatalf("ack of a %s restart: %v, want %v", state, err, want)
		}
	}
}
