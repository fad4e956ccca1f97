package balancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

type member string

func (m member) String() string { return string(m) }

type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// replicaNames returns n sorted ring names "orders-000", "orders-001", ...
func replicaNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("orders-%03d", i)
	}
	return out
}

// keyHashes returns n key hashes from a fixed-seed RNG.
func keyHashes(seed uint64, n int) []uint64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]uint64, n)
	for i := range out {
		out[i] = HashString("key-" + strconv.FormatUint(rng.Uint64(), 36))
	}
	return out
}

// ringOwner returns the owner name of a key hash on a ring.
func ringOwner(r *ring, h uint64) string {
	return r.names[r.owner[h%uint64(r.parts)]]
}

func TestAppendReplicaKeyMatchesConsistent(t *testing.T) {
	for _, name := range []string{"orders-0", "", "n1", "10.0.0.1:80", "ünï"} {
		for _, idx := range []int{0, 1, 9, 10, 99, 999} {
			got := appendReplicaKey(nil, name, idx)
			if want := consistent.DefaultReplicaKey(name, idx); string(got) != string(want) {
				t.Errorf("appendReplicaKey(%q, %d) = %q, want %q", name, idx, got, want)
			}
		}
	}
}

// TestBuildRingMatchesConsistent is the oracle for buildRing: its owners
// must be exactly those of consistent v1.1.0, the placement the ring
// fingerprint promises.
func TestBuildRingMatchesConsistent(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		names []string
		cfg   HashConfig
	}{
		"1 replica":                     {replicaNames(1), DefaultHashConfig()},
		"3 replicas":                    {replicaNames(3), DefaultHashConfig()},
		"10 replicas":                   {replicaNames(10), DefaultHashConfig()},
		"31 replicas":                   {replicaNames(31), DefaultHashConfig()},
		"P271 R20":                      {replicaNames(7), HashConfig{Partitions: 271, ReplicationFactor: 20, Load: 1.25}},
		"1 vnode each":                  {replicaNames(5), HashConfig{Partitions: 101, ReplicationFactor: 1, Load: 1.25}},
		"more members than partitions":  {replicaNames(10), HashConfig{Partitions: 7, ReplicationFactor: 3, Load: 1.25}},
		"tight load":                    {replicaNames(10), HashConfig{Partitions: 997, ReplicationFactor: 50, Load: 1.01}},
		"loose load":                    {replicaNames(10), HashConfig{Partitions: 997, ReplicationFactor: 50, Load: 10}},
		"names that collided in v0.10":  {[]string{"n1", "n11", "n2"}, HashConfig{Partitions: 271, ReplicationFactor: 20, Load: 1.25}},
		"one partition":                 {replicaNames(4), HashConfig{Partitions: 1, ReplicationFactor: 10, Load: 1.25}},
		"addresses as names (unsorted)": {[]string{"10.0.0.1:80", "10.0.0.1:808", "10.0.0.12:8080"}, DefaultHashConfig()},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			names := slices.Sorted(slices.Values(tc.names))
			r := buildRing(names, tc.cfg)
			members := make([]consistent.Member, len(names))
			for i, n := range names {
				members[i] = member(n)
			}
			c := consistent.New(members, consistent.Config{
				Hasher:            xxHasher{},
				PartitionCount:    tc.cfg.Partitions,
				ReplicationFactor: tc.cfg.ReplicationFactor,
				Load:              tc.cfg.Load,
				ReplicaKey:        consistent.DefaultReplicaKey,
			})
			diff := 0
			for p := range tc.cfg.Partitions {
				if got, want := r.names[r.owner[p]], c.GetPartitionOwner(p).String(); got != want {
					if diff < 5 {
						t.Errorf("partition %d: owner %s, consistent says %s", p, got, want)
					}
					diff++
				}
				if want := c.FindPartitionID(fmt.Appendf(nil, "k%d", p)); int(xxhash.Sum64String(fmt.Sprintf("k%d", p))%uint64(r.parts)) != want {
					t.Fatalf("partition of a key differs from consistent.FindPartitionID")
				}
			}
			if diff > 0 {
				t.Fatalf("%d of %d partitions differ from consistent v1.1.0", diff, tc.cfg.Partitions)
			}
		})
	}
}

// referenceOrder walks the virtual-node ring the slow, obvious way: all
// distinct members clockwise from partition p's position.
func referenceOrder(names []string, cfg HashConfig, p int) []string {
	type vn struct {
		h    uint64
		name string
	}
	var ring []vn
	for _, n := range names {
		for i := range cfg.ReplicationFactor {
			ring = append(ring, vn{xxhash.Sum64(consistent.DefaultReplicaKey(n, i)), n})
		}
	}
	slices.SortFunc(ring, func(a, b vn) int {
		if a.h < b.h {
			return -1
		} else if a.h > b.h {
			return 1
		}
		return 0
	})
	var bs [8]byte
	for i := range bs {
		bs[i] = byte(uint64(p) >> (8 * i))
	}
	ph := xxhash.Sum64(bs[:])
	start, _ := slices.BinarySearchFunc(ring, ph, func(v vn, h uint64) int {
		if v.h < h {
			return -1
		} else if v.h > h {
			return 1
		}
		return 0
	})
	var out []string
	for i := range ring {
		n := ring[(start+i)%len(ring)].name
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func TestRingOrder(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		n   int
		cfg HashConfig
	}{
		"3 replicas":  {3, HashConfig{Partitions: 271, ReplicationFactor: 20, Load: 1.25}},
		"12 replicas": {12, HashConfig{Partitions: 271, ReplicationFactor: 20, Load: 1.25}},
		"1 replica":   {1, HashConfig{Partitions: 31, ReplicationFactor: 5, Load: 1.25}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			names := replicaNames(tc.n)
			r := buildRing(names, tc.cfg)
			if want := min(tc.n, maxOrder); r.k != want {
				t.Fatalf("k = %d, want %d", r.k, want)
			}
			for p := range tc.cfg.Partitions {
				ord := r.order[p*r.k : (p+1)*r.k]
				if ord[0] != r.owner[p] {
					t.Fatalf("partition %d: order starts with %d, owner is %d", p, ord[0], r.owner[p])
				}
				ref := referenceOrder(names, tc.cfg, p)
				// The order is the owner, then the ring walk without it.
				want := append([]string{names[r.owner[p]]}, slices.DeleteFunc(ref, func(n string) bool { return n == names[r.owner[p]] })...)[:r.k]
				got := make([]string, len(ord))
				for i, s := range ord {
					got[i] = names[s]
				}
				if !slices.Equal(got, want) {
					t.Fatalf("partition %d: order %v, want %v", p, got, want)
				}
				// walkFirst with everybody in rotation is the owner; with the
				// whole precomputed order out it is the next one on the walk.
				ok := make([]bool, tc.n)
				for i := range ok {
					ok[i] = true
				}
				if s := r.walkFirst(p, ok); s != r.owner[p] {
					t.Fatalf("walkFirst all in = %d, want owner %d", s, r.owner[p])
				}
				for _, s := range ord {
					ok[s] = false
				}
				s := r.walkFirst(p, ok)
				if tc.n <= maxOrder {
					if s != noSlot {
						t.Fatalf("walkFirst with all out = %d, want noSlot", s)
					}
					continue
				}
				if got, want := names[s], ref[slices.IndexFunc(ref, func(n string) bool { return slices.Contains(names, n) && ok[slices.Index(names, n)] })]; got != want {
					t.Fatalf("partition %d: walkFirst = %s, want %s", p, got, want)
				}
			}
		})
	}
}

func TestRingEmpty(t *testing.T) {
	r := buildRing(nil, DefaultHashConfig())
	if r.k != 0 || len(r.owner) != 0 || len(r.names) != 0 {
		t.Fatalf("empty ring has k=%d owners=%d names=%d", r.k, len(r.owner), len(r.names))
	}
}

// TestRingBalance: keys per replica stay within the bounded-load factor.
func TestRingBalance(t *testing.T) {
	t.Parallel()
	hashes := keyHashes(1, 10_000)
	for _, n := range []int{3, 10} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			t.Parallel()
			cfg := DefaultHashConfig()
			r := buildRing(replicaNames(n), cfg)
			keys := map[string]int{}
			for _, h := range hashes {
				keys[ringOwner(r, h)]++
			}
			parts := make([]int, n)
			for _, o := range r.owner {
				parts[o]++
			}
			if len(keys) != n {
				t.Fatalf("keys landed on %d replicas, want %d", len(keys), n)
			}
			maxKeys := slices.Max(slices.Collect(func(yield func(int) bool) {
				for _, v := range keys {
					if !yield(v) {
						return
					}
				}
			}))
			keyRatio := float64(maxKeys) / (float64(len(hashes)) / float64(n))
			partRatio := float64(slices.Max(parts)) / (float64(cfg.Partitions) / float64(n))
			t.Logf("%d replicas: max/mean keys %.3f (10,000 keys), max/mean partitions %.3f", n, keyRatio, partRatio)
			if keyRatio > 1.25 {
				t.Errorf("max/mean keys per replica = %.3f, want <= 1.25", keyRatio)
			}
			if partRatio > cfg.Load {
				t.Errorf("max/mean partitions = %.3f, above the load bound %g", partRatio, cfg.Load)
			}
		})
	}
}

// movement compares the owners of hashes on two rings: the share of keys
// that moved, and the share that moved although neither the old owner was
// the leaver nor the new owner the joiner (collateral, caused only by the
// bounded load). Percentages.
func movement(a, b *ring, hashes []uint64, leaver, joiner string) (moved, collateral float64) {
	m, c := 0, 0
	for _, h := range hashes {
		x, y := ringOwner(a, h), ringOwner(b, h)
		if x != y {
			m++
			if x != leaver && y != joiner {
				c++
			}
		}
	}
	return 100 * float64(m) / float64(len(hashes)), 100 * float64(c) / float64(len(hashes))
}

// TestRingKeyMovement measures how many of 100,000 keys change owner when
// one replica joins 10 or one of 10 leaves.
//
// What can be promised: a removal moves the leaver's keys, a join moves the
// joiner's new keys, plus a little collateral from the bounded load. The
// leaver's (joiner's) share is at most Load × the mean (ideal), so a single
// change moves up to ~1.25 × ideal when it hits the most loaded replica
// (measured: 12.2% for removing orders-001). The 1.2 × ideal bound is
// asserted for the StatefulSet scaling steps (10→11 adds orders-010, 10→9
// removes orders-009) and for the mean over every possible change.
func TestRingKeyMovement(t *testing.T) {
	t.Parallel()
	hashes := keyHashes(2, 100_000)
	cfg := DefaultHashConfig()
	ten := replicaNames(10)
	base := buildRing(ten, cfg)
	const slack = 0.5 // percentage points of key-sampling noise

	t.Run("add", func(t *testing.T) {
		t.Parallel()
		ideal := 100.0 / 11
		sum := 0.0
		joiners := []string{"orders-010", "orders-011", "orders-new", "orders-a", "zeta"}
		for _, joiner := range joiners {
			r := buildRing(slices.Sorted(slices.Values(append(slices.Clone(ten), joiner))), cfg)
			moved, collateral := movement(base, r, hashes, "", joiner)
			sum += moved
			t.Logf("10→11 (+%s): %.2f%% of keys moved (ideal %.2f%%), collateral %.3f%%", joiner, moved, ideal, collateral)
			if moved > cfg.Load*ideal+slack {
				t.Errorf("adding %s moved %.2f%% of keys, above the load bound %.2f%%", joiner, moved, cfg.Load*ideal)
			}
			if joiner == "orders-010" && moved > 1.2*ideal {
				t.Errorf("scaling 10→11 moved %.2f%% of keys, want <= %.2f%% (1.2 × ideal)", moved, 1.2*ideal)
			}
			if collateral > slack {
				t.Errorf("adding %s: %.3f%% of keys moved elsewhere than to the new replica", joiner, collateral)
			}
		}
		mean := sum / float64(len(joiners))
		t.Logf("10→11 mean over %d joiners: %.2f%%", len(joiners), mean)
		if mean > 1.2*ideal {
			t.Errorf("mean movement on add %.2f%%, want <= %.2f%%", mean, 1.2*ideal)
		}
	})
	t.Run("remove", func(t *testing.T) {
		t.Parallel()
		ideal := 10.0
		sum, worst := 0.0, 0.0
		for _, leaver := range ten {
			r := buildRing(slices.DeleteFunc(slices.Clone(ten), func(n string) bool { return n == leaver }), cfg)
			moved, collateral := movement(base, r, hashes, leaver, "")
			sum, worst = sum+moved, max(worst, moved)
			t.Logf("10→9 (-%s): %.2f%% of keys moved (ideal %.0f%%), collateral %.3f%%", leaver, moved, ideal, collateral)
			if moved > cfg.Load*ideal+slack {
				t.Errorf("removing %s moved %.2f%% of keys, above the load bound %.2f%%", leaver, moved, cfg.Load*ideal)
			}
			if leaver == "orders-009" && moved > 1.2*ideal {
				t.Errorf("scaling 10→9 moved %.2f%% of keys, want <= %.2f%% (1.2 × ideal)", moved, 1.2*ideal)
			}
			if collateral > slack {
				t.Errorf("removing %s: %.3f%% of keys moved that were not its own", leaver, collateral)
			}
		}
		mean := sum / float64(len(ten))
		t.Logf("10→9 mean over all 10 removals: %.2f%%, worst %.2f%%", mean, worst)
		if mean > 1.2*ideal {
			t.Errorf("mean movement on remove %.2f%%, want <= %.2f%%", mean, 1.2*ideal)
		}
	})
}
