package server

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/admin"
	"keyway/balancer"
	"keyway/eventlog"
	"keyway/membership"
	"keyway/runner"
)

// A job's process facts follow the agent's order (seq), not the order the
// reports arrived in: a restart's start that overtook its exit leaves the
// new PID, not none.
func TestProcessFactsInAgentOrder(t *testing.T) {
	l, err := eventlog.New(eventlog.DefaultConfig(), "proxy-a", eventlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	members := []membership.Member{{Node: "orders-0.abc", Status: membership.StatusAlive,
		Meta: membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "orders-0", Boot: 7, State: balancer.StateReady}}}
	pa := processAudit{l: l, members: func() []membership.Member { return members }, log: zap.NewNop()}
	send := func(e membership.ProcessEvent) {
		e.Set, e.Replica, e.Boot = "orders", "orders-0", 7
		pa.HandleMessage("orders-0.abc", e.Encode())
	}
	since := time.Now()
	send(membership.ProcessEvent{Seq: 1, Event: "start", Pid: 41})
	send(membership.ProcessEvent{Seq: 3, Event: "start", Pid: 42}) // overtook the exit
	exit := membership.ProcessEvent{Seq: 2, Event: "exit", Pid: 41, Reason: "stop"}
	send(exit)
	exit.Set, exit.Replica, exit.Boot = "orders", "orders-0", 7

	n := &ProxyNode{audit: l}
	var aj admin.Job
	n.processFacts(&aj, runner.Job{Set: "orders", Replica: "orders-0", Since: since})
	if want := exitText(processFields("orders-0.abc", exit)); aj.Pid != 42 || aj.LastExit != want {
		t.Fatalf("process facts: pid %d, last exit %q; want 42, %q", aj.Pid, aj.LastExit, want)
	}
}
