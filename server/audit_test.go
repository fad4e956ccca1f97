package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/admin"
	"keyway/balancer"
	"keyway/eventlog"
	"keyway/eventlog/query"
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

// A ring rebuild or rotation change records what places every key at
// that moment (the fingerprint, the ring members and those in rotation),
// and from the recorded fields alone the balancer's code finds each
// partition's owner and pick as the table did. It logs what those fields
// add to an event, for 3 and for 100 replicas.
func TestTableAuditRecordsPlacement(t *testing.T) {
	for _, n := range []int{3, 100} {
		l, err := eventlog.New(eventlog.DefaultConfig(), "proxy-a", eventlog.Options{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := balancer.NewRouter(balancer.RouterConfig{Set: "orders", Hash: balancer.DefaultHashConfig()}, balancer.Hooks[struct{}]{})
		if err != nil {
			t.Fatal(err)
		}
		reps := make([]balancer.Replica, n)
		for i := range reps {
			reps[i] = balancer.Replica{Name: fmt.Sprintf("orders-%d", i), Addr: fmt.Sprintf("10.0.0.%d:8080", i+1), State: balancer.StateReady}
		}
		r.SetReplicas("gossip", reps)
		r.SetExcluded("orders-1", balancer.ReasonEjected, true)
		r.Flush()
		tbl := r.Table()
		info := balancer.RebuildInfo{Set: "orders", Generation: tbl.Generation(), Cause: "replicas", RingSize: tbl.Len(),
			InRotation: len(tbl.Rotation()), RingBuilt: true, Moved: 7919, Fingerprint: tbl.Fingerprint(), Failover: balancer.FailoverNext}
		tableAudit{l: l}.TableChanged("orders", n, tbl.Members(), info)
		evs := l.Recent(time.Time{}, []string{eventlog.KindRingRebuild}, 0)
		if len(evs) != 1 {
			t.Fatalf("%d ring_rebuild events, want 1", len(evs))
		}
		e := evs[0]
		members, _ := e.Fields["members"].([]string)
		rotation, _ := e.Fields["rotation"].([]string)
		fp, _ := e.Fields["fingerprint"].(string)
		if len(members) != n || len(rotation) != n-1 || slices.Contains(rotation, "orders-1") || fp != tbl.Fingerprint() {
			t.Fatalf("recorded members %d, rotation %v, fingerprint %q", len(members), rotation, fp)
		}
		for p := 0; p < 7919; p += 13 {
			got, err := balancer.PlaceRecorded(fp, members, rotation, balancer.FailoverNext, p)
			if err != nil {
				t.Fatal(err)
			}
			var want balancer.Placed
			if s, ok := tbl.Pick(uint64(p)); ok {
				want.Pick = tbl.Replica(s).Name
			}
			if got.Pick != want.Pick {
				t.Fatalf("partition %d: recorded pick %q, the table's %q", p, got.Pick, want.Pick)
			}
		}
		if e.Fields["failover"] != "next" {
			t.Fatalf("recorded failover %v, want next", e.Fields["failover"])
		}

		// GET /v1/events?set=orders&key=K follows the key's partition
		// through the memory, as keyway audit does through the trail.
		l.Record(eventlog.KindEjected, "orders", "orders-1", nil)
		v := &view{n: &ProxyNode{audit: l}}
		for _, key := range []string{"order-1", "order-2", "order-3", "order-4"} {
			got, err := v.Events(admin.EventQuery{Sets: []string{"orders"}, Partition: -1, Key: key})
			if err != nil {
				t.Fatal(err)
			}
			h := balancer.HashString(key)
			p := tbl.Partition(h)
			owner, pick := "", ""
			if s, ok := tbl.Pick(uint64(p)); ok {
				pick = tbl.Replica(s).Name
			}
			pl, _ := balancer.PlaceRecorded(fp, members, members, balancer.FailoverNext, p)
			owner = pl.Owner
			want := 1 // the ring rebuild
			if owner == "orders-1" || pick == "orders-1" {
				want = 2 // and the ejection of its owner
			}
			if len(got) != want {
				t.Fatalf("key %s (partition %d, owner %s, pick %s): %d events, want %d", key, p, owner, pick, len(got), want)
			}
			ev := got[0].(eventlog.Event)
			placed, _ := ev.Fields["placement"].(*query.Placement)
			if placed == nil || placed.Partition != p || placed.Pick != pick || placed.Owner != owner {
				t.Fatalf("key %s: placement %+v, want partition %d owner %s pick %s", key, placed, p, owner, pick)
			}
		}
		if _, err := v.Events(admin.EventQuery{Partition: 3}); err == nil || !strings.Contains(err.Error(), "set:") {
			t.Fatalf("a partition without its set: %v", err)
		}

		full, _ := e.MarshalJSON()
		for _, k := range []string{"members", "rotation", "fingerprint"} {
			delete(e.Fields, k)
		}
		bare, _ := e.MarshalJSON()
		t.Logf("%d replicas: the ring_rebuild event is %d bytes, %d without members, rotation and fingerprint (+%d)", n, len(full), len(bare), len(full)-len(bare))
	}
}
