package membership

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"keyway/balancer"
)

// The tie rules of the incarnation index: the newest alive incarnation is
// the alive member with the highest boot, the first in snapshot order of
// equal boots; the listed member is the newest alive one, else the
// highest boot of any status.
func TestIncarnationsTieRules(t *testing.T) {
	named := func(m Member, node string) Member { m.Node = node; return m }
	ms := []Member{
		// o-0: a newer dead incarnation does not lock the name: the newest
		// alive one, boot 2, is listed.
		rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive),
		rep("orders", "o-0", "a:3", balancer.StateReady, 3, StatusDead),
		rep("orders", "o-0", "a:2", balancer.StateReady, 2, StatusAlive),
		// o-1: two alive members of one boot: the first counts.
		named(rep("orders", "o-1", "a:4", balancer.StateReady, 5, StatusAlive), "o-1.first"),
		named(rep("orders", "o-1", "a:5", balancer.StateReady, 5, StatusAlive), "o-1.second"),
		// o-2: of one boot, the alive member is listed even after a dead one.
		named(rep("orders", "o-2", "a:6", balancer.StateReady, 7, StatusDead), "o-2.dead"),
		named(rep("orders", "o-2", "a:7", balancer.StateReady, 7, StatusAlive), "o-2.alive"),
		// o-3: nobody alive.
		rep("orders", "o-3", "a:8", balancer.StateStopped, 1, StatusLeft),
		// Not replicas, or unnamed: not indexed.
		{Node: "proxy-1", Status: StatusAlive, Meta: Meta{Role: RoleProxy}},
		{Node: "anon", Status: StatusAlive, Meta: Meta{Role: RoleReplica, Set: "orders"}},
	}
	idx := indexIncarnations(ms)
	if len(idx) != 4 {
		t.Fatalf("indexed %d replicas, want 4: %+v", len(idx), idx)
	}
	for _, tc := range []struct {
		replica, newest, listed string // node names; newest "" means none alive
	}{
		{"o-0", "o-0.c", "o-0.c"},
		{"o-1", "o-1.first", "o-1.first"},
		{"o-2", "o-2.alive", "o-2.alive"},
		{"o-3", "", "o-3.b"},
	} {
		m, ok := idx.newestAlive("orders", tc.replica)
		if ok != (tc.newest != "") || (ok && m.Node != tc.newest) {
			t.Errorf("%s: newest alive %q (%v), want %q", tc.replica, m.Node, ok, tc.newest)
		}
		if got := idx[[2]string{"orders", tc.replica}].listed.Node; got != tc.listed {
			t.Errorf("%s: listed %q, want %q", tc.replica, got, tc.listed)
		}
	}
	if _, ok := idx.newestAlive("orders", "o-9"); ok {
		t.Error("a replica nobody advertises has a newest alive incarnation")
	}
	// ReplicasBySet is built from the listed members.
	want := []balancer.Replica{
		{Name: "o-0", Addr: "a:2", State: balancer.StateReady, Source: "gossip", Boot: 2},
		{Name: "o-1", Addr: "a:4", State: balancer.StateReady, Source: "gossip", Boot: 5},
		{Name: "o-2", Addr: "a:7", State: balancer.StateReady, Source: "gossip", Boot: 7},
		{Name: "o-3", Addr: "a:8", State: balancer.StateStopped, Source: "gossip", Boot: 1},
	}
	if got := ReplicasBySet(ms)["orders"]; !reflect.DeepEqual(got, want) {
		t.Fatalf("ReplicasBySet\n got %+v\nwant %+v", got, want)
	}
}

// drainFixture is a Discovery with a fake send, as if attached to the
// gossip node "proxy-1".
func drainFixture() (*Discovery, *fakeTarget, *sent) {
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{})
	rec := &sent{}
	d.send, d.self = rec.send, "proxy-1"
	return d, ft, rec
}

// proxies are this proxy (self), another alive one and a dead one.
var proxies = []Member{
	{Node: "proxy-1", Status: StatusAlive, Self: true, Meta: Meta{Role: RoleProxy}},
	{Node: "proxy-2", Status: StatusAlive, Meta: Meta{Role: RoleProxy}},
	{Node: "proxy-3", Status: StatusDead, Meta: Meta{Role: RoleProxy}},
}

// A drain goes to the newest alive incarnation only, naming its boot; no
// proxy is told.
func TestDiscoveryDrainTargetsNewestAlive(t *testing.T) {
	d, _, rec := drainFixture()
	d.SetMembers(append([]Member{
		rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive), // crashed a moment ago
		rep("orders", "o-0", "a:1", balancer.StateReady, 3, StatusDead),
		rep("orders", "o-0", "a:1", balancer.StateReady, 2, StatusAlive),
		rep("orders", "o-1", "a:2", balancer.StateReady, 4, StatusAlive),
	}, proxies...))
	if err := d.Drain("orders", "o-0", true); err != nil {
		t.Fatal(err)
	}
	got, to := rec.take()
	want := []AdminDrain{{Kind: "admin_drain", Set: "orders", Replica: "o-0", Boot: 2, Drain: true, By: "proxy-1"}}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(to, []string{"o-0.c"}) {
		t.Fatalf("sent %+v to %v, want %+v to [o-0.c]", got, to, want)
	}
}

// An undrain goes to the newest alive incarnation, makes this proxy forget
// the operator drain (a new incarnation awaiting the hold is routed by what
// it advertises again), and is told to the other alive proxies only.
func TestDiscoveryUndrainForgetsAndTellsProxies(t *testing.T) {
	d, ft, rec := drainFixture()
	held := rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive)
	held.Meta.Held = true
	d.SetMembers(append([]Member{held}, proxies...))
	if !d.OperatorHeld("orders", "o-0") {
		t.Fatal("OperatorHeld false for a replica advertising the hold")
	}
	// The agent restarted: the new incarnation does not hold the drain yet
	// and is routed as draining.
	held.Status = StatusDead
	d.SetMembers(append([]Member{held, rep("orders", "o-0", "a:1", balancer.StateReady, 2, StatusAlive)}, proxies...))
	fed := func() balancer.State {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		return ft.sets["orders"][0].State
	}
	if fed() != balancer.StateDraining {
		t.Fatalf("the new incarnation is fed as %v, want draining", fed())
	}
	if d.OperatorHeld("orders", "o-0") {
		t.Fatal("OperatorHeld true while the newest alive incarnation does not hold the drain")
	}

	if err := d.Drain("orders", "o-0", false); err != nil {
		t.Fatal(err)
	}
	got, to := rec.take()
	cmd := AdminDrain{Kind: "admin_drain", Set: "orders", Replica: "o-0", Boot: 2, Drain: false, By: "proxy-1"}
	// The other proxies first: none may still remember the drain when the
	// agent releases it.
	if !reflect.DeepEqual(got, []AdminDrain{cmd, cmd}) || !reflect.DeepEqual(to, []string{"proxy-2", "o-0.c"}) {
		t.Fatalf("sent %+v to %v, want the undrain of boot 2 to proxy-2, then to o-0.c", got, to)
	}
	d.mu.Lock()
	_, marked := d.held[[2]string{"orders", "o-0"}]
	d.mu.Unlock()
	if marked || fed() != balancer.StateReady {
		t.Fatalf("after the undrain: marked %v, fed as %v; want forgotten and ready", marked, fed())
	}
	d.report()
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("drain commands after the undrain: %+v", got)
	}
}

// Nothing is sent for a replica without an alive member, or before a node
// is attached; a failed send to the replica's agent is an error and
// changes nothing else.
func TestDiscoveryDrainErrors(t *testing.T) {
	d, ft, rec := drainFixture()
	d.SetMembers(append([]Member{
		rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusDead),
		rep("orders", "o-1", "a:2", balancer.StateDraining, 1, StatusAlive),
	}, proxies...))
	for _, replica := range []string{"o-0", "o-9"} {
		for _, drain := range []bool{true, false} {
			if err := d.Drain("orders", replica, drain); !errors.Is(err, ErrNotAdvertised) {
				t.Errorf("Drain(%s, %v) = %v, want ErrNotAdvertised", replica, drain, err)
			}
		}
	}
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("sent %+v for replicas nobody alive advertises", got)
	}

	detached := NewDiscovery(ft, DiscoveryOptions{})
	detached.SetMembers([]Member{rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusAlive)})
	if err := detached.Drain("orders", "o-1", true); !errors.Is(err, ErrNotAttached) {
		t.Fatalf("Drain before Attach = %v, want ErrNotAttached", err)
	}

	// The agent cannot be reached: an error. The drain is forgotten here
	// and told to the other proxies all the same (they hear it first); the
	// agent still advertises it, so the next snapshot marks it again.
	d.mu.Lock()
	d.held[[2]string{"orders", "o-1"}] = 1
	d.mu.Unlock()
	unreachable := errors.New("connection refused")
	var tried []string
	d.send = func(node string, msg []byte) error { tried = append(tried, node); return unreachable }
	if err := d.Drain("orders", "o-1", false); !errors.Is(err, unreachable) {
		t.Fatalf("Drain with a failing send = %v, want it wrapped", err)
	}
	d.mu.Lock()
	_, marked := d.held[[2]string{"orders", "o-1"}]
	d.mu.Unlock()
	if marked || !reflect.DeepEqual(tried, []string{"proxy-2", "o-1.b"}) {
		t.Fatalf("after a failed undrain: marked %v, tried %v; want forgotten, proxy-2 then o-1.b tried", marked, tried)
	}
}

// A re-drain this proxy computes while an undrain is under way never
// reaches the agent after the undrain: the agent would hold the drain
// again (report and Drain are ordered by cmdMu).
func TestDiscoveryUndrainOrdersReDrains(t *testing.T) {
	for round := range 50 {
		d, _, rec := drainFixture()
		held := rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive)
		held.Meta.Held = true
		d.SetMembers(append([]Member{held}, proxies...))
		held.Status = StatusDead
		d.SetMembers(append([]Member{held, rep("orders", "o-0", "a:1", balancer.StateReady, 2, StatusAlive)}, proxies...))

		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					d.report()
				}
			}
		}()
		if err := d.Drain("orders", "o-0", false); err != nil {
			t.Fatal(err)
		}
		close(stop)
		<-done
		got, to := rec.take()
		undrained := false
		for i, c := range got {
			if to[i] != "o-0.c" {
				continue
			}
			if !c.Drain {
				undrained = true
			} else if undrained {
				t.Fatalf("round %d: a drain reached the agent after its undrain: %+v to %v", round, got, to)
			}
		}
		if !undrained {
			t.Fatalf("round %d: no undrain reached the agent: %+v to %v", round, got, to)
		}
	}
}

// Claims to one replica name: the first seen alive holds it; a second
// alive claim at another address is refused, one at the same address is
// the replica restarting; two first seen together are both refused.
func TestConflicts(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	claim := func(node, addr string, since time.Duration, status Status) Member {
		return Member{Node: node, Status: status, Since: t0.Add(since),
			Meta: Meta{Role: RoleReplica, Set: "orders", Replica: "o-1", Addr: addr, State: balancer.StateReady}}
	}
	for _, tc := range []struct {
		name    string
		ms      []Member
		refused []string
	}{
		{"one claim", []Member{claim("g", "a:1", 0, StatusAlive)}, nil},
		{"a second claim at another address", []Member{claim("g", "a:1", 0, StatusAlive), claim("r", "a:9", 10*time.Second, StatusAlive)}, []string{"r"}},
		{"a restart at the same address", []Member{claim("g", "a:1", 0, StatusAlive), claim("g2", "a:1", 10*time.Second, StatusAlive)}, nil},
		{"the holder dead", []Member{claim("g", "a:1", 0, StatusDead), claim("r", "a:9", 10*time.Second, StatusAlive)}, nil},
		{"seen together", []Member{claim("g", "a:1", 0, StatusAlive), claim("r", "a:9", 100*time.Millisecond, StatusAlive)}, []string{"g", "r"}},
	} {
		got := conflicts(tc.ms)
		var names []string
		for n := range got {
			names = append(names, n)
		}
		slices.Sort(names)
		if !slices.Equal(names, tc.refused) {
			t.Errorf("%s: refused %v, want %v", tc.name, names, tc.refused)
		}
	}
}
