package server

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/eventlog"
	"keyway/membership"
)

// A supervising agent's process events become replica_process audit
// events, only from that replica's alive agent.
func TestProcessAudit(t *testing.T) {
	l, err := eventlog.New(eventlog.DefaultConfig(), "proxy-a", eventlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	agentMember := membership.Member{Node: "orders-1.abc", Status: membership.StatusAlive,
		Meta: membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "orders-1", Boot: 7, State: balancer.StateReady}}
	members := []membership.Member{
		agentMember,
		{Node: "proxy-b.x", Status: membership.StatusAlive, Meta: membership.Meta{Role: membership.RoleProxy}},
		{Node: "orders-2.old", Status: membership.StatusDead, Meta: membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "orders-2", Boot: 3}},
	}
	pa := processAudit{l: l, members: func() []membership.Member { return members }, log: zap.NewNop()}
	ev := func(e membership.ProcessEvent) membership.ProcessEvent {
		e.Set, e.Replica, e.Boot = "orders", "orders-1", 7
		return e
	}
	pa.HandleMessage("orders-1.abc", ev(membership.ProcessEvent{Seq: 1, Event: "start", Pid: 41}).Encode())
	pa.HandleMessage("orders-1.abc", ev(membership.ProcessEvent{Seq: 2, Event: "exit", Pid: 41, Reason: "signal", Code: -1, Signal: "SIGKILL"}).Encode())
	pa.HandleMessage("orders-1.abc", ev(membership.ProcessEvent{Seq: 3, Event: "restart", Restarts: 1, BackoffMS: 1100}).Encode())
	pa.HandleMessage("orders-1.abc", ev(membership.ProcessEvent{Seq: 4, Event: "exit", Reason: "exit_code", Code: 0, Restarts: 1}).Encode())
	pa.HandleMessage("orders-1.abc", ev(membership.ProcessEvent{Seq: 5, Event: "exit", Reason: "start_error", Code: -1, Error: "no such file"}).Encode())
	pa.HandleMessage("orders-1.abc", ev(membership.ProcessEvent{Seq: 6, Event: "give_up", Restarts: 5}).Encode())
	// Dropped: not this replica's agent, an earlier boot, a dead member, a
	// proxy, garbage, another kind.
	pa.HandleMessage("orders-9.zzz", ev(membership.ProcessEvent{Seq: 7, Event: "start"}).Encode())
	stale := ev(membership.ProcessEvent{Seq: 8, Event: "start"})
	stale.Boot = 6
	pa.HandleMessage("orders-1.abc", stale.Encode())
	pa.HandleMessage("orders-2.old", membership.ProcessEvent{Set: "orders", Replica: "orders-2", Boot: 3, Seq: 9, Event: "start"}.Encode())
	pa.HandleMessage("proxy-b.x", ev(membership.ProcessEvent{Seq: 10, Event: "start"}).Encode())
	pa.HandleMessage("orders-1.abc", []byte(`{"kind":"replica_process","seq":`))
	pa.HandleMessage("orders-1.abc", membership.DrainReport{Set: "orders", Replica: "orders-1", Boot: 7}.Encode())

	got := l.Recent(time.Time{}, nil, 0)
	want := []string{
		`"kind":"replica_process","set":"orders","replica":"orders-1","event":"start","member":"orders-1.abc","pid":41,"seq":1}`,
		`"kind":"replica_process","set":"orders","replica":"orders-1","event":"exit","member":"orders-1.abc","pid":41,"reason":"signal","restarts":0,"seq":2,"signal":"SIGKILL"}`,
		`"kind":"replica_process","set":"orders","replica":"orders-1","backoff":"1.1s","event":"restart","member":"orders-1.abc","restarts":1,"seq":3}`,
		`"kind":"replica_process","set":"orders","replica":"orders-1","code":0,"event":"exit","member":"orders-1.abc","reason":"exit_code","restarts":1,"seq":4}`,
		`"kind":"replica_process","set":"orders","replica":"orders-1","error":"no such file","event":"exit","member":"orders-1.abc","reason":"start_error","restarts":0,"seq":5}`,
		`"kind":"replica_process","set":"orders","replica":"orders-1","event":"give_up","member":"orders-1.abc","restarts":5,"seq":6}`,
	}
	if len(got) != len(want) {
		for _, e := range got {
			b, _ := e.MarshalJSON()
			t.Log(string(b))
		}
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i, e := range got {
		b, _ := e.MarshalJSON()
		s := string(b)
		if i := len(`{"ts":"2026-11-29T09:41:30.000123456Z","node":"proxy-a",`); len(s) > i {
			s = s[i:]
		}
		if s != want[i] {
			t.Errorf("event %d:\n got %s\nwant %s", i, s, want[i])
		}
	}
}
