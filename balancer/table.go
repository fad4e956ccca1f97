package balancer

import (
	"math/rand/v2"
	"sync/atomic"
)

// Member is a replica as a Table knows it: its advertised values plus the
// routing view of this proxy. A plain value: copy it freely.
type Member struct {
	Replica
	// Slot is the replica's index in the table's ring, or -1 when it is not
	// on the ring (never ready yet).
	Slot int `json:"slot"`
	// InRotation says whether the replica may receive new requests now.
	InRotation bool `json:"in_rotation"`
	// Excluded lists the proxy-local reasons holding it out, if any.
	Excluded Reason `json:"-"`
	// Partitions is the number of partitions the replica owns on the ring.
	Partitions int `json:"partitions"`
}

// Table is an immutable routing snapshot of one replica set. It is safe for
// concurrent use by any number of readers and must not be modified; slices
// and pointers it returns point into it and are read-only. Tables built for
// the same ring share their placement arrays "as is"; only the
// rotation-derived arrays are new. A Table stays valid (and keeps routing
// the way it did) for as long as a reader holds it, even after the Router
// published newer ones: load [Router.Table] once per request and use that
// one snapshot throughout.
//
// Tables come only from a [Router]; the zero Table is not usable. Methods
// taking a slot require 0 <= slot < [Table.Len] and panic otherwise.
//
// B is the per-replica payload the proxy attaches (its connection pool);
// the Router keeps one B per ring member across rebuilds, so the same B
// appears in every table while the replica stays on the ring at the same
// address.
type Table[B any] struct {
	set        string
	generation uint64
	failover   Failover
	hash       HashConfig
	ring       *ring
	replicas   []Replica // per slot
	backends   []B       // per slot
	inRotation []bool    // per slot
	excluded   []Reason  // per slot
	rotation   []uint16  // slots in rotation, ascending
	c          int       // candidates per partition
	cand       []uint16  // per partition c in-rotation slots, noSlot padded
	members    []Member  // every known replica, sorted by name
	digest     string    // computeDigest, set when the table is built
	rr         *atomic.Uint64
}

// Set returns the replica set's name.
func (t *Table[B]) Set() string { return t.set }

// Generation increases by one with every table the Router publishes; the
// initial empty table is generation 1.
func (t *Table[B]) Generation() uint64 { return t.generation }

// Partitions returns the fixed partition count.
func (t *Table[B]) Partitions() int { return t.hash.Partitions }

// Failover returns the policy the table was built with.
func (t *Table[B]) Failover() Failover { return t.failover }

// Fingerprint returns the ring-shape fingerprint ([HashConfig.Fingerprint]).
func (t *Table[B]) Fingerprint() string { return t.hash.Fingerprint() }

// Partition returns the partition of a key hash.
func (t *Table[B]) Partition(hash uint64) int { return int(hash % uint64(t.hash.Partitions)) }

// Pick returns the slot that should serve a key hash: its owner, or with
// [FailoverNext] the first in-rotation replica after it along the ring. ok
// is false when no replica may take the key (empty rotation, or
// [FailoverStrict] and the owner is out). O(1), lock-free, no allocation.
func (t *Table[B]) Pick(hash uint64) (slot int, ok bool) {
	if t.c == 0 {
		return -1, false
	}
	s := t.cand[int(hash%uint64(t.hash.Partitions))*t.c]
	if s == noSlot {
		return -1, false
	}
	return int(s), true
}

// Candidates returns the in-rotation slots for a key hash in the order
// they should be tried (Pick's slot first), distinct, at most the Router's
// configured candidate count; empty exactly when Pick's ok is false. With
// [FailoverStrict] it holds only the owner. The slice belongs to the
// table: do not modify it. O(1), no allocation.
func (t *Table[B]) Candidates(hash uint64) []uint16 {
	if t.c == 0 {
		return nil
	}
	p := int(hash%uint64(t.hash.Partitions)) * t.c
	c := t.cand[p : p+t.c]
	for i, s := range c {
		if s == noSlot {
			return c[:i]
		}
	}
	return c
}

// Owner returns the ring owner's slot of a key hash whether or not it is in
// rotation, or -1 when the ring is empty.
func (t *Table[B]) Owner(hash uint64) int {
	if len(t.ring.owner) == 0 {
		return -1
	}
	return int(t.ring.owner[hash%uint64(t.hash.Partitions)])
}

// Order returns up to 8 ring members for a key hash, owner first, in the
// order failover considers them, whether or not they are in rotation. It
// allocates; it is meant for explaining a decision, not for routing.
func (t *Table[B]) Order(hash uint64) []int {
	if t.ring.k == 0 {
		return nil
	}
	p := int(hash % uint64(t.hash.Partitions))
	out := make([]int, t.ring.k)
	for i, s := range t.ring.order[p*t.ring.k : (p+1)*t.ring.k] {
		out[i] = int(s)
	}
	return out
}

// Len returns the number of ring members (slots).
func (t *Table[B]) Len() int { return len(t.replicas) }

// Replica returns the replica in a slot. The pointer is into the table:
// read it, do not modify it.
func (t *Table[B]) Replica(slot int) *Replica { return &t.replicas[slot] }

// Backend returns the payload of a slot.
func (t *Table[B]) Backend(slot int) B { return t.backends[slot] }

// InRotation reports whether a slot may receive new requests.
func (t *Table[B]) InRotation(slot int) bool { return t.inRotation[slot] }

// Excluded returns the proxy-local reasons holding a slot out of rotation.
func (t *Table[B]) Excluded(slot int) Reason { return t.excluded[slot] }

// Rotation returns the slots in rotation, ascending. Do not modify it.
func (t *Table[B]) Rotation() []uint16 { return t.rotation }

// NextRoundRobin returns the next slot in rotation in a cycle shared by
// all tables of the Router (an atomic counter: safe for concurrent use, no
// allocation), or ok false when the rotation is empty.
func (t *Table[B]) NextRoundRobin() (slot int, ok bool) {
	if len(t.rotation) == 0 {
		return -1, false
	}
	return int(t.rotation[t.rr.Add(1)%uint64(len(t.rotation))]), true
}

// RandomSlot returns a uniformly random slot in rotation, or ok false when
// the rotation is empty. It uses math/rand/v2's global source: safe for
// concurrent use, no allocation.
func (t *Table[B]) RandomSlot() (slot int, ok bool) {
	if len(t.rotation) == 0 {
		return -1, false
	}
	return int(t.rotation[rand.Uint64N(uint64(len(t.rotation)))]), true
}

// Members returns every replica the Router knows, ring members or not,
// sorted by name. Do not modify it.
func (t *Table[B]) Members() []Member { return t.members }

// buildCandidates fills t.cand from the ring order and the rotation mask.
func (t *Table[B]) buildCandidates(want int) {
	r := t.ring
	if len(r.names) == 0 {
		t.c = 0
		return
	}
	t.c = min(want, len(r.names))
	t.cand = make([]uint16, r.parts*t.c)
	anyIn := len(t.rotation) > 0
	for p := 0; p < r.parts; p++ {
		dst := t.cand[p*t.c : (p+1)*t.c]
		n := 0
		if t.failover == FailoverStrict {
			if o := r.owner[p]; t.inRotation[o] {
				dst[0] = o
				n = 1
			}
		} else {
			for _, s := range r.order[p*r.k : (p+1)*r.k] {
				if t.inRotation[s] {
					dst[n] = s
					n++
					if n == t.c {
						break
					}
				}
			}
			if n == 0 && anyIn {
				dst[0] = r.walkFirst(p, t.inRotation)
				n = 1
			}
		}
		for i := n; i < t.c; i++ {
			dst[i] = noSlot
		}
	}
}

// target returns the name of the replica Pick chooses for a partition, or "".
func (t *Table[B]) target(p int) string {
	if t.c == 0 {
		return ""
	}
	if s := t.cand[p*t.c]; s != noSlot {
		return t.replicas[s].Name
	}
	return ""
}
