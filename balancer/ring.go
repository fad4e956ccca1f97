package balancer

import (
	"encoding/binary"
	"slices"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// maxOrder is how many replicas of each partition's ring order are kept:
// the owner and up to maxOrder-1 successors. Rarely, when all of them are
// out of rotation, the table walks the whole ring for that partition.
const maxOrder = 8

// noSlot marks an empty candidate position.
const noSlot = ^uint16(0)

// maxRingMembers keeps slot numbers below noSlot.
const maxRingMembers = 4096

// ring is the placement of one set of ring members: immutable once built,
// and shared by every Table built while the membership stays the same.
type ring struct {
	names []string // ring members, sorted; a name's index is its slot
	parts int
	owner []uint16 // per partition: the owning slot (bounded loads)
	k     int      // entries per partition in order
	order []uint16 // per partition k slots: owner first, then distinct successors along the virtual-node ring
	vhash []uint64 // the virtual-node ring, sorted
	vslot []uint16 // parallel to vhash
	phash []uint64 // per partition: its position on the ring
}

type member string

func (m member) String() string { return string(m) }

type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// buildRing places cfg.Partitions partitions on the sorted, deduplicated
// names. It is deterministic: the same names and config give the same ring
// in every process, whatever order the names arrived in.
func buildRing(names []string, cfg HashConfig) *ring {
	r := &ring{names: names, parts: cfg.Partitions}
	if len(names) == 0 {
		return r
	}
	members := make([]consistent.Member, len(names))
	for i, n := range names {
		members[i] = member(n)
	}
	c := consistent.New(members, consistent.Config{
		Hasher:            xxHasher{},
		PartitionCount:    cfg.Partitions,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
		ReplicaKey:        consistent.DefaultReplicaKey,
	})
	slot := make(map[string]uint16, len(names))
	for i, n := range names {
		slot[n] = uint16(i)
	}

	// The virtual-node ring, rebuilt here the way consistent builds it, so
	// that successors follow the same ring the owners were chosen on.
	type vnode struct {
		h uint64
		s uint16
	}
	vn := make([]vnode, 0, len(names)*cfg.ReplicationFactor)
	for i, n := range names {
		for j := 0; j < cfg.ReplicationFactor; j++ {
			vn = append(vn, vnode{xxhash.Sum64(consistent.DefaultReplicaKey(n, j)), uint16(i)})
		}
	}
	slices.SortFunc(vn, func(a, b vnode) int {
		if a.h != b.h {
			if a.h < b.h {
				return -1
			}
			return 1
		}
		return int(a.s) - int(b.s)
	})
	r.vhash = make([]uint64, len(vn))
	r.vslot = make([]uint16, len(vn))
	for i, v := range vn {
		r.vhash[i], r.vslot[i] = v.h, v.s
	}

	r.k = min(len(names), maxOrder)
	r.owner = make([]uint16, cfg.Partitions)
	r.order = make([]uint16, cfg.Partitions*r.k)
	r.phash = make([]uint64, cfg.Partitions)
	var bs [8]byte
	for p := 0; p < cfg.Partitions; p++ {
		o := slot[c.GetPartitionOwner(p).String()]
		r.owner[p] = o
		binary.LittleEndian.PutUint64(bs[:], uint64(p))
		r.phash[p] = xxhash.Sum64(bs[:])
		ord := r.order[p*r.k : (p+1)*r.k]
		ord[0] = o
		n := 1
		start := r.search(r.phash[p])
		for i := 0; i < len(r.vslot) && n < r.k; i++ {
			s := r.vslot[(start+i)%len(r.vslot)]
			if !slices.Contains(ord[:n], s) {
				ord[n] = s
				n++
			}
		}
	}
	return r
}

// search returns the first virtual node at or after h, wrapping around.
func (r *ring) search(h uint64) int {
	i, _ := slices.BinarySearch(r.vhash, h)
	if i >= len(r.vhash) {
		i = 0
	}
	return i
}

// walkFirst returns the first slot along partition p's ring walk (owner
// first) for which ok is true, or noSlot. It is the slow path behind the
// precomputed order, used only when every one of those is out of rotation.
func (r *ring) walkFirst(p int, ok []bool) uint16 {
	if ok[r.owner[p]] {
		return r.owner[p]
	}
	start := r.search(r.phash[p])
	for i := range r.vslot {
		if s := r.vslot[(start+i)%len(r.vslot)]; ok[s] {
			return s
		}
	}
	return noSlot
}
