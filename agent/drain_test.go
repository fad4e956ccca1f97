package agent

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/membership"
)

func proxyMember(node string, status membership.Status) membership.Member {
	return membership.Member{Node: node, Meta: membership.Meta{Role: membership.RoleProxy}, Status: status}
}

func TestPendingProxies(t *testing.T) {
	done := membership.DrainReport{DrainingSeen: true, Inflight: 0}
	busy := membership.DrainReport{DrainingSeen: true, Inflight: 3}
	unseen := membership.DrainReport{DrainingSeen: false, Inflight: 0}
	self := membership.Member{Node: "orders-0.x", Meta: membership.Meta{Role: membership.RoleReplica}, Status: membership.StatusAlive, Self: true}
	other := membership.Member{Node: "orders-1.y", Meta: membership.Meta{Role: membership.RoleReplica}, Status: membership.StatusAlive}
	cases := map[string]struct {
		members []membership.Member
		latest  map[string]membership.DrainReport
		want    []string
	}{
		"no proxies: drained at once": {
			members: []membership.Member{self, other},
			want:    nil,
		},
		"one proxy without a report": {
			members: []membership.Member{self, proxyMember("p1", membership.StatusAlive)},
			want:    []string{"p1"},
		},
		"one proxy done": {
			members: []membership.Member{self, proxyMember("p1", membership.StatusAlive)},
			latest:  map[string]membership.DrainReport{"p1": done},
			want:    nil,
		},
		"one done, one busy": {
			members: []membership.Member{proxyMember("p2", membership.StatusAlive), proxyMember("p1", membership.StatusAlive)},
			latest:  map[string]membership.DrainReport{"p1": done, "p2": busy},
			want:    []string{"p2"},
		},
		"zero in flight but drain not seen": {
			members: []membership.Member{proxyMember("p1", membership.StatusAlive)},
			latest:  map[string]membership.DrainReport{"p1": unseen},
			want:    []string{"p1"},
		},
		"dead and left proxies are not waited for": {
			members: []membership.Member{proxyMember("p1", membership.StatusDead), proxyMember("p2", membership.StatusLeft), proxyMember("p3", membership.StatusAlive)},
			latest:  map[string]membership.DrainReport{"p1": busy},
			want:    []string{"p3"},
		},
		"reports from non-members do not count": {
			members: []membership.Member{proxyMember("p1", membership.StatusAlive)},
			latest:  map[string]membership.DrainReport{"p9": done},
			want:    []string{"p1"},
		},
		"replicas' reports are irrelevant": {
			members: []membership.Member{other, proxyMember("p1", membership.StatusAlive)},
			latest:  map[string]membership.DrainReport{"p1": done, "orders-1.y": busy},
			want:    nil,
		},
		"sorted": {
			members: []membership.Member{proxyMember("pc", membership.StatusAlive), proxyMember("pa", membership.StatusAlive), proxyMember("pb", membership.StatusAlive)},
			want:    []string{"pa", "pb", "pc"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := pendingProxies(tc.members, tc.latest); !slices.Equal(got, tc.want) {
				t.Fatalf("pendingProxies = %v, want %v", got, tc.want)
			}
		})
	}
	got := describePending([]string{"a", "b", "c"}, map[string]membership.DrainReport{"b": busy, "c": unseen})
	if want := []string{"a=no report", "b=3 in flight", "c=draining not seen yet"}; !slices.Equal(got, want) {
		t.Fatalf("describePending = %q, want %q", got, want)
	}
}

// The report book keeps only reports about this incarnation of this
// replica, received after the drain began, and the latest one per proxy.
func TestReportBook(t *testing.T) {
	m := newMetrics()
	b := newReportBook("orders", "orders-0", 42, m)
	rep := func(set, replica string, boot, inflight int64) []byte {
		return membership.DrainReport{Set: set, Replica: replica, Boot: boot, DrainingSeen: true, Inflight: inflight}.Encode()
	}
	b.record("p1", rep("orders", "orders-0", 42, 0)) // before the drain
	if len(b.snapshot()) != 0 {
		t.Fatal("a report received before the drain was kept")
	}
	b.begin()
	b.record("p1", rep("orders", "orders-0", 42, 5))
	b.record("p1", rep("orders", "orders-0", 42, 2)) // latest wins
	b.record("p2", rep("orders", "orders-0", 41, 0)) // earlier boot
	b.record("p2", rep("orders", "orders-1", 42, 0)) // another replica
	b.record("p2", rep("events", "orders-0", 42, 0)) // another set
	b.record("p3", []byte("{not json"))
	b.record("p3", []byte(`{"kind":"other"}`))
	got := b.snapshot()
	if len(got) != 1 || got["p1"].Inflight != 2 {
		t.Fatalf("snapshot = %+v, want only p1 with 2 in flight", got)
	}
	select {
	case <-b.changed:
	default:
		t.Fatal("no signal after an accepted report")
	}
	for result, want := range map[string]float64{"accepted": 2, "before_drain": 1, "other_replica": 3, "malformed": 2} {
		if got := testutil.ToFloat64(m.reports.WithLabelValues(result)); got != want {
			t.Errorf("drain_reports_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	got["p1"] = membership.DrainReport{}
	if b.snapshot()["p1"].Inflight != 2 {
		t.Fatal("snapshot shares its map with the book")
	}

	// A set start ends the drain: reports are forgotten and no longer
	// recorded until the next one begins.
	b.end()
	b.record("p1", rep("orders", "orders-0", 42, 0))
	if len(b.snapshot()) != 0 || testutil.ToFloat64(m.reports.WithLabelValues("before_drain")) != 2 {
		t.Fatalf("after end: snapshot %+v, before_drain %v; want empty and 2", b.snapshot(), testutil.ToFloat64(m.reports.WithLabelValues("before_drain")))
	}
}

func TestPendingStopped(t *testing.T) {
	px := func(name string, st membership.Status) membership.Member {
		return membership.Member{Node: name, Meta: membership.Meta{Role: membership.RoleProxy}, Status: st}
	}
	members := []membership.Member{
		px("b", membership.StatusAlive), px("a", membership.StatusAlive), px("dead", membership.StatusDead),
		{Node: "self", Meta: membership.Meta{Role: membership.RoleReplica}, Status: membership.StatusAlive, Self: true},
	}
	latest := map[string]membership.DrainReport{
		"a":    {DrainingSeen: true, StoppedSeen: true},
		"b":    {DrainingSeen: true}, // still draining in its view
		"dead": {},
	}
	if got := pendingStopped(members, latest); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("pending %v, want [b]", got)
	}
	delete(latest, "a")
	if got := pendingStopped(members, latest); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("pending %v, want [a b] (no report counts as not seen)", got)
	}
}
