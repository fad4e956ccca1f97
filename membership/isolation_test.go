package membership

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// at returns t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// peer is a replica member of set "orders" named name (node name
// name+".a" for boot 1), alive, or dead since the given second.
func peer(name string, boot int64, dead ...float64) Member {
	m := rep("orders", name, name+":1", balancer.StateReady, boot, StatusAlive)
	m.Since = at(-600)
	if len(dead) > 0 {
		m.Status, m.Since = StatusDead, at(dead[0])
	}
	return m
}

func proxyPeer(name string, dead ...float64) Member {
	m := Member{Node: name, Meta: Meta{Role: RoleProxy}, Status: StatusAlive, Since: at(-600)}
	if len(dead) > 0 {
		m.Status, m.Since = StatusDead, at(dead[0])
	}
	return m
}

// proxyProcess is a proxy process with a fleet ID, alive, or dead since
// the given second.
func proxyProcess(node, id string, boot int64, dead ...float64) Member {
	m := proxyPeer(node, dead...)
	m.Meta.ID, m.Meta.Boot = id, boot
	return m
}

func self() Member {
	return Member{Node: "me", Self: true, Meta: Meta{Role: RoleProxy}, Status: StatusAlive, Since: at(-600)}
}

func left(m Member) Member { m.Status = StatusLeft; return m }

var testRule = isolationRule{window: 30 * time.Second, score: isolationScore, settle: 2 * time.Second}

// The rule on one snapshot, from outside isolation.
func TestIsolationRuleEnters(t *testing.T) {
	cases := map[string]struct {
		ms    []Member
		score int
		want  []string // held nodes; nil: not isolated
	}{
		"all alive, high score": {
			ms: []Member{self(), peer("o-0", 1), peer("o-1", 1), proxyPeer("p2")}, score: 7,
		},
		"one crash among four peers, healthy score: a crash": {
			ms: []Member{self(), peer("o-0", 1, -1), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2")}, score: 0,
		},
		"one crash among four peers, score 1: still a crash": {
			ms: []Member{self(), peer("o-0", 1, -1), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2")}, score: 1,
		},
		"first death while the health score says it is us": {
			ms:    []Member{self(), peer("o-0", 1, -1), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2")},
			score: 3, want: []string{"o-0.b"},
		},
		"more than half dead, healthy score (a partition leaving us some peers)": {
			ms:    []Member{self(), peer("o-0", 1, -9), peer("o-1", 1, -4), peer("o-2", 1), proxyPeer("p2", -1)},
			score: 0, want: []string{"o-0.b", "o-1.b", "p2"},
		},
		"exactly half dead, healthy score": {
			ms:    []Member{self(), peer("o-0", 1, -9), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2", -1)},
			score: 0,
		},
		"a single peer dead (one proxy, one replica): never isolation": {
			ms: []Member{self(), peer("o-0", 1, -1)}, score: 7,
		},
		"two peers, both dead": {
			ms:    []Member{self(), peer("o-0", 1, -3), peer("o-1", 1, -1)},
			score: 1, want: []string{"o-0.b", "o-1.b"},
		},
		"deaths older than the window are old news, neither dead nor peers": {
			// o-0 and o-1 died long ago: 1 of 2 peers recent, score healthy.
			ms:    []Member{self(), peer("o-0", 1, -300), peer("o-1", 1, -200), peer("o-2", 1, -1), proxyPeer("p2")},
			score: 0,
		},
		"old deaths are not held on entry": {
			ms:    []Member{self(), peer("o-0", 1, -300), peer("o-2", 1, -1), peer("o-1", 1), proxyPeer("p2")},
			score: 5, want: []string{"o-2.b"},
		},
		"a dead incarnation superseded by a newer alive one is a restart": {
			ms:    []Member{self(), peer("o-0", 1, -1), peer("o-0", 2), peer("o-1", 1), proxyPeer("p2")},
			score: 5,
		},
		"a dead proxy process superseded by a newer process of its fleet ID is an upgrade": {
			ms:    []Member{self(), proxyProcess("p2.a", "edge-b", 1, -1), proxyProcess("p2.b", "edge-b", 2), peer("o-1", 1)},
			score: 5,
		},
		"a dead proxy process of another fleet ID counts": {
			ms:    []Member{self(), proxyProcess("p2.a", "edge-b", 1, -1), proxyProcess("p3.a", "edge-c", 2), peer("o-1", 1)},
			score: 5, want: []string{"p2.a"},
		},
		"members that left do not count": {
			// Of the peers that did not leave, 1 of 2 is dead.
			ms:    []Member{self(), left(peer("o-0", 1)), left(peer("o-1", 1)), peer("o-2", 1, -1), proxyPeer("p2")},
			score: 0,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, end := testRule.step(isolation{}, tc.ms, tc.score, at(0))
			if end.why != "" {
				t.Fatalf("an isolation ended from outside one: %+v", end)
			}
			if tc.want == nil {
				if got.on {
					t.Fatalf("isolated, holding %v; want not isolated", got.heldNames())
				}
				return
			}
			if !got.on || !got.since.Equal(at(0)) {
				t.Fatalf("not isolated (%+v), want isolated since t0", got)
			}
			if !reflect.DeepEqual(got.heldNames(), tc.want) {
				t.Fatalf("held %v, want %v", got.heldNames(), tc.want)
			}
			for _, m := range got.held {
				if m.Status != StatusAlive {
					t.Fatalf("held %s with status %s, want alive", m.Node, m.Status)
				}
			}
		})
	}
}

// statusOf returns the status of node in view, and whether it is there.
func statusOf(view []Member, node string) (Status, bool) {
	for _, m := range view {
		if m.Node == node {
			return m.Status, true
		}
	}
	return 0, false
}

// A whole isolation: entry on the first death, more deaths held, the
// Node forgetting members, and the heal.
func TestIsolationHoldsAndHeals(t *testing.T) {
	old := peer("o-9", 1, -100) // dead before the isolation, beyond the window
	ms := []Member{self(), peer("o-0", 1, 0), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2"), old}
	s, _ := testRule.step(isolation{}, ms, 3, at(0))
	if !s.on {
		t.Fatal("not isolated on the first death with score 3")
	}
	// More deaths: each is held; the old death is not.
	ms = []Member{self(), peer("o-0", 1, 0), peer("o-1", 1, 2), peer("o-2", 1, 5), proxyPeer("p2", 9), old}
	s, end := testRule.step(s, ms, 7, at(10))
	if !s.on || end.why != "" {
		t.Fatalf("isolation ended: %+v", end)
	}
	if want := []string{"o-0.b", "o-1.b", "o-2.b", "p2"}; !reflect.DeepEqual(s.heldNames(), want) {
		t.Fatalf("held %v, want %v", s.heldNames(), want)
	}
	view := s.view(ms)
	for _, n := range []string{"o-0.b", "o-1.b", "o-2.b", "p2"} {
		if st, _ := statusOf(view, n); st != StatusAlive {
			t.Fatalf("%s is %s in the view, want alive", n, st)
		}
	}
	if st, _ := statusOf(view, "o-9.b"); st != StatusDead {
		t.Fatalf("o-9 (dead before the isolation) is %s in the view, want dead", st)
	}
	if got := ReplicasBySet(view)["orders"]; slices.ContainsFunc(got, func(r balancer.Replica) bool { return r.Down && r.Name != "o-9" }) {
		t.Fatalf("a held replica is down: %+v", got)
	}

	// forget_after passes: the Node forgets o-0 and o-9. Nothing is
	// forgotten in the view.
	ms = []Member{self(), peer("o-1", 1, 2), peer("o-2", 1, 5), proxyPeer("p2", 9)}
	s, _ = testRule.step(s, ms, 7, at(400))
	if !s.on {
		t.Fatal("isolation ended when the Node forgot members")
	}
	view = s.view(ms)
	if st, ok := statusOf(view, "o-0.b"); !ok || st != StatusAlive {
		t.Fatalf("forgotten held o-0: %v %v in the view, want alive", st, ok)
	}
	if st, ok := statusOf(view, "o-9.b"); !ok || st != StatusDead {
		t.Fatalf("forgotten o-9: %v %v in the view, want dead", st, ok)
	}
	if !slices.IsSortedFunc(view, func(a, b Member) int { return cmpString(a.Node, b.Node) }) {
		t.Fatal("view not sorted by node name")
	}
	// Later deaths are still recent relative to the isolation: a member
	// dying 6 minutes into it is held too.
	ms = append(ms, peer("o-3", 1, 401))
	s, _ = testRule.step(s, ms, 7, at(402))
	if _, ok := s.held["o-3.b"]; !ok {
		t.Fatalf("o-3, dead during the isolation, not held: %v", s.heldNames())
	}

	// Heal: everyone alive again (o-0 rejoins; o-9 stays forgotten).
	ms = []Member{self(), peer("o-0", 1), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2"), peer("o-3", 1)}
	s, end = testRule.step(s, ms, 7, at(403))
	if s.on || end.why != "every member held is alive again" || len(end.dead) != 0 {
		t.Fatalf("after the heal: on=%v end=%+v", s.on, end)
	}
	if got := s.view(ms); !reflect.DeepEqual(got, ms) {
		t.Fatal("outside isolation the view is not the snapshot")
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// A member that really died during the isolation: once another is heard
// from, it is taken as dead after settle, and does not start a new
// isolation although the health score is still high.
func TestIsolationSettlesOnContact(t *testing.T) {
	ms := []Member{self(), peer("o-0", 1, 0), peer("o-1", 1, 1), peer("o-2", 1, 2), proxyPeer("p2", 3)}
	s, _ := testRule.step(isolation{}, ms, 7, at(4))
	if len(s.held) != 4 {
		t.Fatalf("held %v", s.heldNames())
	}
	// Contact: three come back, o-1 does not.
	ms = []Member{self(), peer("o-0", 1), peer("o-1", 1, 1), peer("o-2", 1), proxyPeer("p2")}
	s, end := testRule.step(s, ms, 7, at(20))
	if !s.on || end.why != "" {
		t.Fatalf("left before settle: %+v", end)
	}
	if got := s.view(ms); func() bool { st, _ := statusOf(got, "o-1.b"); return st != StatusAlive }() {
		t.Fatal("o-1 is not held alive before settle")
	}
	s, end = testRule.step(s, ms, 7, at(21.9))
	if !s.on {
		t.Fatalf("left before settle: %+v", end)
	}
	s, end = testRule.step(s, ms, 7, at(22))
	if s.on || !reflect.DeepEqual(end.dead, []string{"o-1.b"}) {
		t.Fatalf("after settle: on=%v end=%+v", s.on, end)
	}
	if st, _ := statusOf(s.view(ms), "o-1.b"); st != StatusDead {
		t.Fatal("o-1 not fed dead after the isolation")
	}
	// Its death was judged: with the score still 7, no new isolation.
	s, _ = testRule.step(s, ms, 7, at(23))
	if s.on {
		t.Fatal("the death judged at the end of the isolation started a new one")
	}
	// A new death after it counts again.
	ms[3] = peer("o-2", 1, 24)
	if s, _ = testRule.step(s, ms, 7, at(25)); !s.on || !reflect.DeepEqual(s.heldNames(), []string{"o-2.b"}) {
		t.Fatalf("a new death with score 7: on=%v held %v", s.on, s.heldNames())
	}
}

// A false alarm (one crash while the score happened to be high) ends when
// the score falls again; a restart of a held replica is contact.
func TestIsolationFalseAlarmAndRestart(t *testing.T) {
	ms := []Member{self(), peer("o-0", 1, 0), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2")}
	s, _ := testRule.step(isolation{}, ms, 2, at(0))
	if !s.on {
		t.Fatal("not isolated")
	}
	s, end := testRule.step(s, ms, 2, at(5))
	if !s.on {
		t.Fatalf("left while the score is still high: %+v", end)
	}
	s, end = testRule.step(s, ms, 1, at(6))
	if s.on || !reflect.DeepEqual(end.dead, []string{"o-0.b"}) {
		t.Fatalf("false alarm not ended: on=%v %+v", s.on, end)
	}

	// Majority entry, then a held replica restarts (newer boot alive):
	// it is no longer held, and that is contact. (With a low score, 2 of
	// 4 dead would end the isolation: at most half is no isolation.)
	ms = []Member{self(), peer("o-0", 1, 0), peer("o-1", 1, 1), peer("o-2", 1, 2), proxyPeer("p2")}
	s, _ = testRule.step(isolation{}, ms, 0, at(3))
	if !s.on {
		t.Fatal("not isolated with 3 of 4 dead")
	}
	ms = append(ms, peer("o-0", 2))
	s, _ = testRule.step(s, ms, 3, at(4))
	if _, ok := s.held["o-0.b"]; ok || !s.contact.Equal(at(4)) {
		t.Fatalf("restarted o-0: held %v, contact %v", s.heldNames(), s.contact)
	}
}

// Discovery feeds held replicas as in rotation, reports the isolation
// (gauge, counter, accessor), re-checks on its own as the score changes,
// and feeds the normal snapshot at once when the network heals.
func TestDiscoveryIsolation(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}
	var (
		score = 0
		now   = at(0)
	)
	d := NewDiscovery(ft, DiscoveryOptions{Registerer: reg, HealthScore: func() int { return score }, Now: func() time.Time { return now }})
	d.rule = testRule
	down := func() []string {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		var out []string
		for _, r := range ft.sets["orders"] {
			if r.Down {
				out = append(out, r.Name)
			}
		}
		return out
	}
	all := []Member{self(), peer("o-0", 1), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2")}
	d.SetMembers(all)

	// A crash with a healthy score: down, no isolation.
	now = at(1)
	d.SetMembers([]Member{self(), peer("o-0", 1, 1), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2")})
	if on, _ := d.Isolated(); on || !reflect.DeepEqual(down(), []string{"o-0"}) {
		t.Fatalf("crash: isolated=%v down=%v", on, down())
	}
	d.SetMembers(all)

	// The score rises (no snapshot): nothing dead, nothing to hold.
	score, now = 3, at(40)
	d.recheckIsolation()
	if on, _ := d.Isolated(); on {
		t.Fatal("isolated with every member alive")
	}
	// The first death under a high score: isolated, nothing down.
	now = at(41)
	cut := []Member{self(), peer("o-0", 1, 41), peer("o-1", 1), peer("o-2", 1), proxyPeer("p2")}
	d.SetMembers(cut)
	if on, since := d.Isolated(); !on || !since.Equal(at(41)) {
		t.Fatalf("Isolated() = %v, %v; want true since t0+41s", on, since)
	}
	if got := down(); len(got) != 0 {
		t.Fatalf("replicas down while isolated: %v", got)
	}
	if testutil.ToFloat64(d.isoM.isolated) != 1 || testutil.ToFloat64(d.isoM.episodes) != 1 || testutil.ToFloat64(d.isoM.held) != 1 {
		t.Fatalf("metrics: isolated %v, episodes %v, held %v", testutil.ToFloat64(d.isoM.isolated), testutil.ToFloat64(d.isoM.episodes), testutil.ToFloat64(d.isoM.held))
	}
	// Everyone dies in this proxy's view: still nothing down.
	now = at(50)
	d.SetMembers([]Member{self(), peer("o-0", 1, 41), peer("o-1", 1, 44), peer("o-2", 1, 48), proxyPeer("p2", 49)})
	if got := down(); len(got) != 0 || testutil.ToFloat64(d.isoM.held) != 4 {
		t.Fatalf("down %v, held %v", got, testutil.ToFloat64(d.isoM.held))
	}
	// The heal: the normal snapshot at once.
	now = at(60)
	d.SetMembers(all)
	if on, _ := d.Isolated(); on || testutil.ToFloat64(d.isoM.isolated) != 0 || testutil.ToFloat64(d.isoM.held) != 0 {
		t.Fatal("still isolated after the heal")
	}

	// A false alarm ends on the periodic re-check once the score falls,
	// and the crashed replica is fed down then.
	now = at(70)
	d.SetMembers([]Member{self(), peer("o-0", 1), peer("o-1", 1, 70), peer("o-2", 1), proxyPeer("p2")})
	if on, _ := d.Isolated(); !on || len(down()) != 0 {
		t.Fatalf("score 3, one death: isolated=%v down=%v", on, down())
	}
	score, now = 0, at(72)
	d.recheckIsolation()
	if on, _ := d.Isolated(); on || !reflect.DeepEqual(down(), []string{"o-1"}) {
		t.Fatalf("after the score fell: isolated=%v down=%v", on, down())
	}
	if testutil.ToFloat64(d.isoM.episodes) != 2 {
		t.Fatalf("episodes = %v, want 2", testutil.ToFloat64(d.isoM.episodes))
	}
}
