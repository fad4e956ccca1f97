package membership

import (
	"slices"
	"sync"
	"testing"
	"time"

	"keyway/balancer"
)

// retireSent records the Retire commands Discovery sends, by node.
type retireSent struct {
	mu   sync.Mutex
	cmds map[string][]Retire
}

func (s *retireSent) send(node string, msg []byte) error {
	if MessageKind(msg) != RetireKind {
		return nil
	}
	c, err := DecodeRetire(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmds == nil {
		s.cmds = map[string][]Retire{}
	}
	s.cmds[node] = append(s.cmds[node], c)
	return nil
}

func (s *retireSent) take() map[string][]Retire {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cmds
	s.cmds = nil
	return c
}

func fedNames(ft *fakeTarget, set string) []string {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var out []string
	for _, r := range ft.sets[set] {
		out = append(out, r.Name)
	}
	return out
}

// Retiring replicas are told to retire, once a second each, until they
// advertise Remove; they leave the set's list once stopped, dead or gone,
// while a stopped replica that is not retiring stays (a restart).
func TestDiscoveryRetiresReplicas(t *testing.T) {
	now := time.Unix(1000, 0)
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{Now: func() time.Time { return now }})
	rec := &retireSent{}
	d.send = rec.send
	removed := func(m Member) Member { m.Meta.Remove = true; return m }
	members := []Member{
		rep("orders", "o-0", "a:1", balancer.StateStopped, 1, StatusAlive),
		rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusAlive),
		rep("orders", "o-2", "a:3", balancer.StateReady, 1, StatusAlive),
		rep("orders", "o-3", "a:4", balancer.StateReady, 1, StatusAlive),
	}
	d.SetMembers(members)
	d.tellRetiring()
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("commands with nothing retiring: %+v", got)
	}
	d.SetRetiring(map[string]RetireFrom{"orders": {Prefix: "o", From: 2}}, map[string][]string{"orders": {"o-2", "o-3"}})
	got := rec.take()
	if len(got) != 2 || len(got["o-2.b"]) != 1 || len(got["o-3.b"]) != 1 {
		t.Fatalf("sent %+v; want one retire each to o-2 and o-3", got)
	}
	if c := got["o-3.b"][0]; c.Set != "orders" || c.Replica != "o-3" || c.Boot != 1 {
		t.Fatalf("o-3 got %+v", c)
	}
	if drop, tell := d.Retiring("orders", "o-2"); !drop || !tell {
		t.Fatal("o-2 is not retiring")
	}
	if drop, tell := d.Retiring("orders", "o-1"); drop || tell {
		t.Fatal("o-1 is retiring")
	}
	// Ready retiring replicas stay listed (they drain first).
	if n := fedNames(ft, "orders"); !slices.Equal(n, []string{"o-0", "o-1", "o-2", "o-3"}) {
		t.Fatalf("fed %v", n)
	}
	now = now.Add(500 * time.Millisecond)
	d.tellRetiring()
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("resent within a second: %+v", got)
	}
	// o-2 stopped with Remove (retired), o-3 is dead: both leave the list
	// (the stopped o-0, not retiring, stays), and neither is told again.
	d.SetMembers([]Member{
		members[0], members[1],
		removed(rep("orders", "o-2", "a:3", balancer.StateStopped, 1, StatusAlive)),
		rep("orders", "o-3", "a:4", balancer.StateReady, 1, StatusDead),
	})
	if n := fedNames(ft, "orders"); !slices.Equal(n, []string{"o-0", "o-1"}) {
		t.Fatalf("fed %v, want o-0, o-1", n)
	}
	now = now.Add(600 * time.Millisecond)
	d.tellRetiring()
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("sent %+v; want nothing (o-2 advertises Remove, o-3 is dead)", got)
	}
	// A draining retiring replica stays listed and is told again.
	d.SetMembers([]Member{members[0], members[1], rep("orders", "o-2", "a:3", balancer.StateDraining, 1, StatusAlive)})
	if n := fedNames(ft, "orders"); !slices.Equal(n, []string{"o-0", "o-1", "o-2"}) {
		t.Fatalf("fed %v", n)
	}
	d.tellRetiring()
	if got := rec.take(); len(got) != 1 || len(got["o-2.b"]) != 1 {
		t.Fatalf("sent %+v, want o-2", got)
	}
	// Nothing retiring any more (a scale-out): the set's list is whole.
	d.SetRetiring(nil, nil)
	d.SetMembers([]Member{members[0], members[1], removed(rep("orders", "o-2", "a:3", balancer.StateStopped, 1, StatusAlive))})
	if n := fedNames(ft, "orders"); !slices.Equal(n, []string{"o-0", "o-1", "o-2"}) {
		t.Fatalf("fed %v after the retiring list was cleared", n)
	}
}

func TestRetireFromMatch(t *testing.T) {
	r := RetireFrom{Prefix: "orders", From: 2}
	for name, want := range map[string]bool{
		"orders-2": true, "orders-10": true, "orders-1": false, "orders-0": false, "orders-02": false,
		"orders-x": false, "orders": false, "orders-": false, "other-3": false, "orders-a-3": false,
	} {
		if got := r.Match(name); got != want {
			t.Errorf("Match(%q) = %v, want %v", name, got, want)
		}
	}
	if (RetireFrom{}).Match("orders-3") {
		t.Error("the zero RetireFrom matches")
	}
}
