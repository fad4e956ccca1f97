package runstate

import (
	"context"
	"errors"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/membership"
)

// confirmNet is a runtimeNet whose States know the fleet: every node on
// it is an alive proxy, and known counts the proxies the fleet knows
// (0: the alive ones).
func confirmNet(t *testing.T, known int, names ...string) (*runtimeNet, []*State) {
	n := newRuntimeNet(t)
	var rs []*State
	for _, name := range names {
		r := n.add(name, "", nil)
		r.confirmWithin = 300 * time.Millisecond
		r.fleet = func() Peers {
			n.mu.Lock()
			defer n.mu.Unlock()
			p := Peers{Alive: len(n.nodes), Known: max(known, len(n.nodes))}
			for other := range n.nodes {
				if other != name {
					p.Ask = append(p.Ask, other)
				}
			}
			return p
		}
		rs = append(rs, r)
	}
	return n, rs
}

type writeResult struct {
	rec Record
	err error
}

// goWrite runs a Write in the background; pump the net until it answers.
func goWrite(r *State, set string, ifMatch *uint64, rec Record) <-chan writeResult {
	out := make(chan writeResult, 1)
	go func() {
		got, err := r.Write(context.Background(), KindSet, set, ifMatch, put(rec))
		out <- writeResult{got, err}
	}()
	return out
}

// await pumps the net until the write answers.
func await(t *testing.T, n *runtimeNet, ch <-chan writeResult) writeResult {
	t.Helper()
	var res writeResult
	poll.Until(t, 10*time.Second, "the write to answer", func() bool {
		n.pump()
		select {
		case res = <-ch:
			return true
		default:
			return false
		}
	})
	return res
}

// A write answers once every other proxy holds it.
func TestWriteConfirmedByEveryProxy(t *testing.T) {
	n, rs := confirmNet(t, 0, "a", "b", "c")
	res := await(t, n, goWrite(rs[0], "orders", nil, Record{Stopped: ptr(true), Action: "stop"}))
	if res.err != nil {
		t.Fatalf("write: %v", res.err)
	}
	for _, r := range rs {
		if got, ok := r.Get(KindSet, "orders"); !ok || got.Version != res.rec.Version {
			t.Fatalf("a proxy holds %+v, want version %d", got, res.rec.Version)
		}
	}
}

// Of two concurrent writes of one set through two proxies, the one whose
// record loses the merge gets a ConflictError naming the winner; the
// other is confirmed; every proxy ends with the winner.
func TestConcurrentWritesOneLoses(t *testing.T) {
	for round := range 20 {
		n, rs := confirmNet(t, 0, "a", "b", "c")
		a := goWrite(rs[0], "orders", nil, Record{Stopped: ptr(true), Action: "stop"})
		b := goWrite(rs[1], "orders", nil, Record{Stopped: ptr(false), Action: "start"})
		// Both written locally before either travels: a true conflict.
		poll.Until(t, 5*time.Second, "both writes stored", func() bool {
			_, okA := rs[0].Get(KindSet, "orders")
			_, okB := rs[1].Get(KindSet, "orders")
			return okA && okB
		})
		ra, rb := await(t, n, a), await(t, n, b)
		var lost, won writeResult
		switch {
		case ra.err == nil && rb.err != nil:
			won, lost = ra, rb
		case rb.err == nil && ra.err != nil:
			won, lost = rb, ra
		default:
			t.Fatalf("round %d: a: %v, b: %v; want exactly one confirmed", round, ra.err, rb.err)
		}
		var c *ConflictError
		if !errors.As(lost.err, &c) || !c.Lost || c.Current.Version != won.rec.Version || c.Current.Origin != won.rec.Origin {
			t.Fatalf("round %d: the loser got %v, want a lost conflict naming %d/%s", round, lost.err, won.rec.Version, won.rec.Origin)
		}
		n.tick()
		for _, r := range rs {
			if got, _ := r.Get(KindSet, "orders"); got.Version != won.rec.Version || got.Origin != won.rec.Origin {
				t.Fatalf("round %d: a proxy holds %d/%s, want the winner %d/%s", round, got.Version, got.Origin, won.rec.Version, won.rec.Origin)
			}
		}
	}
}

// If-Match names the version a write was made from: a stale one is
// refused at once and nothing is written.
func TestWriteIfMatch(t *testing.T) {
	n, rs := confirmNet(t, 0, "a", "b")
	zero := uint64(0)
	first := await(t, n, goWrite(rs[0], "orders", &zero, Record{Replicas: ptr(4), Action: "scale"}))
	if first.err != nil {
		t.Fatal(first.err)
	}
	stale := await(t, n, goWrite(rs[1], "orders", &zero, Record{Replicas: ptr(5), Action: "scale"}))
	var c *ConflictError
	if !errors.As(stale.err, &c) || c.Lost || c.Current.Version != first.rec.Version {
		t.Fatalf("stale If-Match: %v", stale.err)
	}
	if got, _ := rs[1].Get(KindSet, "orders"); *got.Replicas != 4 {
		t.Fatalf("a refused write changed the record: %+v", got)
	}
	v := first.rec.Version
	if res := await(t, n, goWrite(rs[1], "orders", &v, Record{Replicas: ptr(5), Action: "scale"})); res.err != nil {
		t.Fatalf("current If-Match: %v", res.err)
	}
}

// A proxy that does not answer leaves the write unconfirmed after the
// bound; a proxy without a majority confirms nothing.
func TestWriteUnconfirmed(t *testing.T) {
	n, rs := confirmNet(t, 0, "a", "b", "c")
	n.drop = func(m runtimeMsg) bool { return m.to == "c" || m.from == "c" }
	res := await(t, n, goWrite(rs[0], "orders", nil, Record{Stopped: ptr(true), Action: "stop"}))
	var u *UnconfirmedError
	if !errors.As(res.err, &u) || len(u.Missing) != 1 || u.Missing[0] != "c" {
		t.Fatalf("a silent proxy: %v", res.err)
	}
	if got, ok := rs[0].Get(KindSet, "orders"); !ok || got.Version != u.Record.Version {
		t.Fatal("an unconfirmed write is not kept on its proxy")
	}
	// Alone of three known proxies: a partition's minority side.
	n2, rs2 := confirmNet(t, 3, "a")
	res = await(t, n2, goWrite(rs2[0], "orders", nil, Record{Stopped: ptr(true), Action: "stop"}))
	if !errors.As(res.err, &u) || u.Reached != 1 || u.Known != 3 {
		t.Fatalf("the minority side: %v", res.err)
	}
}

// fleetPeers: the other alive proxies are asked; alive and known count by
// fleet ID, self included; a proxy that left is not known, a dead one is;
// legacy proxies are neither asked nor counted.
func TestFleetPeers(t *testing.T) {
	proxy := func(node, id string, st membership.Status, legacy bool) membership.Member {
		return membership.Member{Node: node, Status: st, Legacy: legacy, Meta: membership.Meta{Role: membership.RoleProxy, ID: id}}
	}
	ms := []membership.Member{
		{Node: "self.1", Self: true, Status: membership.StatusAlive, Meta: membership.Meta{Role: membership.RoleProxy, ID: "self"}},
		proxy("b.1", "b", membership.StatusAlive, false),
		proxy("b.2", "b", membership.StatusAlive, false), // b upgrading: two processes
		proxy("c.1", "c", membership.StatusDead, false),
		proxy("d.1", "d", membership.StatusLeft, false),
		proxy("old.1", "old", membership.StatusAlive, true),
		{Node: "orders-0.1", Status: membership.StatusAlive, Meta: membership.Meta{Role: membership.RoleReplica}},
	}
	p := fleetPeers(ms, "self")
	if len(p.Ask) != 2 || p.Alive != 2 || p.Known != 3 {
		t.Fatalf("peers %+v, want ask [b.1 b.2], alive 2, known 3", p)
	}
}
