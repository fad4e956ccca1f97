package balancer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// testBackend is the payload the tests attach to ring members.
type testBackend struct {
	rep Replica
	id  int
}

// recorder implements Hooks and remembers every call (but with quiet set,
// only the count of rebuilds, so that benchmarks do not grow a slice).
type recorder struct {
	quiet    bool
	n        int
	mu       sync.Mutex
	next     int
	created  []*testBackend
	released []*testBackend
	infos    []RebuildInfo
}

func (rc *recorder) hooks() Hooks[*testBackend] {
	return Hooks[*testBackend]{
		NewBackend: func(r Replica) *testBackend {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			rc.next++
			b := &testBackend{rep: r, id: rc.next}
			if !rc.quiet {
				rc.created = append(rc.created, b)
			}
			return b
		},
		Release: func(r Replica, b *testBackend) {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			if r.Name != b.rep.Name || r.Addr != b.rep.Addr {
				panic(fmt.Sprintf("Release(%v) with the backend of %v", r, b.rep))
			}
			if !rc.quiet {
				rc.released = append(rc.released, b)
			}
		},
		Rebuilt: func(i RebuildInfo) {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			rc.n++
			if !rc.quiet {
				rc.infos = append(rc.infos, i)
			}
		},
	}
}

func (rc *recorder) last(t testing.TB) RebuildInfo {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.infos) == 0 {
		t.Fatal("no rebuild reported")
	}
	return rc.infos[len(rc.infos)-1]
}

func (rc *recorder) rebuilds() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.n
}

// newTestRouter builds a Router with default hash config when cfg.Hash is
// zero, and the recorder's hooks when rc is not nil.
func newTestRouter(t testing.TB, cfg RouterConfig, rc *recorder) *Router[*testBackend] {
	t.Helper()
	if cfg.Hash == (HashConfig{}) {
		cfg.Hash = DefaultHashConfig()
	}
	if cfg.Set == "" {
		cfg.Set = "orders"
	}
	var h Hooks[*testBackend]
	if rc != nil {
		h = rc.hooks()
	}
	r, err := NewRouter(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readyReplicas returns n ready replicas named like replicaNames.
func readyReplicas(n int) []Replica {
	out := make([]Replica, n)
	for i, name := range replicaNames(n) {
		out[i] = Replica{Name: name, Addr: fmt.Sprintf("10.0.%d.%d:8080", i/250, i%250+1), State: StateReady}
	}
	return out
}

// withState returns a copy of rs with one replica's state changed.
func withState(rs []Replica, name string, s State) []Replica {
	out := slices.Clone(rs)
	for i := range out {
		if out[i].Name == name {
			out[i].State = s
		}
	}
	return out
}

// targets returns the name Pick chooses for each hash ("" when none).
func targets[B any](t *Table[B], hashes []uint64) []string {
	out := make([]string, len(hashes))
	for i, h := range hashes {
		if s, ok := t.Pick(h); ok {
			out[i] = t.Replica(s).Name
		}
	}
	return out
}

// owners returns the ring owner's name for each hash.
func owners[B any](t *Table[B], hashes []uint64) []string {
	out := make([]string, len(hashes))
	for i, h := range hashes {
		out[i] = t.Replica(t.Owner(h)).Name
	}
	return out
}

func slotOf[B any](t *Table[B], name string) int {
	for s := range t.Len() {
		if t.Replica(s).Name == name {
			return s
		}
	}
	return -1
}

func memberOf[B any](t *Table[B], name string) (Member, bool) {
	for _, m := range t.Members() {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

func TestNewRouterConfig(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		modify func(*RouterConfig)
		err    bool
		cands  int
	}{
		"defaults":              {func(*RouterConfig) {}, false, 3},
		"candidates 1":          {func(c *RouterConfig) { c.Candidates = 1 }, false, 1},
		"candidates 8":          {func(c *RouterConfig) { c.Candidates = 8 }, false, 8},
		"candidates 9":          {func(c *RouterConfig) { c.Candidates = 9 }, true, 0},
		"candidates negative":   {func(c *RouterConfig) { c.Candidates = -1 }, true, 0},
		"zero hash config":      {func(c *RouterConfig) { c.Hash = HashConfig{} }, true, 0},
		"load 1":                {func(c *RouterConfig) { c.Hash.Load = 1 }, true, 0},
		"too many partitions":   {func(c *RouterConfig) { c.Hash.Partitions = 70000 }, true, 0},
		"strict failover":       {func(c *RouterConfig) { c.Failover = FailoverStrict }, false, 3},
		"coalesce with no runs": {func(c *RouterConfig) { c.Coalesce = time.Millisecond }, false, 3},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := RouterConfig{Set: "orders", Hash: DefaultHashConfig()}
			tc.modify(&cfg)
			r, err := NewRouter(cfg, Hooks[int]{})
			if tc.err {
				if !errors.Is(err, ErrBadRouterConfig) {
					t.Fatalf("err = %v, want ErrBadRouterConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Config().Candidates; got != tc.cands {
				t.Fatalf("Candidates = %d, want %d", got, tc.cands)
			}
			tbl := r.Table()
			if tbl == nil || tbl.Generation() != 1 || tbl.Len() != 0 || tbl.Set() != "orders" {
				t.Fatalf("initial table %+v", tbl)
			}
			if _, ok := tbl.Pick(42); ok {
				t.Fatal("empty table picked a replica")
			}
		})
	}
}

// TestRouterSourcesMerge: sources are merged by name; on a conflict a
// ready entry wins, then the source that sorts first.
func TestRouterSourcesMerge(t *testing.T) {
	t.Parallel()
	rc := &recorder{}
	r := newTestRouter(t, RouterConfig{}, rc)
	r.SetReplicas("static", []Replica{
		{Name: "a", Addr: "10.0.0.1:80", State: StateReady},
		{Name: "b", Addr: "10.0.0.2:80", State: StateReady},
		{Name: "", Addr: "10.0.0.9:80", State: StateReady}, // nameless: ignored
	})
	r.SetReplicas("gossip", []Replica{
		{Name: "b", Addr: "10.0.1.2:80", State: StateReady, Source: "memberlist"},
		{Name: "c", Addr: "10.0.1.3:80", State: StateReady},
	})
	tbl := r.Table()
	if tbl.Len() != 3 || len(tbl.Members()) != 3 {
		t.Fatalf("ring %d, members %d, want 3 and 3", tbl.Len(), len(tbl.Members()))
	}
	want := map[string]struct{ addr, source string }{
		"a": {"10.0.0.1:80", "static"},
		"b": {"10.0.1.2:80", "memberlist"}, // both ready: "gossip" sorts before "static"; Source kept when set
		"c": {"10.0.1.3:80", "gossip"},
	}
	for _, m := range tbl.Members() {
		if w := want[m.Name]; m.Addr != w.addr || m.Source != w.source || !m.InRotation || m.Slot < 0 {
			t.Errorf("member %+v, want addr %s source %s in rotation", m, w.addr, w.source)
		}
	}

	// A ready entry beats a non-ready one from a source that sorts first.
	r.SetReplicas("gossip", []Replica{
		{Name: "b", Addr: "10.0.1.2:80", State: StateStarting},
		{Name: "c", Addr: "10.0.1.3:80", State: StateReady},
	})
	if m, _ := memberOf(r.Table(), "b"); m.Addr != "10.0.0.2:80" || m.State != StateReady || !m.InRotation {
		t.Fatalf("b = %+v, want the ready static entry", m)
	}

	// Duplicates within one source: the first entry wins unless a later one is ready.
	r.SetReplicas("gossip", []Replica{
		{Name: "c", Addr: "10.0.1.3:80", State: StateReady},
		{Name: "c", Addr: "10.0.9.9:80", State: StateReady},
	})
	if m, _ := memberOf(r.Table(), "c"); m.Addr != "10.0.1.3:80" {
		t.Fatalf("c = %+v, want the first entry", m)
	}

	// A source that goes empty takes its replicas off the ring.
	r.SetReplicas("gossip", nil)
	tbl = r.Table()
	if tbl.Len() != 2 || slotOf(tbl, "c") != -1 {
		t.Fatalf("after gossip emptied: ring %d, c slot %d", tbl.Len(), slotOf(tbl, "c"))
	}
	if info := rc.last(t); !slices.Equal(info.Left, []string{"c"}) || !info.RingBuilt {
		t.Fatalf("rebuild info %+v, want c left", info)
	}
	// The caller's slice is copied.
	rs := readyReplicas(2)
	r.SetReplicas("other", rs)
	rs[0].Addr = "changed:1"
	if m, _ := memberOf(r.Table(), rs[0].Name); m.Addr == "changed:1" {
		t.Fatal("SetReplicas kept a reference to the caller's slice")
	}
}

// TestRouterLifecycle: a replica joins the ring the first time it is ready,
// stays on it (keeping its partitions) while recovering, draining,
// starting again, stopped or failed, and leaves when no source lists it.
func TestRouterLifecycle(t *testing.T) {
	t.Parallel()
	rc := &recorder{}
	r := newTestRouter(t, RouterConfig{}, rc)
	base := readyReplicas(3)
	newbie := Replica{Name: "orders-new", Addr: "10.0.9.1:8080", State: StateStarting}
	hashes := keyHashes(4, 10_000)

	r.SetReplicas("gossip", append(slices.Clone(base), newbie))
	tbl := r.Table()
	if tbl.Len() != 3 {
		t.Fatalf("ring size %d with a starting replica, want 3", tbl.Len())
	}
	if m, ok := memberOf(tbl, "orders-new"); !ok || m.Slot != -1 || m.InRotation || m.Partitions != 0 {
		t.Fatalf("starting member %+v (listed %v), want listed, off the ring", m, ok)
	}
	if len(rc.created) != 3 {
		t.Fatalf("%d backends made, want 3 (none for a replica off the ring)", len(rc.created))
	}

	newbie.State = StateReady
	r.SetReplicas("gossip", append(slices.Clone(base), newbie))
	info := rc.last(t)
	if !info.RingBuilt || !slices.Equal(info.Joined, []string{"orders-new"}) || len(info.Left) != 0 || info.RingSize != 4 || info.InRotation != 4 {
		t.Fatalf("join info %+v", info)
	}
	joined := r.Table()
	ownersJoined := owners(joined, hashes)
	m, _ := memberOf(joined, "orders-new")
	if m.Slot < 0 || !m.InRotation || m.Partitions == 0 {
		t.Fatalf("joined member %+v", m)
	}

	for _, st := range []State{StateRecovering, StateDraining, StateStarting, StateStopped, StateFailed, StateUnknown} {
		newbie.State = st
		r.SetReplicas("gossip", append(slices.Clone(base), newbie))
		tbl := r.Table()
		info := rc.last(t)
		if info.RingBuilt || info.Moved != 0 || info.RingSize != 4 || info.InRotation != 3 {
			t.Fatalf("%v: info %+v, want no ring rebuild, 3 of 4 in rotation", st, info)
		}
		if tbl.ring != joined.ring {
			t.Fatalf("%v: the ring was rebuilt", st)
		}
		if !slices.Equal(owners(tbl, hashes), ownersJoined) {
			t.Fatalf("%v: partitions moved", st)
		}
		if m, _ := memberOf(tbl, "orders-new"); m.InRotation || m.Slot < 0 || m.State != st {
			t.Fatalf("%v: member %+v", st, m)
		}
		if tbl.Backend(slotOf(tbl, "orders-new")) != joined.Backend(slotOf(joined, "orders-new")) {
			t.Fatalf("%v: backend replaced", st)
		}
	}

	// Gone from every source: off the ring, backend released.
	r.SetReplicas("gossip", base)
	info = rc.last(t)
	if !info.RingBuilt || !slices.Equal(info.Left, []string{"orders-new"}) || info.RingSize != 3 {
		t.Fatalf("leave info %+v", info)
	}
	if len(rc.released) != 1 || rc.released[0].rep.Name != "orders-new" {
		t.Fatalf("released %v, want the backend of orders-new", rc.released)
	}
	if _, ok := memberOf(r.Table(), "orders-new"); ok {
		t.Fatal("a removed replica is still listed")
	}

	// Back again, but starting: it must be ready once more to re-enter.
	newbie.State = StateStarting
	r.SetReplicas("gossip", append(slices.Clone(base), newbie))
	if r.Table().Len() != 3 {
		t.Fatal("a returning starting replica re-entered the ring before it was ready")
	}
	newbie.State = StateReady
	r.SetReplicas("gossip", append(slices.Clone(base), newbie))
	if !slices.Equal(owners(r.Table(), hashes), ownersJoined) {
		t.Fatal("a replica back under the same name did not get its partitions back")
	}
}

// TestRouterBackends: one backend per ring member, kept across rebuilds,
// replaced (and the old one released) when the address changes.
func TestRouterBackends(t *testing.T) {
	t.Parallel()
	rc := &recorder{}
	r := newTestRouter(t, RouterConfig{}, rc)
	rs := readyReplicas(3)
	r.SetReplicas("static", rs)
	first := r.Table()
	if len(rc.created) != 3 {
		t.Fatalf("%d backends made, want 3", len(rc.created))
	}
	for s := range first.Len() {
		if b := first.Backend(s); b == nil || b.rep.Name != first.Replica(s).Name {
			t.Fatalf("slot %d backend %+v", s, b)
		}
	}
	byName := func(t *Table[*testBackend], n string) *testBackend { return t.Backend(slotOf(t, n)) }

	// Health flaps and a new member keep the existing backends.
	r.SetHealthy("orders-001", false)
	r.SetHealthy("orders-001", true)
	r.SetReplicas("static", readyReplicas(4))
	cur := r.Table()
	for _, n := range replicaNames(3) {
		if byName(cur, n) != byName(first, n) {
			t.Fatalf("backend of %s replaced by a rebuild", n)
		}
	}
	if len(rc.created) != 4 || len(rc.released) != 0 {
		t.Fatalf("created %d released %d, want 4 and 0", len(rc.created), len(rc.released))
	}

	// Address change: a new backend, the old one released after the swap.
	moved := readyReplicas(4)
	moved[1].Addr = "10.9.9.9:8080"
	r.SetReplicas("static", moved)
	cur = r.Table()
	nb := byName(cur, "orders-001")
	if nb == byName(first, "orders-001") || nb.rep.Addr != "10.9.9.9:8080" {
		t.Fatalf("backend after address change %+v", nb.rep)
	}
	if len(rc.released) != 1 || rc.released[0] != byName(first, "orders-001") {
		t.Fatalf("released %v, want the old orders-001 backend", rc.released)
	}
	if info := rc.last(t); info.RingBuilt || info.Moved != 0 || info.Diverted != 0 {
		t.Fatalf("address change info %+v, want no ring change", info)
	}
	for s := range cur.Len() {
		if slices.Contains(rc.released, cur.Backend(s)) {
			t.Fatal("the published table refers to a released backend")
		}
	}

	// Nil hooks are fine: the payload is the zero value.
	r2 := newTestRouter(t, RouterConfig{}, nil)
	r2.SetReplicas("static", rs)
	if r2.Table().Backend(0) != nil {
		t.Fatal("backend without NewBackend is not the zero value")
	}
}

// TestRouterRebuildInfo walks a sequence of changes and checks what each
// rebuild reports.
func TestRouterRebuildInfo(t *testing.T) {
	t.Parallel()
	rc := &recorder{}
	r := newTestRouter(t, RouterConfig{Set: "orders"}, rc)
	p := DefaultHashConfig().Partitions
	gen := r.Table().Generation()

	type want struct {
		cause           string
		ringBuilt       bool
		joined, left    []string
		moved, diverted int // -1: only check against the tables
		ring, inRot     int
		divertedOwnsOf  string // diverted must equal this replica's partitions
	}
	owned := func(name string) int {
		m, _ := memberOf(r.Table(), name)
		return m.Partitions
	}
	steps := []struct {
		name string
		do   func()
		want want
	}{
		{"first replicas", func() { r.SetReplicas("static", readyReplicas(3)) },
			want{"replicas", true, replicaNames(3), nil, p, p, 3, 3, ""}},
		{"one unhealthy", func() { r.SetHealthy("orders-001", false) },
			want{"health", false, nil, nil, 0, -1, 3, 2, "orders-001"}},
		{"one more reason", func() { r.SetExcluded("orders-001", ReasonAdmin, true) },
			want{"health", false, nil, nil, 0, 0, 3, 2, ""}},
		{"first reason cleared", func() { r.SetHealthy("orders-001", true) },
			want{"health", false, nil, nil, 0, 0, 3, 2, ""}},
		{"back", func() { r.SetExcluded("orders-001", ReasonAdmin, false) },
			want{"health", false, nil, nil, 0, -1, 3, 3, "orders-001"}},
		{"scale to 4", func() { r.SetReplicas("static", readyReplicas(4)) },
			want{"replicas", true, []string{"orders-003"}, nil, -1, -1, 4, 4, ""}},
		{"swap one", func() {
			rs := readyReplicas(4)
			rs[0].Name = "orders-zzz"
			r.SetReplicas("static", rs)
		}, want{"replicas", true, []string{"orders-zzz"}, []string{"orders-000"}, -1, -1, 4, 4, ""}},
		{"all gone", func() { r.SetReplicas("static", nil) },
			want{"replicas", true, nil, []string{"orders-001", "orders-002", "orders-003", "orders-zzz"}, p, p, 0, 0, ""}},
	}
	for _, st := range steps {
		if st.name == "scale to 4" {
			// The same list again, and a reordered one: the first is a no-op,
			// the second rebuilds the table but not the ring.
			n := rc.rebuilds()
			r.SetReplicas("static", readyReplicas(3))
			if rc.rebuilds() != n {
				t.Fatal("an unchanged replica list published a table")
			}
			rev := readyReplicas(3)
			slices.Reverse(rev)
			r.SetReplicas("static", rev)
			gen++
			if info := rc.last(t); rc.rebuilds() != n+1 || info.RingBuilt || info.Moved != 0 || info.Diverted != 0 {
				t.Fatalf("reordered list: %+v", info)
			}
		}
		before := r.Table()
		divertedBy := 0
		if st.want.divertedOwnsOf != "" {
			divertedBy = owned(st.want.divertedOwnsOf)
		}
		n := rc.rebuilds()
		st.do()
		if rc.rebuilds() != n+1 {
			t.Fatalf("%s: %d rebuilds reported, want 1", st.name, rc.rebuilds()-n)
		}
		info := rc.last(t)
		gen++
		w := st.want
		if info.Set != "orders" || info.Generation != gen || r.Table().Generation() != gen || info.Cause != w.cause ||
			info.RingBuilt != w.ringBuilt || !slices.Equal(info.Joined, w.joined) || !slices.Equal(info.Left, w.left) ||
			info.RingSize != w.ring || info.InRotation != w.inRot || info.Duration <= 0 {
			t.Fatalf("%s: info %+v, want %+v generation %d", st.name, info, w, gen)
		}
		after := r.Table()
		if w.moved >= 0 && info.Moved != w.moved {
			t.Fatalf("%s: moved %d, want %d", st.name, info.Moved, w.moved)
		}
		if w.moved == -1 && info.Moved != changedParts(before, after, (*Table[*testBackend]).ownerName) {
			t.Fatalf("%s: moved %d, table says %d", st.name, info.Moved, changedParts(before, after, (*Table[*testBackend]).ownerName))
		}
		if got := changedParts(before, after, (*Table[*testBackend]).target); info.Diverted != got {
			t.Fatalf("%s: diverted %d, tables differ in %d partitions", st.name, info.Diverted, got)
		}
		if divertedBy > 0 && info.Diverted != divertedBy {
			t.Fatalf("%s: diverted %d, want the %d partitions %s owns", st.name, info.Diverted, divertedBy, w.divertedOwnsOf)
		}
		if w.diverted >= 0 && info.Diverted != w.diverted {
			t.Fatalf("%s: diverted %d, want %d", st.name, info.Diverted, w.diverted)
		}
		t.Logf("%s: %+v", st.name, info)
	}

	// A no-op SetExcluded, a repeated replica list and an empty Flush
	// publish nothing.
	n := rc.rebuilds()
	r.SetExcluded("orders-001", ReasonAdmin, false)
	r.SetReplicas("static", nil)
	r.Flush()
	if rc.rebuilds() != n || r.Table().Generation() != gen {
		t.Fatal("a no-op change published a table")
	}
}

// ownerName is the ring owner's name of a partition, or "".
func (t *Table[B]) ownerName(p int) string {
	if len(t.ring.owner) == 0 {
		return ""
	}
	return t.ring.names[t.ring.owner[p]]
}

func changedParts[B any](a, b *Table[B], f func(*Table[B], int) string) int {
	n := 0
	for p := range a.Partitions() {
		if f(a, p) != f(b, p) {
			n++
		}
	}
	return n
}

// TestRouterExclusionBeforeKnown: a reason set for a name the Router does
// not know yet holds it out once it appears.
func TestRouterExclusionBeforeKnown(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, RouterConfig{}, nil)
	r.SetExcluded("orders-002", ReasonRefused, true)
	r.SetReplicas("static", readyReplicas(3))
	tbl := r.Table()
	s := slotOf(tbl, "orders-002")
	if tbl.InRotation(s) || tbl.Excluded(s) != ReasonRefused {
		t.Fatalf("orders-002 in rotation %v, excluded %v", tbl.InRotation(s), tbl.Excluded(s))
	}
	if m, _ := memberOf(tbl, "orders-002"); m.Excluded != ReasonRefused || m.InRotation {
		t.Fatalf("member %+v", m)
	}
}

// TestRouterScale3to4 measures the partitions that change owner when a
// fourth replica joins three (ideal: a quarter).
func TestRouterScale3to4(t *testing.T) {
	t.Parallel()
	rc := &recorder{}
	r := newTestRouter(t, RouterConfig{}, rc)
	r.SetReplicas("static", readyReplicas(3))
	r.SetReplicas("static", readyReplicas(4))
	info := rc.last(t)
	frac := float64(info.Moved) / float64(DefaultHashConfig().Partitions)
	t.Logf("3→4 replicas: %d of %d partitions moved (%.1f%%, ideal 25%%), %d diverted", info.Moved, DefaultHashConfig().Partitions, 100*frac, info.Diverted)
	if frac < 0.15 || frac > 0.35 {
		t.Fatalf("3→4 moved %.1f%% of partitions, want 15–35%%", 100*frac)
	}
	if m, _ := memberOf(r.Table(), "orders-003"); m.Partitions != info.Moved {
		t.Fatalf("the new replica owns %d partitions, but %d moved: collateral moves", m.Partitions, info.Moved)
	}
}

// advance moves a synctest bubble's fake clock forward by d (it returns as
// soon as every goroutine in the bubble is blocked; no real time passes)
// and waits until the bubble is idle again.
func advance(d time.Duration) {
	<-time.After(d)
	synctest.Wait()
}

// TestRouterCoalesce: with Coalesce > 0 a burst of changes costs one
// rebuild, published when the window ends. synctest's fake clock makes
// the wait instant and exact.
func TestRouterCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window = 100 * time.Millisecond
		rc := &recorder{}
		r := newTestRouter(t, RouterConfig{Coalesce: window}, rc)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()

		gen := r.Table().Generation()
		for i := range 50 {
			r.SetReplicas("gossip", readyReplicas(7-i%7)) // ends with 7
		}
		synctest.Wait()
		if rc.rebuilds() != 0 || r.Table().Generation() != gen {
			t.Fatalf("rebuilt before the window ended: %d rebuilds", rc.rebuilds())
		}
		start := time.Now()
		advance(window - time.Nanosecond)
		if rc.rebuilds() != 0 {
			t.Fatal("rebuilt before the window ended")
		}
		advance(time.Nanosecond)
		if time.Since(start) != window {
			t.Fatalf("fake clock advanced %v", time.Since(start))
		}
		if rc.rebuilds() != 1 || r.Table().Generation() != gen+1 {
			t.Fatalf("%d rebuilds, generation %d, want 1 rebuild and generation %d", rc.rebuilds(), r.Table().Generation(), gen+1)
		}
		info := rc.last(t)
		if info.Cause != "replicas" || info.RingSize != 7 || info.InRotation != 7 {
			t.Fatalf("coalesced rebuild %+v, want the final state: 7 on the ring, 7 in rotation", info)
		}

		// Quiet: nothing more happens, however long we wait.
		advance(10 * window)
		if rc.rebuilds() != 1 {
			t.Fatalf("%d rebuilds while idle", rc.rebuilds())
		}

		// Taking a replica out does not wait for the window; it publishes
		// whatever else is pending with it.
		r.SetReplicas("gossip", readyReplicas(6))
		r.SetHealthy("orders-000", false)
		if rc.rebuilds() != 2 || rc.last(t).Cause != "replicas+health" || rc.last(t).InRotation != 5 {
			t.Fatalf("exclusion not applied at once: %d rebuilds, last %+v", rc.rebuilds(), rc.last(t))
		}
		// Bringing it back is coalesced like everything else.
		r.SetHealthy("orders-000", true)
		synctest.Wait()
		if rc.rebuilds() != 2 {
			t.Fatal("re-admission published before the window ended")
		}
		advance(window)
		if rc.rebuilds() != 3 || rc.last(t).Cause != "health" || rc.last(t).InRotation != 6 {
			t.Fatalf("%d rebuilds after the re-admission, last %+v", rc.rebuilds(), rc.last(t))
		}

		// Flush applies a pending change at once; Run then finds nothing to do.
		r.SetReplicas("gossip", readyReplicas(3))
		r.Flush()
		if rc.rebuilds() != 4 || r.Table().Len() != 3 {
			t.Fatalf("Flush did not rebuild: %d rebuilds", rc.rebuilds())
		}
		advance(window)
		if rc.rebuilds() != 4 {
			t.Fatalf("%d rebuilds, want 4 (nothing pending after Flush)", rc.rebuilds())
		}

		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run returned %v", err)
		}
	})
}

// TestRouterRunStopsInWindow: cancelling during a window returns promptly.
func TestRouterRunStopsInWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newTestRouter(t, RouterConfig{Coalesce: time.Second}, nil)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		r.SetReplicas("gossip", readyReplicas(2))
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if r.Table().Len() != 0 {
			t.Fatal("a cancelled window published its change")
		}
	})
}

// TestRouterConcurrentReaders runs readers against a writer flipping
// health and membership; meaningful under -race.
func TestRouterConcurrentReaders(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, RouterConfig{Hash: HashConfig{Partitions: 271, ReplicationFactor: 20, Load: 1.25}}, &recorder{})
	r.SetReplicas("static", readyReplicas(4))
	hashes := keyHashes(5, 256)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tbl := r.Table()
				s, ok := tbl.Pick(hashes[i%len(hashes)])
				if !ok || !tbl.InRotation(s) || tbl.Backend(s) == nil {
					panic(fmt.Sprintf("Pick = %d, %v", s, ok))
				}
				_ = tbl.Candidates(hashes[i%len(hashes)])
				_, _ = tbl.NextRoundRobin()
			}
		})
	}
	rng := rand.New(rand.NewPCG(6, 6))
	for i := range 200 {
		// At most one of the first three is out, and orders-000..002 always listed.
		r.SetHealthy(fmt.Sprintf("orders-%03d", i%3), i%2 == 0)
		r.SetReplicas("static", readyReplicas(3+rng.IntN(3)))
	}
	close(stop)
	wg.Wait()
}

func BenchmarkRebuildRing(b *testing.B) {
	for _, n := range []int{3, 30, 300} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := newTestRouter(b, RouterConfig{}, &recorder{quiet: true})
			small, big := readyReplicas(n), readyReplicas(n+1)
			r.SetReplicas("static", small)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					r.SetReplicas("static", big)
				} else {
					r.SetReplicas("static", small)
				}
			}
		})
	}
}

func BenchmarkRebuildRotation(b *testing.B) {
	for _, n := range []int{3, 30, 300} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := newTestRouter(b, RouterConfig{}, &recorder{quiet: true})
			r.SetReplicas("static", readyReplicas(n))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r.SetHealthy("orders-001", i%2 == 1)
			}
		})
	}
}
