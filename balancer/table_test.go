package balancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPickDeterministic: every key maps to exactly one replica, the same on
// repeated lookups, whatever order the replicas were listed in, and on two
// routers built independently.
func TestPickDeterministic(t *testing.T) {
	t.Parallel()
	hashes := keyHashes(7, 10_000)
	for _, n := range []int{3, 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			reps := readyReplicas(n)
			r := newTestRouter(t, RouterConfig{}, nil)
			r.SetReplicas("static", reps)
			tbl := r.Table()
			want := targets(tbl, hashes)
			for i, h := range hashes {
				if want[i] == "" {
					t.Fatalf("key %d has no replica", i)
				}
				for range 3 {
					if s, ok := tbl.Pick(h); !ok || tbl.Replica(s).Name != want[i] || s != tbl.Owner(h) {
						t.Fatalf("key %d: repeated Pick gave %d %v, want %s (the owner)", i, s, ok, want[i])
					}
				}
			}
			// Every replica gets keys, and all keys are spread over exactly n.
			if got := len(slices.Compact(slices.Sorted(slices.Values(want)))); got != n {
				t.Fatalf("keys landed on %d replicas, want %d", got, n)
			}

			rng := rand.New(rand.NewPCG(8, uint64(n)))
			for shuffle := range 5 {
				perm := slices.Clone(reps)
				rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
				other := newTestRouter(t, RouterConfig{}, nil)
				// Arrive in a different way too: one by one, from two sources.
				for i := range perm {
					other.SetReplicas("gossip", perm[:i+1])
				}
				other.SetReplicas("static", perm[:1])
				if got := targets(other.Table(), hashes); !slices.Equal(got, want) {
					t.Fatalf("shuffle %d (%v): routing differs", shuffle, names(perm))
				}
			}
		})
	}
}

func names(rs []Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}

// TestRotationDivertsOnlyOwnKeys: a replica out of rotation diverts its own
// keys, each to the next in-rotation replica of its partition's ring order,
// the same on two routers; no other key changes target; the ring is not
// rebuilt; when it returns, every key goes back.
func TestRotationDivertsOnlyOwnKeys(t *testing.T) {
	t.Parallel()
	const victim = "orders-004"
	tests := map[string]struct {
		out, back func(r *Router[*testBackend], rs []Replica)
	}{
		"unhealthy": {
			out:  func(r *Router[*testBackend], _ []Replica) { r.SetHealthy(victim, false) },
			back: func(r *Router[*testBackend], _ []Replica) { r.SetHealthy(victim, true) },
		},
		"ejected": {
			out:  func(r *Router[*testBackend], _ []Replica) { r.SetExcluded(victim, ReasonEjected, true) },
			back: func(r *Router[*testBackend], _ []Replica) { r.SetExcluded(victim, ReasonEjected, false) },
		},
		"two reasons": {
			out: func(r *Router[*testBackend], _ []Replica) {
				r.SetExcluded(victim, ReasonRefused, true)
				r.SetExcluded(victim, ReasonAdmin, true)
				r.SetExcluded(victim, ReasonRefused, false) // still out: admin
			},
			back: func(r *Router[*testBackend], _ []Replica) { r.SetExcluded(victim, ReasonAdmin, false) },
		},
		"draining": {
			out: func(r *Router[*testBackend], rs []Replica) {
				r.SetReplicas("gossip", withState(rs, victim, StateDraining))
			},
			back: func(r *Router[*testBackend], rs []Replica) { r.SetReplicas("gossip", rs) },
		},
		"recovering": {
			out: func(r *Router[*testBackend], rs []Replica) {
				r.SetReplicas("gossip", withState(rs, victim, StateRecovering))
			},
			back: func(r *Router[*testBackend], rs []Replica) { r.SetReplicas("gossip", rs) },
		},
		"restarting": {
			out: func(r *Router[*testBackend], rs []Replica) {
				r.SetReplicas("gossip", withState(rs, victim, StateStarting))
			},
			back: func(r *Router[*testBackend], rs []Replica) { r.SetReplicas("gossip", rs) },
		},
		"failed": {
			out: func(r *Router[*testBackend], rs []Replica) {
				r.SetReplicas("gossip", withState(rs, victim, StateFailed))
			},
			back: func(r *Router[*testBackend], rs []Replica) { r.SetReplicas("gossip", rs) },
		},
	}
	hashes := keyHashes(9, 10_000)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rs := readyReplicas(10)
			rc := &recorder{}
			a := newTestRouter(t, RouterConfig{}, rc)
			a.SetReplicas("gossip", rs)
			base := a.Table()
			before := targets(base, hashes)
			own, _ := memberOf(base, victim)

			n := rc.rebuilds()
			tc.out(a, rs)
			out := a.Table()
			for _, info := range rc.infos[n:] {
				if info.RingBuilt || info.Moved != 0 {
					t.Fatalf("a rotation change rebuilt the ring: %+v", info)
				}
			}
			if out.ring != base.ring {
				t.Fatal("a rotation change built a new ring")
			}
			// The first change takes it out: that rebuild diverts its partitions.
			if d := rc.infos[n].Diverted; d != own.Partitions {
				t.Fatalf("diverted %d partitions, want the %d %s owns", d, own.Partitions, victim)
			}
			after := targets(out, hashes)
			vs := slotOf(out, victim)
			if out.InRotation(vs) {
				t.Fatal("victim still in rotation")
			}
			changed := 0
			for i, h := range hashes {
				if before[i] != victim {
					if after[i] != before[i] {
						t.Fatalf("key %d of %s moved to %s", i, before[i], after[i])
					}
					continue
				}
				changed++
				// The next in-rotation replica of the partition's ring order.
				var next string
				for _, s := range out.Order(h) {
					if out.InRotation(s) {
						next = out.Replica(s).Name
						break
					}
				}
				if after[i] != next || next == "" || next == victim {
					t.Fatalf("key %d of %s went to %s, want %s (next in ring order)", i, victim, after[i], next)
				}
			}
			if changed == 0 {
				t.Fatal("the victim owned no keys")
			}

			// An independently built router, members in another order, agrees.
			b := newTestRouter(t, RouterConfig{}, nil)
			rev := slices.Clone(rs)
			slices.Reverse(rev)
			b.SetReplicas("gossip", rev)
			tc.out(b, rs)
			if !slices.Equal(targets(b.Table(), hashes), after) {
				t.Fatal("two routers divert differently")
			}

			tc.back(a, rs)
			if got := targets(a.Table(), hashes); !slices.Equal(got, before) {
				t.Fatal("keys did not return to their owners")
			}
			if info := rc.last(t); info.RingBuilt || info.Moved != 0 || info.Diverted != own.Partitions {
				t.Fatalf("return info %+v", info)
			}
			if a.Table().ring != base.ring {
				t.Fatal("the ring was rebuilt on return")
			}
		})
	}
}

func TestFailoverStrict(t *testing.T) {
	t.Parallel()
	hashes := keyHashes(10, 10_000)
	r := newTestRouter(t, RouterConfig{Failover: FailoverStrict}, nil)
	r.SetReplicas("static", readyReplicas(5))
	before := targets(r.Table(), hashes)
	r.SetHealthy("orders-002", false)
	tbl := r.Table()
	if tbl.Failover() != FailoverStrict {
		t.Fatal("table failover not strict")
	}
	refused := 0
	for i, h := range hashes {
		s, ok := tbl.Pick(h)
		c := tbl.Candidates(h)
		if before[i] == "orders-002" {
			refused++
			if ok || s != -1 || len(c) != 0 {
				t.Fatalf("key of the out owner: Pick %d %v, candidates %v; want none", s, ok, c)
			}
			continue
		}
		if !ok || tbl.Replica(s).Name != before[i] || len(c) != 1 || int(c[0]) != s {
			t.Fatalf("key of %s: Pick %d %v, candidates %v", before[i], s, ok, c)
		}
	}
	if refused == 0 {
		t.Fatal("no key was refused")
	}
	r.SetHealthy("orders-002", true)
	if !slices.Equal(targets(r.Table(), hashes), before) {
		t.Fatal("keys did not return")
	}
}

// TestNoReplicaInRotation: an empty ring and a ring with all out pick nothing.
func TestNoReplicaInRotation(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, tbl *Table[*testBackend]) {
		t.Helper()
		for _, h := range keyHashes(11, 1000) {
			if s, ok := tbl.Pick(h); ok || s != -1 {
				t.Fatalf("Pick = %d %v, want -1 false", s, ok)
			}
			if c := tbl.Candidates(h); len(c) != 0 {
				t.Fatalf("Candidates = %v", c)
			}
		}
		if s, ok := tbl.NextRoundRobin(); ok || s != -1 {
			t.Fatalf("NextRoundRobin = %d %v", s, ok)
		}
		if s, ok := tbl.RandomSlot(); ok || s != -1 {
			t.Fatalf("RandomSlot = %d %v", s, ok)
		}
		if len(tbl.Rotation()) != 0 {
			t.Fatalf("Rotation = %v", tbl.Rotation())
		}
	}
	t.Run("empty", func(t *testing.T) {
		r := newTestRouter(t, RouterConfig{}, nil)
		check(t, r.Table())
		if r.Table().Owner(1) != -1 || r.Table().Order(1) != nil {
			t.Fatal("empty table has an owner")
		}
	})
	for _, f := range []Failover{FailoverNext, FailoverStrict} {
		t.Run("all out "+f.String(), func(t *testing.T) {
			r := newTestRouter(t, RouterConfig{Failover: f}, nil)
			rs := readyReplicas(3)
			r.SetReplicas("static", rs)
			for _, rep := range rs {
				r.SetHealthy(rep.Name, false)
			}
			check(t, r.Table())
			if r.Table().Owner(1) < 0 || len(r.Table().Order(1)) != 3 {
				t.Fatal("the ring lost its owners")
			}
		})
	}
}

// TestSlowPath: when every precomputed candidate of a partition is out but
// some other replica is in rotation, Pick walks the ring and still agrees
// with a full ring walk, on two independently built routers.
func TestSlowPath(t *testing.T) {
	t.Parallel()
	cfg := HashConfig{Partitions: 2039, ReplicationFactor: 20, Load: 1.25}
	hashes := keyHashes(12, 10_000)
	tests := map[string]struct {
		in       []string // the replicas left in rotation, of 12
		wantSlow bool     // some partition certainly has all 8 candidates out
	}{
		"one left":   {[]string{"orders-007"}, true},
		"three left": {[]string{"orders-000", "orders-005", "orders-011"}, true},
		"four left":  {[]string{"orders-001", "orders-002", "orders-009", "orders-010"}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rs := readyReplicas(12)
			build := func(order []Replica) *Table[*testBackend] {
				r := newTestRouter(t, RouterConfig{Hash: cfg, Candidates: 8}, nil)
				r.SetReplicas("static", order)
				for _, rep := range order {
					if !slices.Contains(tc.in, rep.Name) {
						r.SetHealthy(rep.Name, false)
					}
				}
				return r.Table()
			}
			a := build(rs)
			rev := slices.Clone(rs)
			slices.Reverse(rev)
			b := build(rev)

			slow := 0
			for p := range cfg.Partitions {
				allOut := true
				for _, s := range a.ring.order[p*a.ring.k : (p+1)*a.ring.k] {
					allOut = allOut && !a.InRotation(int(s))
				}
				if allOut {
					slow++
				}
				ref := referenceOrder(a.ring.names, cfg, p)
				var want string
				if slices.Contains(tc.in, ref[0]) || slices.Contains(tc.in, a.ownerName(p)) {
					want = a.ownerName(p)
				}
				if !slices.Contains(tc.in, want) {
					for _, n := range ref {
						if slices.Contains(tc.in, n) {
							want = n
							break
						}
					}
				}
				if got := a.target(p); got != want {
					t.Fatalf("partition %d: picks %s, full ring walk says %s", p, got, want)
				}
			}
			if slow == 0 && tc.wantSlow {
				t.Fatal("no partition took the slow path")
			}
			t.Logf("%d of %d partitions had all 8 precomputed candidates out", slow, cfg.Partitions)
			if !slices.Equal(targets(a, hashes), targets(b, hashes)) {
				t.Fatal("two routers disagree on the slow path")
			}
			for _, h := range hashes {
				s, ok := a.Pick(h)
				if !ok || !a.InRotation(s) {
					t.Fatalf("Pick = %d %v", s, ok)
				}
				if c := a.Candidates(h); len(c) == 0 || int(c[0]) != s {
					t.Fatalf("Candidates %v do not start with Pick %d", c, s)
				}
			}
		})
	}
}

// TestCandidates: the first candidate is Pick's, all are distinct and in
// rotation, they follow the ring order, at most the configured count.
func TestCandidates(t *testing.T) {
	t.Parallel()
	hashes := keyHashes(13, 5000)
	tests := map[string]struct {
		replicas, candidates int
		out                  []string
	}{
		"3 of 3, default": {3, 0, nil},
		"1 candidate":     {5, 1, nil},
		"8 of 5 replicas": {5, 8, nil},
		"8 of 12":         {12, 8, nil},
		"3 of 10, 2 out":  {10, 3, []string{"orders-003", "orders-007"}},
		"8 of 12, 5 out":  {12, 8, []string{"orders-000", "orders-002", "orders-004", "orders-006", "orders-008"}},
		"3 of 3, 2 out":   {3, 3, []string{"orders-000", "orders-001"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newTestRouter(t, RouterConfig{Candidates: tc.candidates}, nil)
			r.SetReplicas("static", readyReplicas(tc.replicas))
			for _, n := range tc.out {
				r.SetHealthy(n, false)
			}
			tbl := r.Table()
			want := r.Config().Candidates
			inRot := tc.replicas - len(tc.out)
			for _, h := range hashes {
				c := tbl.Candidates(h)
				s, ok := tbl.Pick(h)
				if !ok || len(c) == 0 || int(c[0]) != s {
					t.Fatalf("Candidates %v, Pick %d %v", c, s, ok)
				}
				if len(c) > want || len(c) > inRot {
					t.Fatalf("%d candidates, want at most %d (in rotation %d)", len(c), want, inRot)
				}
				if len(c) < min(want, inRot, maxOrder) && inRot <= maxOrder && tc.replicas <= maxOrder {
					t.Fatalf("%d candidates, want %d", len(c), min(want, inRot))
				}
				for i, x := range c {
					if !tbl.InRotation(int(x)) || slices.Contains(c[:i], x) {
						t.Fatalf("candidates %v: %d out of rotation or repeated", c, x)
					}
				}
				// In ring order: the in-rotation part of Order, as a prefix.
				var inOrder []uint16
				for _, s := range tbl.Order(h) {
					if tbl.InRotation(s) {
						inOrder = append(inOrder, uint16(s))
					}
				}
				if len(inOrder) > 0 && !slices.Equal(c, inOrder[:min(len(c), len(inOrder))]) {
					t.Fatalf("candidates %v, ring order in rotation %v", c, inOrder)
				}
			}
		})
	}
}

func TestRoundRobinAndRandom(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, RouterConfig{}, nil)
	r.SetReplicas("static", readyReplicas(4))
	r.SetHealthy("orders-002", false)
	tbl := r.Table()
	if !slices.Equal(tbl.Rotation(), []uint16{0, 1, 3}) {
		t.Fatalf("Rotation = %v", tbl.Rotation())
	}
	counts := map[int]int{}
	for range 300 {
		s, ok := tbl.NextRoundRobin()
		if !ok || !tbl.InRotation(s) {
			t.Fatalf("NextRoundRobin = %d %v", s, ok)
		}
		counts[s]++
	}
	if counts[0] != 100 || counts[1] != 100 || counts[3] != 100 {
		t.Fatalf("round robin counts %v, want 100 each", counts)
	}
	// The cycle is shared across tables: a rebuild does not restart it.
	s1, _ := tbl.NextRoundRobin()
	r.SetHealthy("orders-002", true)
	s2, _ := r.Table().NextRoundRobin()
	if s1 == s2 {
		t.Fatalf("round robin restarted after a rebuild: %d then %d", s1, s2)
	}

	tbl = r.Table()
	counts = map[int]int{}
	for range 4000 {
		s, ok := tbl.RandomSlot()
		if !ok || !tbl.InRotation(s) {
			t.Fatalf("RandomSlot = %d %v", s, ok)
		}
		counts[s]++
	}
	for s := range 4 {
		if counts[s] < 800 || counts[s] > 1200 {
			t.Fatalf("random counts %v, want about 1000 each", counts)
		}
	}
}

func TestTableAccessors(t *testing.T) {
	t.Parallel()
	cfg := HashConfig{Partitions: 271, ReplicationFactor: 20, Load: 1.25}
	r := newTestRouter(t, RouterConfig{Set: "billing", Hash: cfg}, &recorder{})
	rs := readyReplicas(3)
	rs = append(rs, Replica{Name: "orders-zzz", Addr: "10.1.1.1:80", State: StateStarting})
	r.SetReplicas("static", rs)
	r.SetExcluded("orders-001", ReasonEjected|ReasonProbe, true)
	tbl := r.Table()
	if tbl.Set() != "billing" || tbl.Partitions() != 271 || tbl.Fingerprint() != cfg.Fingerprint() || tbl.Failover() != FailoverNext || tbl.Len() != 3 {
		t.Fatalf("accessors: set %s partitions %d fingerprint %s failover %v len %d", tbl.Set(), tbl.Partitions(), tbl.Fingerprint(), tbl.Failover(), tbl.Len())
	}
	if tbl.Partition(271*5+7) != 7 {
		t.Fatal("Partition is not hash % partitions")
	}
	s := slotOf(tbl, "orders-001")
	if tbl.InRotation(s) || tbl.Excluded(s) != ReasonEjected|ReasonProbe || tbl.Backend(s).rep.Name != "orders-001" || tbl.Replica(s).Addr != rs[1].Addr {
		t.Fatalf("slot %d: in rotation %v excluded %v", s, tbl.InRotation(s), tbl.Excluded(s))
	}
	ms := tbl.Members()
	if len(ms) != 4 || !slices.IsSortedFunc(ms, func(a, b Member) int { return cmpString(a.Name, b.Name) }) {
		t.Fatalf("Members %+v", ms)
	}
	total := 0
	for _, m := range ms {
		total += m.Partitions
		if (m.Name == "orders-zzz") != (m.Slot == -1) {
			t.Fatalf("member %+v", m)
		}
	}
	if total != 271 {
		t.Fatalf("members own %d partitions, want 271", total)
	}
	for _, h := range keyHashes(14, 100) {
		o := tbl.Order(h)
		if len(o) != 3 || o[0] != tbl.Owner(h) {
			t.Fatalf("Order %v, owner %d", o, tbl.Owner(h))
		}
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

// benchTable returns a table of n ready replicas with one out of rotation
// (so that some picks are failovers) and 4096 key hashes.
func benchTable(b *testing.B, n int) (*Router[*testBackend], []uint64) {
	r := newTestRouter(b, RouterConfig{}, &recorder{quiet: true})
	r.SetReplicas("static", readyReplicas(n))
	r.SetHealthy("orders-001", false)
	return r, keyHashes(15, 4096)
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{3, 30, 300} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r, hashes := benchTable(b, n)
			b.ReportAllocs()
			sink := 0
			for i := 0; b.Loop(); i++ {
				s, _ := r.Table().Pick(hashes[i&4095])
				sink += s
			}
			_ = sink
		})
		b.Run(fmt.Sprintf("%d/parallel", n), func(b *testing.B) {
			r, hashes := benchTable(b, n)
			b.ReportAllocs()
			b.ResetTimer() // RunParallel does not reset it like b.Loop does
			b.RunParallel(func(pb *testing.PB) {
				sink, i := 0, 0
				for pb.Next() {
					s, _ := r.Table().Pick(hashes[i&4095])
					sink += s
					i++
				}
				_ = sink
			})
		})
	}
}

func BenchmarkCandidates(b *testing.B) {
	for _, n := range []int{3, 30, 300} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r, hashes := benchTable(b, n)
			b.ReportAllocs()
			sink := 0
			for i := 0; b.Loop(); i++ {
				sink += len(r.Table().Candidates(hashes[i&4095]))
			}
			_ = sink
		})
	}
}
