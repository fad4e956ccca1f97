package membership

import (
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

func rep(set, name, addr string, st balancer.State, boot int64, status Status) Member {
	return Member{Node: name + "." + string(rune('a'+boot%26)), Status: status,
		Meta: Meta{Role: RoleReplica, Set: set, Replica: name, Addr: addr, State: st, Boot: boot}}
}

func TestReplicasBySet(t *testing.T) {
	cases := map[string]struct {
		in   []Member
		want map[string][]balancer.Replica
	}{
		"alive replicas grouped by set and sorted": {
			in: []Member{
				rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusAlive),
				rep("orders", "o-0", "a:1", balancer.StateStarting, 1, StatusAlive),
				rep("events", "e-0", "a:3", balancer.StateDraining, 1, StatusAlive),
				{Node: "proxy-x", Meta: Meta{Role: RoleProxy}, Status: StatusAlive},
			},
			want: map[string][]balancer.Replica{
				"orders": {{Name: "o-0", Addr: "a:1", State: balancer.StateStarting, Source: "gossip", Boot: 1}, {Name: "o-1", Addr: "a:2", State: balancer.StateReady, Source: "gossip", Boot: 1}},
				"events": {{Name: "e-0", Addr: "a:3", State: balancer.StateDraining, Source: "gossip", Boot: 1}},
			},
		},
		"newest boot wins, dead old entry ignored": {
			in: []Member{
				rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusDead),
				rep("orders", "o-0", "a:9", balancer.StateStarting, 2, StatusAlive),
			},
			want: map[string][]balancer.Replica{"orders": {{Name: "o-0", Addr: "a:9", State: balancer.StateStarting, Source: "gossip", Boot: 2}}},
		},
		"dead is down, left is stopped, left for good is dropped": {
			in: []Member{
				rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusDead),
				rep("orders", "o-1", "a:2", balancer.StateStopped, 1, StatusLeft),
				func() Member {
					m := rep("orders", "o-2", "a:3", balancer.StateStopped, 1, StatusLeft)
					m.Meta.Remove = true
					return m
				}(),
			},
			want: map[string][]balancer.Replica{"orders": {
				{Name: "o-0", Addr: "a:1", State: balancer.StateReady, Source: "gossip", Down: true, Boot: 1},
				{Name: "o-1", Addr: "a:2", State: balancer.StateStopped, Source: "gossip", Boot: 1},
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := ReplicasBySet(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// fakeTarget records what discovery feeds it.
type fakeTarget struct {
	mu   sync.Mutex
	sets map[string][]balancer.Replica
	fps  map[string]string
}

func (f *fakeTarget) SetReplicaSet(set string, rs []balancer.Replica) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.fps[set]; !ok {
		return false
	}
	f.sets[set] = rs
	return true
}
func (f *fakeTarget) ReplicaLoad(set, replica string) (int64, bool, bool) { return 0, true, true }
func (f *fakeTarget) Fingerprints() map[string]string                     { return f.fps }

func TestDiscoveryFeedsSetsAndChecksFingerprints(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp-A", "events": "fp-B"}}
	d := NewDiscovery(ft, DiscoveryOptions{Registerer: reg})
	peerSame := Member{Node: "proxy-2", Status: StatusAlive, Meta: Meta{Role: RoleProxy, Fingerprint: FingerprintMeta(map[string]string{"orders": "fp-A"})}}
	peerOther := Member{Node: "proxy-3", Status: StatusAlive, Meta: Meta{Role: RoleProxy, Fingerprint: FingerprintMeta(map[string]string{"orders": "fp-X", "billing": "fp-Z"})}}
	d.SetMembers([]Member{
		rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive),
		rep("unknown", "u-0", "a:2", balancer.StateReady, 1, StatusAlive),
		peerSame, peerOther,
	})
	if len(ft.sets["orders"]) != 1 {
		t.Fatalf("orders not fed: %+v", ft.sets)
	}
	if got := testutil.ToFloat64(d.mismatchPeers); got != 1 {
		t.Fatalf("disagreeing proxy/set pairs = %v, want 1 (proxy-3/orders; billing is not ours)", got)
	}
	if got := testutil.ToFloat64(d.unknownSets); got != 1 {
		t.Fatalf("unknown sets = %v, want 1", got)
	}
	// The same view again counts nothing new; the set losing its last
	// replica is cleared.
	d.SetMembers([]Member{peerSame, peerOther})
	if got := testutil.ToFloat64(d.mismatchTotal); got != 1 {
		t.Fatalf("mismatch counter = %v after a repeat, want 1", got)
	}
	if rs, ok := ft.sets["orders"]; !ok || len(rs) != 0 {
		t.Fatalf("orders not cleared: %+v", ft.sets)
	}
	// The peer fixes its config: disagreement gone.
	peerOther.Meta.Fingerprint = FingerprintMeta(map[string]string{"orders": "fp-A"})
	d.SetMembers([]Member{peerSame, peerOther})
	if got := testutil.ToFloat64(d.mismatchPeers); got != 0 {
		t.Fatalf("disagreements = %v after the fix, want 0", got)
	}
}

func TestMetaRoundTripAndGarbage(t *testing.T) {
	m := Meta{Role: RoleReplica, Set: "orders", Replica: "orders-0", Addr: "10.0.0.7:9001", State: balancer.StateDraining,
		Weight: 3, Zone: "eu-1a", Boot: 1764400000123456789, Fingerprint: "orders:0a1b2c3d", Remove: true, Held: true, SetStopped: true}
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeMeta(b)
	if err != nil || got != m {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if len(b) > 80 {
		t.Errorf("encoded meta is %d bytes; expected a compact encoding", len(b))
	}
	for _, f := range []Meta{{Role: RoleReplica, Remove: true}, {Role: RoleReplica, Held: true}, {Role: RoleReplica, SetStopped: true}, {Role: RoleReplica}} {
		b, _ := f.Encode()
		if got, err := DecodeMeta(b); err != nil || got != f {
			t.Errorf("flags round trip %+v: %+v, %v", f, got, err)
		}
	}
	// A proxy's id comes last; metadata without one (an older proxy's, or
	// an agent's) decodes with none, and Member.ID falls back to the node
	// name.
	px := Meta{Role: RoleProxy, Addr: "127.0.0.1:9901", Boot: 7, Fingerprint: "orders:0a1b2c3d", ID: "host-a:8080"}
	pb, err := px.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeMeta(pb); err != nil || got != px {
		t.Fatalf("proxy round trip: %+v, %v", got, err)
	}
	if mb, _ := (Meta{Role: RoleProxy, Addr: px.Addr, Boot: 7, Fingerprint: px.Fingerprint}).Encode(); len(mb) != len(pb)-1-len(px.ID) {
		t.Errorf("a meta without id is %d bytes, want %d: it must encode as before ids existed", len(mb), len(pb)-1-len(px.ID))
	}
	older, err := DecodeMeta(pb[:len(pb)-1-len(px.ID)])
	if err != nil || older.ID != "" || older.Fingerprint != px.Fingerprint {
		t.Fatalf("an older proxy's meta: %+v, %v", older, err)
	}
	if id := (Member{Node: "proxy-host-a.x1", Meta: older}).ID(); id != "proxy-host-a.x1" {
		t.Errorf("Member.ID without an advertised id = %q, want the node name", id)
	}
	if id := (Member{Node: "proxy-host-a.x1", Meta: px}).ID(); id != "host-a:8080" {
		t.Errorf("Member.ID = %q, want the advertised id", id)
	}
	// Appended fields of a later revision are ignored (after the id; a
	// member without one writes an empty id first).
	if got, err := DecodeMeta(append(pb, 1, 2, 3)); err != nil || got != px {
		t.Fatalf("trailing bytes: %+v %v", got, err)
	}
	if got, err := DecodeMeta(append(b, 0, 1, 2, 3)); err != nil || got != m {
		t.Fatalf("trailing bytes after an empty id: %+v %v", got, err)
	}
	for name, in := range map[string][]byte{
		"empty":         nil,
		"short":         {1, 2},
		"other version": append([]byte{2}, b[1:]...),
		"bad role":      append([]byte{1, 9}, b[2:]...),
		"bad state":     append([]byte{1, 2, 99}, b[3:]...),
		"truncated":     b[:len(b)-3],
		"truncated id":  pb[:len(pb)-2],
		"oversized":     make([]byte, 600),
	} {
		if _, err := DecodeMeta(in); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	long := m
	long.Fingerprint = string(make([]byte, 250))
	long.Zone = string(make([]byte, 250))
	if _, err := long.Encode(); err == nil {
		t.Error("meta over 512 bytes encoded without error")
	}
}

func TestDiscoveryReportsMemberChanges(t *testing.T) {
	var got []string
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{OnEvent: func(e MemberEvent) {
		got = append(got, e.Kind+" "+e.Member.Meta.Replica+" "+e.From)
	}})
	a := rep("orders", "o-0", "a:1", balancer.StateStarting, 1, StatusAlive)
	b := rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusAlive)
	d.SetMembers([]Member{a, b})
	a.Meta.State = balancer.StateReady
	d.SetMembers([]Member{a, b})
	b.Status = StatusDead
	d.SetMembers([]Member{a, b})
	a.Status, a.Meta.State = StatusLeft, balancer.StateStopped
	d.SetMembers([]Member{a, b})
	want := []string{"member_join o-0 ", "member_join o-1 ", "state_change o-0 starting", "member_dead o-1 alive", "member_leave o-0 alive"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n got %q\nwant %q", got, want)
	}
}

// After the proxy starts serving a set (a reload), Resync feeds it the
// replicas gossip already knows; a set it stops serving is not reported
// as unknown unless agents advertise it.
func TestDiscoveryResync(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp-A"}}
	d := NewDiscovery(ft, DiscoveryOptions{Registerer: reg})
	d.SetMembers([]Member{
		rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive),
		rep("payments", "p-0", "a:2", balancer.StateReady, 1, StatusAlive),
	})
	if _, ok := ft.sets["payments"]; ok || testutil.ToFloat64(d.unknownSets) != 1 {
		t.Fatalf("payments fed before it is served: %+v, unknown %v", ft.sets, testutil.ToFloat64(d.unknownSets))
	}
	ft.mu.Lock()
	ft.fps["payments"] = "fp-P"
	delete(ft.fps, "orders")
	ft.mu.Unlock()
	d.Resync()
	if len(ft.sets["payments"]) != 1 || ft.sets["payments"][0].Name != "p-0" {
		t.Fatalf("payments after Resync: %+v", ft.sets["payments"])
	}
	if got := testutil.ToFloat64(d.unknownSets); got != 2 {
		t.Fatalf("unknown sets = %v, want 2 (orders is advertised and no longer served)", got)
	}
	// orders' last replica leaves: not served and not advertised, no warning.
	d.SetMembers([]Member{rep("payments", "p-0", "a:2", balancer.StateReady, 1, StatusAlive)})
	if got := testutil.ToFloat64(d.unknownSets); got != 2 {
		t.Fatalf("unknown sets = %v, want still 2", got)
	}
}

// blockingTarget blocks the first feed of a ready o-0 once armed, to hold
// a Resync inside the target while gossip delivers a newer snapshot.
type blockingTarget struct {
	fakeTarget
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingTarget) SetReplicaSet(set string, rs []balancer.Replica) bool {
	if b.armed.Load() && len(rs) == 1 && rs[0].State == balancer.StateReady {
		b.once.Do(func() { close(b.entered); <-b.release })
	}
	return b.fakeTarget.SetReplicaSet(set, rs)
}

// A Resync (a reload's goroutine) racing a gossip snapshot never leaves
// the proxy with the older view.
func TestDiscoveryResyncRacesGossip(t *testing.T) {
	bt := &blockingTarget{fakeTarget: fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}},
		entered: make(chan struct{}), release: make(chan struct{})}
	d := NewDiscovery(bt, DiscoveryOptions{})
	d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive)})
	bt.armed.Store(true)
	resynced := make(chan struct{})
	go func() { d.Resync(); close(resynced) }()
	<-bt.entered
	// Meanwhile gossip: o-0 drains (the Node's emit goroutine).
	fed := make(chan struct{})
	go func() {
		d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive)})
		close(fed)
	}()
	close(bt.release)
	<-resynced
	<-fed
	bt.mu.Lock()
	got := bt.sets["orders"][0].State
	bt.mu.Unlock()
	if got != balancer.StateDraining {
		t.Fatalf("after a Resync raced gossip the proxy has o-0 %v; the newest snapshot says draining", got)
	}
}

// sent records what Discovery sends, decoded.
type sent struct {
	mu     sync.Mutex
	drains []AdminDrain
	to     []string
}

func (s *sent) send(node string, msg []byte) error {
	if MessageKind(msg) != "admin_drain" {
		return nil // drain reports
	}
	c, err := DecodeAdminDrain(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drains = append(s.drains, c)
	s.to = append(s.to, node)
	return nil
}

func (s *sent) take() ([]AdminDrain, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, to := s.drains, s.to
	s.drains, s.to = nil, nil
	return d, to
}

// An operator drain outlives the agent: a new incarnation of a held
// replica is drained again until it advertises the hold; an undrain (the
// held incarnation advertising no hold) or a scale-in ends it.
func TestDiscoveryRedrainsNewIncarnation(t *testing.T) {
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{})
	rec := &sent{}
	d.send = rec.send
	held := func(m Member) Member { m.Meta.Held = true; return m }

	d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive)})
	d.report()
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("drain commands for a replica nobody drained: %+v", got)
	}
	// Drained by an operator, then the agent crashes and comes back (boot 2).
	d.SetMembers([]Member{held(rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive))})
	d.SetMembers([]Member{
		held(rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusDead)),
		rep("orders", "o-0", "a:1", balancer.StateStarting, 2, StatusAlive),
	})
	d.report()
	got, to := rec.take()
	if len(got) != 1 || !got[0].Drain || got[0].Boot != 2 || got[0].Replica != "o-0" || to[0] != "o-0.c" {
		t.Fatalf("after the restart: sent %+v to %v, want one drain of boot 2 to o-0.c", got, to)
	}
	// Ready before the command arrives: routed as draining all the same.
	d.SetMembers([]Member{
		held(rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusDead)),
		rep("orders", "o-0", "a:1", balancer.StateReady, 2, StatusAlive),
	})
	ft.mu.Lock()
	fed := ft.sets["orders"]
	ft.mu.Unlock()
	if len(fed) != 1 || fed[0].State != balancer.StateDraining {
		t.Fatalf("the new incarnation is fed as %+v before it holds the drain, want draining", fed)
	}
	d.report()
	if got, to = rec.take(); len(got) != 1 || got[0].Boot != 2 {
		t.Fatalf("next report: sent %+v to %v, want the drain of boot 2 again until it is held", got, to)
	}

	// The new incarnation holds it: nothing more to send.
	d.SetMembers([]Member{held(rep("orders", "o-0", "a:1", balancer.StateDraining, 2, StatusAlive))})
	d.report()
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("drain re-sent to an incarnation that holds it: %+v", got)
	}
	// Undrained: a later incarnation is left alone.
	d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateReady, 2, StatusAlive)})
	ft.mu.Lock()
	fed = ft.sets["orders"]
	ft.mu.Unlock()
	if len(fed) != 1 || fed[0].State != balancer.StateReady {
		t.Fatalf("after the undrain o-0 is fed as %+v, want ready", fed)
	}
	d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateStarting, 3, StatusAlive)})
	d.report()
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("drained again after an undrain: %+v", got)
	}
	// Held, then removed for good (scale-in): a new replica of that name
	// starts undrained.
	d.SetMembers([]Member{held(rep("orders", "o-0", "a:1", balancer.StateDraining, 3, StatusAlive))})
	removed := held(rep("orders", "o-0", "a:1", balancer.StateStopped, 3, StatusAlive))
	removed.Meta.Remove = true
	d.SetMembers([]Member{removed})
	d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateStarting, 4, StatusAlive)})
	d.report()
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("drained a replica that was removed for good: %+v", got)
	}
}

// An older incarnation that gossip has not declared dead yet (a crash a
// moment ago) does not bring back a drain the operator ended on the newer
// one.
func TestDiscoveryUndrainWithStaleIncarnation(t *testing.T) {
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{})
	rec := &sent{}
	d.send = rec.send
	held := func(m Member) Member { m.Meta.Held = true; return m }
	old := held(rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive))
	d.SetMembers([]Member{old})
	d.SetMembers([]Member{old, held(rep("orders", "o-0", "a:1", balancer.StateDraining, 2, StatusAlive))})
	// Undrained on boot 2, while boot 1 still looks alive.
	d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateReady, 2, StatusAlive), old})
	d.report()
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("drained again after the undrain: %+v", got)
	}
	ft.mu.Lock()
	fed := ft.sets["orders"]
	ft.mu.Unlock()
	if len(fed) != 1 || fed[0].State != balancer.StateReady {
		t.Fatalf("o-0 fed as %+v after the undrain, want ready", fed)
	}
}

// A new incarnation that never holds the drain (an older agent) is asked
// MaxRedrains times, then no more; an undrain told by another proxy
// (HandleMessage) ends the drain here too; a mark is forgotten with its
// replica.
func TestDiscoveryRedrainBounds(t *testing.T) {
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{})
	rec := &sent{}
	d.send = rec.send
	held := func(m Member) Member { m.Meta.Held = true; return m }
	d.SetMembers([]Member{held(rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive))})
	old := rep("orders", "o-0", "a:1", balancer.StateReady, 2, StatusAlive) // never advertises Held
	d.SetMembers([]Member{old})
	total := 0
	for range MaxRedrains + 10 {
		d.report()
		got, _ := rec.take()
		total += len(got)
	}
	if total != MaxRedrains {
		t.Fatalf("%d drain commands to an incarnation that never holds it, want %d", total, MaxRedrains)
	}
	fed := func() balancer.State {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		return ft.sets["orders"][0].State
	}
	if fed() != balancer.StateDraining {
		t.Fatalf("routed as %v after giving up asking, want draining until an undrain", fed())
	}
	// Another proxy's admin API undrained it.
	d.HandleMessage("proxy-b", AdminDrain{Set: "orders", Replica: "o-0", Drain: false, By: "proxy-b"}.Encode())
	if fed() != balancer.StateReady {
		t.Fatalf("routed as %v after the undrain, want ready", fed())
	}
	d.report()
	if got, _ := rec.take(); len(got) != 0 {
		t.Fatalf("drain commands after the undrain: %+v", got)
	}
	// A drain command (not an undrain) from a proxy changes nothing here.
	d.SetMembers([]Member{held(rep("orders", "o-0", "a:1", balancer.StateDraining, 3, StatusAlive))})
	d.HandleMessage("proxy-b", AdminDrain{Set: "orders", Replica: "o-0", Drain: true}.Encode())
	d.mu.Lock()
	_, marked := d.held[[2]string{"orders", "o-0"}]
	d.mu.Unlock()
	if !marked {
		t.Fatal("the mark of a held incarnation is gone")
	}
	// Forgotten by gossip (forget_after): the mark goes with it.
	d.SetMembers([]Member{rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusAlive)})
	d.SetMembers([]Member{rep("orders", "o-0", "a:1", balancer.StateReady, 4, StatusAlive)})
	d.report()
	if got, _ := rec.take(); len(got) != 0 || fed() != balancer.StateReady {
		t.Fatalf("a replica forgotten and back under its name is drained again: %+v, %v", got, fed())
	}
}

// A proxy reports to draining replicas and, with StoppedSeen, to stopped
// ones still alive: an agent leaving for good waits for that.
func TestDiscoveryReportsStoppedSeen(t *testing.T) {
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{})
	var reports []DrainReport
	d.send = func(node string, msg []byte) error {
		if r, err := DecodeDrainReport(msg); err == nil {
			reports = append(reports, r)
		}
		return nil
	}
	stopped := rep("orders", "o-1", "a:2", balancer.StateStopped, 1, StatusAlive)
	stopped.Meta.Remove = true
	d.SetMembers([]Member{
		rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive),
		stopped,
		rep("orders", "o-2", "a:3", balancer.StateReady, 1, StatusAlive),
		rep("orders", "o-3", "a:4", balancer.StateStopped, 1, StatusLeft),
	})
	d.report()
	if len(reports) != 2 || reports[0].Replica != "o-0" || reports[0].StoppedSeen || reports[1].Replica != "o-1" || !reports[1].StoppedSeen {
		t.Fatalf("reports %+v, want o-0 (draining) and o-1 (stopped, seen)", reports)
	}
}

// Fingerprint mismatches are tracked per proxy ID: of the two processes
// of an upgrading proxy the newest boot speaks for it, a mismatch that
// goes on from the old process to the new one is counted once, and the
// other process of this proxy is no other proxy.
func TestDiscoveryFingerprintsByProxyID(t *testing.T) {
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp-A"}}
	d := NewDiscovery(ft, DiscoveryOptions{})
	d.self = "edge-a"
	proc := func(node, id string, boot int64, fp string) Member {
		return Member{Node: node, Status: StatusAlive, Meta: Meta{Role: RoleProxy, ID: id, Boot: boot, Fingerprint: FingerprintMeta(map[string]string{"orders": fp})}}
	}
	check := func(step string, pairs, total float64, ms ...Member) {
		t.Helper()
		d.SetMembers(ms)
		if got := testutil.ToFloat64(d.mismatchPeers); got != pairs {
			t.Fatalf("%s: disagreeing pairs %v, want %v", step, got, pairs)
		}
		if got := testutil.ToFloat64(d.mismatchTotal); got != total {
			t.Fatalf("%s: mismatches counted %v, want %v", step, got, total)
		}
	}
	own := proc("a.2", "edge-a", 9, "fp-other") // this proxy's other process, routing otherwise
	check("old process disagrees", 1, 1, proc("b.1", "edge-b", 1, "fp-X"), own)
	check("new process disagrees too", 1, 1, proc("b.1", "edge-b", 1, "fp-X"), proc("b.2", "edge-b", 2, "fp-X"), own)
	check("new process agrees", 0, 1, proc("b.1", "edge-b", 1, "fp-X"), proc("b.2", "edge-b", 2, "fp-A"), own)
	check("old process gone", 0, 1, proc("b.2", "edge-b", 2, "fp-A"))
}
