package balancer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// RouterConfig configures one replica set's Router.
type RouterConfig struct {
	// Set is the replica set's name.
	Set string
	// Hash fixes the ring's shape; see [HashConfig].
	Hash HashConfig
	// Failover decides where keys of an out-of-rotation owner go.
	Failover Failover
	// Candidates is how many in-rotation replicas are kept per partition
	// for retries, the first included. 0 means 3. Allowed 1..8.
	Candidates int
	// Coalesce is how long Run waits after a change before rebuilding, so
	// that a burst of changes costs one rebuild (50–100 ms is typical).
	// 0 rebuilds synchronously inside every setter call. With Coalesce > 0
	// changes are applied only by Run or Flush.
	Coalesce time.Duration
}

// Hooks connect a Router to the component that owns the per-replica
// payload. Each func may be nil. They are called by the Router's single
// writer, never concurrently, while it holds the Router's lock (inside a
// setter call when Coalesce is 0, else inside Run or Flush): they must be
// quick, must not block, and must not call back into the Router.
type Hooks[B any] struct {
	// NewBackend makes the payload of a ring member when it joins the ring
	// or its address changes.
	NewBackend func(Replica) B
	// Release is called for a payload once no newly published table refers
	// to it (the replica left the ring or changed address). Readers holding
	// an older table may still use it: close idle resources only.
	Release func(Replica, B)
	// Rebuilt is called after every published table.
	Rebuilt func(RebuildInfo)
}

// RebuildInfo describes one published table. A plain value; Joined and
// Left are sorted and belong to the receiver.
type RebuildInfo struct {
	Set        string        `json:"set"`
	Generation uint64        `json:"generation"`
	Cause      string        `json:"cause"`        // "replicas", "health" or both joined by '+'
	RingSize   int           `json:"ring_size"`    // replicas on the ring
	InRotation int           `json:"in_rotation"`  // replicas in rotation
	RingBuilt  bool          `json:"ring_rebuilt"` // ring membership changed
	Joined     []string      `json:"joined,omitempty"`
	Left       []string      `json:"left,omitempty"`
	Moved      int           `json:"moved_partitions"`    // partitions whose ring owner changed (all of them when the ring was or becomes empty)
	Diverted   int           `json:"diverted_partitions"` // partitions whose chosen replica (Pick) changed, by ring or by rotation
	Duration   time.Duration `json:"duration_ns"`
	// Fingerprint is the ring's shape (hash, partitions, load): with the
	// ring's member names it places every partition (PlanChange).
	Fingerprint string `json:"fingerprint"`
	// Failover is the set's failover at that moment: with the ring and
	// the replicas in rotation it says which replica took each partition.
	Failover Failover `json:"failover"`
}

// Router is the single writer of one replica set's routing tables. Inputs
// (replica lists per source, and proxy-local exclusions) may come from any
// goroutine; each change is folded into a new immutable [Table] that is
// swapped in atomically. Readers call [Router.Table] and never block.
//
// A Router is safe for concurrent use and must not be copied.
type Router[B any] struct {
	cfg      RouterConfig // guarded by mu after NewRouter (Reconfigure)
	coalesce time.Duration
	hooks    Hooks[B]

	table atomic.Pointer[Table[B]]
	rr    atomic.Uint64
	kick  chan struct{}

	mu             sync.Mutex // serializes writers; readers never take it
	sources        map[string][]Replica
	excluded       map[string]Reason
	everReady      map[string]bool
	backends       map[string]backendEntry[B]
	ring           *ring
	pendingMembers bool
	pendingHealth  bool
	forceRing      bool // the next rebuild builds the ring even if its members are the same
	renew          bool // the next rebuild replaces every backend
	generation     uint64
}

type backendEntry[B any] struct {
	r Replica
	b B
}

// ErrBadRouterConfig is returned by NewRouter for an invalid configuration.
var ErrBadRouterConfig = errors.New("balancer: bad router config")

// NewRouter returns a Router with an empty table (generation 1) published.
// It starts no goroutine: with Coalesce > 0 the caller runs [Router.Run].
func NewRouter[B any](cfg RouterConfig, hooks Hooks[B]) (*Router[B], error) {
	if err := checkRouterConfig(&cfg); err != nil {
		return nil, err
	}
	r := &Router[B]{
		cfg:       cfg,
		coalesce:  cfg.Coalesce,
		hooks:     hooks,
		kick:      make(chan struct{}, 1),
		sources:   map[string][]Replica{},
		excluded:  map[string]Reason{},
		everReady: map[string]bool{},
		backends:  map[string]backendEntry[B]{},
		ring:      buildRing(nil, cfg.Hash),
	}
	r.mu.Lock()
	r.rebuild("init")
	r.mu.Unlock()
	return r, nil
}

// Table returns the current snapshot: one atomic load, no lock, no
// allocation. Safe for concurrent use; never nil.
func (r *Router[B]) Table() *Table[B] { return r.table.Load() }

// Config returns the Router's configuration.
func (r *Router[B]) Config() RouterConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// Reconfigure changes the Router's Hash, Failover and Candidates (Set and
// Coalesce cannot change) and publishes a new table at once, with cause
// "config", keeping the replicas, exclusions and backends it has. A
// changed Hash rebuilds the ring: keys move as the new shape places them
// (every proxy of the set must make the same change). With renew, every
// backend is replaced (NewBackend for the new, Release for the old), for a
// change of what backends are made from. A pending coalesced change is
// applied in the same table. Safe for concurrent use.
func (r *Router[B]) Reconfigure(cfg RouterConfig, renew bool) error {
	if err := checkRouterConfig(&cfg); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cfg.Set != r.cfg.Set {
		return fmt.Errorf("%w: the set's name cannot change (%q, got %q)", ErrBadRouterConfig, r.cfg.Set, cfg.Set)
	}
	cfg.Coalesce = r.cfg.Coalesce
	if cfg.Hash != r.cfg.Hash {
		r.forceRing = true
	}
	r.renew = r.renew || renew
	r.cfg = cfg
	cause := "config"
	if pending := r.takePending(); pending != "" {
		cause += "+" + pending
	}
	r.rebuild(cause)
	return nil
}

// SetReplicas replaces the replicas of one source ("static", "gossip", ...).
// A replica enters the ring the first time it is seen ready and stays on it
// while any source lists it, whatever its state; it leaves the ring when no
// source lists it any more. The slice is copied. A list equal to the
// source's current one (same entries, same order) changes nothing and
// publishes no table, so producers may resend their full view freely.
// Safe for concurrent use.
func (r *Router[B]) SetReplicas(source string, rs []Replica) {
	cp := slices.Clone(rs)
	for i := range cp {
		if cp[i].Source == "" {
			cp[i].Source = source
		}
	}
	r.mu.Lock()
	if cur, ok := r.sources[source]; ok && slices.Equal(cur, cp) {
		r.mu.Unlock()
		return
	}
	r.sources[source] = cp
	r.pendingMembers = true
	r.changed()
	r.mu.Unlock()
}

// SetHealthy records an active health-check verdict for a replica
// (shorthand for SetExcluded with [ReasonProbe]). Safe for concurrent use.
func (r *Router[B]) SetHealthy(name string, healthy bool) {
	r.SetExcluded(name, ReasonProbe, !healthy)
}

// SetExcluded adds or clears one proxy-local reason holding a replica out of
// rotation. It never changes the ring. Reasons for names the Router does
// not know yet are kept: the producer (a health checker) clears what it set.
// A call that changes nothing publishes nothing. Safe for concurrent use.
//
// Taking a replica out applies at once, without waiting for the coalescing
// window: traffic must leave a failing replica now, and a rotation-only
// rebuild is cheap (the ring is shared). Bringing it back is coalesced.
func (r *Router[B]) SetExcluded(name string, reason Reason, excluded bool) {
	r.mu.Lock()
	old := r.excluded[name]
	v := old &^ reason
	if excluded {
		v |= reason
	}
	if v != old {
		if v == 0 {
			delete(r.excluded, name)
		} else {
			r.excluded[name] = v
		}
		r.pendingHealth = true
		if v&^old != 0 {
			r.flushLocked()
		} else {
			r.changed()
		}
	}
	r.mu.Unlock()
}

// changed schedules a rebuild; r.mu is held.
func (r *Router[B]) changed() {
	if r.coalesce <= 0 {
		r.flushLocked()
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Flush rebuilds now if any change is pending. Run calls it after each
// coalescing window; callers without Run (tests, startup) may call it
// directly. Safe for concurrent use.
func (r *Router[B]) Flush() {
	r.mu.Lock()
	r.flushLocked()
	r.mu.Unlock()
}

func (r *Router[B]) flushLocked() {
	if cause := r.takePending(); cause != "" {
		r.rebuild(cause)
	}
}

// takePending clears the pending changes and names them: "replicas",
// "health", "replicas+health", or "" for none. r.mu is held.
func (r *Router[B]) takePending() string {
	cause := ""
	switch {
	case r.pendingMembers && r.pendingHealth:
		cause = "replicas+health"
	case r.pendingMembers:
		cause = "replicas"
	case r.pendingHealth:
		cause = "health"
	}
	r.pendingMembers, r.pendingHealth = false, false
	return cause
}

// checkRouterConfig fills Candidates' default and validates cfg.
func checkRouterConfig(cfg *RouterConfig) error {
	if cfg.Candidates == 0 {
		cfg.Candidates = 3
	}
	if cfg.Candidates < 1 || cfg.Candidates > maxOrder {
		return fmt.Errorf("%w: candidates must be between 1 and %d, got %d", ErrBadRouterConfig, maxOrder, cfg.Candidates)
	}
	if err := cfg.Hash.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRouterConfig, err)
	}
	return nil
}

// Run applies coalesced changes until ctx is done, then returns nil. It is
// needed only when Coalesce > 0; call it once, from one goroutine. The
// window starts at the first change after a rebuild, so a change waits at
// most Coalesce (plus the rebuild) and a burst costs one rebuild. A change
// still pending when ctx ends is not applied (call Flush to force it).
func (r *Router[B]) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		}
		t := time.NewTimer(r.coalesce)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		r.Flush()
	}
}

// rebuild computes and publishes a new table; r.mu is held.
func (r *Router[B]) rebuild(cause string) {
	start := time.Now()
	old := r.table.Load()

	// Merge the sources: one entry per name. On a conflict a ready entry
	// wins, then the source that sorts first, so every proxy agrees.
	merged := make(map[string]Replica, len(r.backends)+1)
	for _, src := range slices.Sorted(maps.Keys(r.sources)) {
		for _, rep := range r.sources[src] {
			if rep.Name == "" {
				continue
			}
			if cur, ok := merged[rep.Name]; ok && (cur.routable() || !rep.routable()) {
				continue
			}
			merged[rep.Name] = rep
		}
	}
	for name := range r.everReady {
		if _, ok := merged[name]; !ok {
			delete(r.everReady, name)
		}
	}
	var ringNames []string
	for name, rep := range merged {
		if rep.State == StateReady && !rep.Down {
			r.everReady[name] = true
		}
		if r.everReady[name] {
			ringNames = append(ringNames, name)
		}
	}
	slices.Sort(ringNames)
	if len(ringNames) > maxRingMembers {
		ringNames = ringNames[:maxRingMembers]
	}

	info := RebuildInfo{Set: r.cfg.Set, Cause: cause, Fingerprint: r.cfg.Hash.Fingerprint(), Failover: r.cfg.Failover}
	oldRing := r.ring
	if r.forceRing || !slices.Equal(ringNames, oldRing.names) {
		r.forceRing = false
		r.ring = buildRing(ringNames, r.cfg.Hash)
		info.RingBuilt = true
		info.Joined, info.Left = diffSorted(oldRing.names, ringNames)
		info.Moved = movedOwners(oldRing, r.ring)
	}
	rg := r.ring

	t := &Table[B]{
		set:        r.cfg.Set,
		failover:   r.cfg.Failover,
		hash:       r.cfg.Hash,
		ring:       rg,
		replicas:   make([]Replica, len(rg.names)),
		backends:   make([]B, len(rg.names)),
		inRotation: make([]bool, len(rg.names)),
		excluded:   make([]Reason, len(rg.names)),
		rr:         &r.rr,
	}
	var released []backendEntry[B]
	for slot, name := range rg.names {
		rep := merged[name]
		t.replicas[slot] = rep
		t.excluded[slot] = r.excluded[name]
		t.inRotation[slot] = rep.routable() && t.excluded[slot] == 0
		if t.inRotation[slot] {
			t.rotation = append(t.rotation, uint16(slot))
		}
		be, ok := r.backends[name]
		if !ok || be.r.Addr != rep.Addr || r.renew {
			if ok {
				released = append(released, be)
			}
			be = backendEntry[B]{r: rep}
			if r.hooks.NewBackend != nil {
				be.b = r.hooks.NewBackend(rep)
			}
			r.backends[name] = be
		}
		t.backends[slot] = be.b
	}
	for name, be := range r.backends {
		if _, ok := slices.BinarySearch(rg.names, name); !ok {
			released = append(released, be)
			delete(r.backends, name)
		}
	}
	r.renew = false
	t.buildCandidates(r.cfg.Candidates)
	t.digest = t.computeDigest()

	owned := make([]int, len(rg.names))
	for _, o := range rg.owner {
		owned[o]++
	}
	t.members = make([]Member, 0, len(merged))
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		m := Member{Replica: merged[name], Slot: -1, Excluded: r.excluded[name]}
		if slot, ok := slices.BinarySearch(rg.names, name); ok {
			m.Slot, m.InRotation, m.Partitions = slot, t.inRotation[slot], owned[slot]
		}
		t.members = append(t.members, m)
	}

	switch {
	case old == nil:
	case old.ring.parts != rg.parts:
		info.Diverted = rg.parts // every key maps to a new partition
	case old.ring == rg && old.c == t.c && t.c > 0:
		// Same ring, same slots: compare the chosen slots directly.
		for p := 0; p < rg.parts; p++ {
			if old.cand[p*t.c] != t.cand[p*t.c] {
				info.Diverted++
			}
		}
	default:
		for p := 0; p < rg.parts; p++ {
			if old.target(p) != t.target(p) {
				info.Diverted++
			}
		}
	}
	r.generation++
	t.generation = r.generation
	r.table.Store(t)

	if r.hooks.Release != nil {
		for _, be := range released {
			r.hooks.Release(be.r, be.b)
		}
	}
	info.Generation = t.generation
	info.RingSize = len(rg.names)
	info.InRotation = len(t.rotation)
	info.Duration = time.Since(start)
	if r.hooks.Rebuilt != nil && cause != "init" {
		r.hooks.Rebuilt(info)
	}
}

// diffSorted returns the names only in b (joined) and only in a (left).
func diffSorted(a, b []string) (joined, left []string) {
	for _, n := range b {
		if _, ok := slices.BinarySearch(a, n); !ok {
			joined = append(joined, n)
		}
	}
	for _, n := range a {
		if _, ok := slices.BinarySearch(b, n); !ok {
			left = append(left, n)
		}
	}
	return joined, left
}

// movedOwners counts partitions whose owner (by name) differs between rings.
func movedOwners(a, b *ring) int {
	if len(a.owner) == 0 {
		return len(b.owner)
	}
	if len(b.owner) == 0 {
		return len(a.owner)
	}
	if len(a.owner) != len(b.owner) {
		return len(b.owner) // a new partition count: every key maps anew
	}
	n := 0
	for p := range b.owner {
		if a.names[a.owner[p]] != b.names[b.owner[p]] {
			n++
		}
	}
	return n
}
