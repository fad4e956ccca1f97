package agent_test

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/internal/poll"
	"keyway/membership"
)

// A retire command drains the replica as a shutdown does, stops its
// process and advertises stopped with Remove, and the agent stays in the
// cluster: no probe, set start or repeated command brings the replica
// back. Stopping the agent then only leaves.
func TestRetire(t *testing.T) {
	p := startSetProxy(t)
	rep := startReplica(t, "ok")
	cs := &children{exitOnTerm: true}
	a := startSupervising(t, superviseConfig(rep.addr, p.GossipAddr()), cs)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))

	retire := func(replica string, boot int64) {
		t.Helper()
		cmd := membership.Retire{Set: "orders", Replica: replica, Boot: boot, By: p.Name()}
		if err := p.Send(a.Name(), cmd.Encode()); err != nil {
			t.Fatal(err)
		}
		_ = p.Members()
	}
	// For another replica, or another incarnation: ignored.
	retire("orders-9", 0)
	retire(a.Meta().Replica, a.Meta().Boot+1)
	p.inflight.Store(2)
	retire(a.Meta().Replica, a.Meta().Boot)
	poll.Until(t, 10*time.Second, "the proxy to see the agent draining", p.sees(a.Name(), balancer.StateDraining, false))
	if !a.Retired() {
		t.Fatal("Retired() false after the command")
	}
	if n := a.logged("retire command: the replica leaves its set for good"); n != 1 {
		t.Fatalf("%d retire log lines, want 1 (the ones for another replica and incarnation are ignored)", n)
	}
	poll.Until(t, 10*time.Second, "5 accepted reports", func() bool {
		return metric(t, a.reg, "keyway_agent_drain_reports_total", "result", "accepted") >= 5
	})
	if s := a.State(); s != balancer.StateDraining || len(cs.last().signals()) != 0 {
		t.Fatalf("while the proxy has 2 in flight: state %s, signals %v; want draining and none", s, cs.last().signals())
	}
	retire(a.Meta().Replica, a.Meta().Boot) // repeated, as proxies do

	p.inflight.Store(0)
	poll.Until(t, 10*time.Second, "the proxy to see the agent stopped with remove", func() bool {
		m, ok := p.member(a.Name())
		return ok && m.Status == membership.StatusAlive && m.Meta.State == balancer.StateStopped && m.Meta.Remove
	})
	if s := cs.last().signals(); !slices.Equal(s, []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("signals to the process: %v, want [SIGTERM]", s)
	}
	probes := rep.requests.Load()
	poll.Until(t, 10*time.Second, "probes to go on", func() bool { return rep.requests.Load() >= probes+3 })
	// A set stop, then a start: a retired replica follows neither.
	p.send(t, a.Name(), true, 5)
	poll.Until(t, 10*time.Second, "the set stop to be taken", func() bool { return a.logged("set command") == 1 })
	p.send(t, a.Name(), false, 6)
	poll.Until(t, 10*time.Second, "the set start to be taken", func() bool { return a.logged("set command") == 2 })
	if s := a.State(); s != balancer.StateStopped || cs.count() != 1 || !a.running() {
		t.Fatalf("retired, with passing probes, a set stop and a start: state %s, %d starts, running %v; want stopped, 1, true", s, cs.count(), a.running())
	}
	if v := testutilValue(t, a.reg, "keyway_agent_retires_total"); v != 1 {
		t.Fatalf("keyway_agent_retires_total = %v, want 1", v)
	}
	if code, _ := get(t, a.base+"/readyz"); code != 503 {
		t.Fatalf("/readyz of a retired replica: %d, want 503", code)
	}
	if err := a.stop(t, 10*time.Second); err != nil {
		t.Fatalf("agent stop: %v", err)
	}
	wantTransitions(t, a, "starting>ready", "ready>draining", "draining>stopped")
}
