package runstate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/membership"
)

// t0 is the wall-clock time tests start at.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// at returns the version of a write at wall-clock time t with counter n.
func at(t time.Time, n uint64) uint64 { return physical(t) + n }

// fakeClock is a wall clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// runtimeNet connects States in-process: messages queue until pump
// delivers them, and drop decides which are lost. Every State on it reads
// one wall clock, which starts at t0.
type runtimeNet struct {
	t     *testing.T
	clock *fakeClock
	mu    sync.Mutex
	nodes map[string]*State
	queue []runtimeMsg
	drop  func(m runtimeMsg) bool
	sent  int
}

type runtimeMsg struct {
	from, to string
	msg      []byte
	reliable bool
}

func newRuntimeNet(t *testing.T) *runtimeNet {
	return &runtimeNet{t: t, clock: newClock(t0), nodes: map[string]*State{}}
}

// add makes a State named name on the network (dir "" for none).
func (n *runtimeNet) add(name, dir string, onChange func(changed, all []Record)) *State {
	n.t.Helper()
	r, err := New(Options{Dir: dir, OnChange: onChange, Interval: time.Second, Now: n.clock.Now})
	if err != nil {
		n.t.Fatal(err)
	}
	n.join(name, r)
	return r
}

func (n *runtimeNet) join(name string, r *State) {
	r.self = func() string { return name }
	if r.origin == "" {
		r.origin = name
	}
	r.sendFn = func(to string, msg []byte, reliable bool) error {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.queue = append(n.queue, runtimeMsg{from: name, to: to, msg: msg, reliable: reliable})
		n.sent++
		return nil
	}
	r.proxies = func() []string {
		n.mu.Lock()
		defer n.mu.Unlock()
		var out []string
		for other := range n.nodes {
			if other != name {
				out = append(out, other)
			}
		}
		slices.Sort(out)
		return out
	}
	n.mu.Lock()
	n.nodes[name] = r
	n.mu.Unlock()
}

// addProcess makes a State on the network for one process (gossip
// node) of the proxy with this ID.
func (n *runtimeNet) addProcess(node, id string) *State {
	n.t.Helper()
	r, err := New(Options{Interval: time.Second, Now: n.clock.Now})
	if err != nil {
		n.t.Fatal(err)
	}
	r.origin = id
	n.join(node, r)
	return r
}

func (n *runtimeNet) leave(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, name)
}

// pump delivers queued messages until none is left (at most 1000).
func (n *runtimeNet) pump() {
	n.t.Helper()
	for i := 0; ; i++ {
		if i > 1000 {
			n.t.Fatal("runtime messages keep flowing: no convergence")
		}
		n.mu.Lock()
		if len(n.queue) == 0 {
			n.mu.Unlock()
			return
		}
		m := n.queue[0]
		n.queue = n.queue[1:]
		to := n.nodes[m.to]
		lost := n.drop != nil && n.drop(m)
		n.mu.Unlock()
		if to != nil && !lost {
			to.handle(m.from, m.msg)
		}
	}
}

// tick sends every node's digest once, then pumps.
func (n *runtimeNet) tick() {
	n.mu.Lock()
	var rs []*State
	for _, r := range n.nodes {
		rs = append(rs, r)
	}
	n.mu.Unlock()
	for _, r := range rs {
		r.sendDigests()
	}
	n.pump()
}

func ptr[T any](v T) *T { return &v }

// put is an update that writes rec whatever the current record.
func put(rec Record) func(Record, bool) (Record, error) {
	return func(Record, bool) (Record, error) { return rec, nil }
}

// putUnless writes rec unless the set has a record that is not deleted.
func putUnless(rec Record) func(Record, bool) (Record, error) {
	return func(cur Record, ok bool) (Record, error) {
		if ok && !cur.Deleted {
			return Record{}, os.ErrExist
		}
		return rec, nil
	}
}

func sameRecords(t *testing.T, rs ...*State) {
	t.Helper()
	want := rs[0].Digest()
	for i, r := range rs[1:] {
		if got := r.Digest(); got != want {
			t.Fatalf("runtime %d digest %q, runtime 0 %q:\n%+v\n%+v", i+1, got, want, r.Records(), rs[0].Records())
		}
	}
}

func TestRuntimeWriteReachesEveryProxy(t *testing.T) {
	net := newRuntimeNet(t)
	var mu sync.Mutex
	var seenB []string
	a := net.add("a", "", nil)
	b := net.add("b", "", func(changed, all []Record) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range changed {
			seenB = append(seenB, c.Set+":"+c.Action)
		}
	})
	c := net.add("c", "", nil)
	rec, err := a.Update(KindSet, "orders", put(Record{Stopped: ptr(true), Action: "stop", By: "ops", Via: "a"}))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Version != at(t0, 0) || rec.Origin != "a" || !rec.At.Equal(t0) {
		t.Fatalf("stored %+v", rec)
	}
	net.pump() // the push alone, no digest round
	sameRecords(t, a, b, c)
	got, ok := c.Get(KindSet, "orders")
	if !ok || got.Stopped == nil || !*got.Stopped || got.By != "ops" || got.Via != "a" {
		t.Fatalf("c has %+v %v", got, ok)
	}
	mu.Lock()
	seen := slices.Clone(seenB)
	mu.Unlock()
	if !slices.Equal(seen, []string{"orders:stop"}) {
		t.Fatalf("b's OnChange saw %v", seen)
	}
	// A later write from another proxy, within the same millisecond,
	// takes a higher version everywhere.
	if _, err := c.Update(KindSet, "orders", put(Record{Stopped: ptr(false), Action: "start"})); err != nil {
		t.Fatal(err)
	}
	net.pump()
	sameRecords(t, a, b, c)
	if got, _ := a.Get(KindSet, "orders"); got.Version != at(t0, 1) || *got.Stopped {
		t.Fatalf("a has %+v", got)
	}
}

func TestRuntimeConcurrentWritesConverge(t *testing.T) {
	net := newRuntimeNet(t)
	a := net.add("a", "", nil)
	b := net.add("b", "", nil)
	// Both write one version of one set (one millisecond) before hearing
	// of the other.
	if _, err := a.Update(KindSet, "orders", put(Record{Replicas: ptr(5), Action: "scale"})); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Update(KindSet, "orders", put(Record{Replicas: ptr(7), Action: "scale"})); err != nil {
		t.Fatal(err)
	}
	net.pump()
	sameRecords(t, a, b)
	got, _ := a.Get(KindSet, "orders")
	if got.Origin != "b" || *got.Replicas != 7 {
		t.Fatalf("winner %+v; want b's (equal versions: the higher origin wins)", got)
	}
	// The next write on a is above both.
	rec, _ := a.Update(KindSet, "orders", put(Record{Replicas: ptr(3), Action: "scale"}))
	if rec.Version != at(t0, 1) {
		t.Fatalf("next version %d, want %d", rec.Version, at(t0, 1))
	}
}

func TestRuntimeLateJoinerAndLostMessagesCatchUp(t *testing.T) {
	net := newRuntimeNet(t)
	a := net.add("a", "", nil)
	b := net.add("b", "", nil)
	for _, s := range []string{"orders", "users", "events"} {
		if _, err := a.Update(KindSet, s, put(Record{Spec: []byte(`{"name":"` + s + `"}`), Action: "create"})); err != nil {
			t.Fatal(err)
		}
	}
	// b loses every push; the digest round repairs it.
	net.drop = func(m runtimeMsg) bool {
		return m.to == "b" && membership.MessageKind(m.msg) == runtimeRecordsKind && !strings.Contains(string(m.msg), `"reply"`) && m.from == "a" && net.sent <= 6
	}
	net.pump()
	if b.Digest() == a.Digest() {
		t.Fatal("b got the pushes the test dropped")
	}
	net.drop = nil
	net.tick()
	sameRecords(t, a, b)

	// A proxy that starts later, with nothing, learns everything in one round.
	c := net.add("c", "", nil)
	if c.Synced() {
		t.Fatal("a new proxy is synced before hearing anyone")
	}
	net.tick()
	sameRecords(t, a, b, c)
	if !c.Synced() {
		t.Fatal("c not synced after a round")
	}
	// And one that holds a record the others lack sends it to them.
	d := net.add("d", "", nil)
	net.clock.Add(5 * time.Millisecond)
	if _, err := d.Update(KindSet, "late", put(Record{Deleted: true, Action: "delete"})); err != nil {
		t.Fatal(err)
	}
	net.mu.Lock()
	net.queue = nil // its push is lost
	net.mu.Unlock()
	net.tick()
	sameRecords(t, a, b, c, d)
	late := at(t0.Add(5*time.Millisecond), 0)
	if got, ok := a.Get(KindSet, "late"); !ok || !got.Deleted || got.Version != late {
		t.Fatalf("a has %+v %v", got, ok)
	}
	// The next write anywhere is above every version seen.
	if rec, _ := b.Update(KindSet, "orders", put(Record{Action: "clear"})); rec.Version != late+1 {
		t.Fatalf("version %d after seeing %d", rec.Version, late)
	}
}

func TestRuntimeTombstoneWinsOverAStaleCopy(t *testing.T) {
	net := newRuntimeNet(t)
	a := net.add("a", "", nil)
	b := net.add("b", "", nil)
	if _, err := a.Update(KindSet, "orders", put(Record{Spec: []byte(`{"name":"orders"}`), Action: "create"})); err != nil {
		t.Fatal(err)
	}
	net.pump()
	net.leave("b") // b is cut off while the set is deleted
	if _, err := a.Update(KindSet, "orders", put(Record{Deleted: true, Action: "delete"})); err != nil {
		t.Fatal(err)
	}
	net.pump()
	if got, _ := b.Get(KindSet, "orders"); got.Deleted {
		t.Fatal("b saw the delete while away")
	}
	net.join("b", b)
	net.tick()
	sameRecords(t, a, b)
	if got, _ := b.Get(KindSet, "orders"); !got.Deleted || got.Overrides() != true {
		t.Fatalf("b has %+v; the tombstone must win", got)
	}
}

func TestRuntimeStateDirSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	net := newRuntimeNet(t)
	a := net.add("a", dir, nil)
	if _, err := a.Update(KindSet, "orders", put(Record{Stopped: ptr(true), Action: "stop", By: "ops"})); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Update(KindSet, "users", put(Record{Spec: []byte(`{"name":"users"}`), Action: "create"})); err != nil {
		t.Fatal(err)
	}
	// Restarted with the clock stepped back a second: the records and the
	// clock come back from the file.
	again, err := New(Options{Dir: dir, Now: func() time.Time { return t0.Add(-time.Second) }})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(again.Records(), a.Records(), func(x, y Record) bool {
		return x.Set == y.Set && x.Version == y.Version && x.Origin == y.Origin && string(x.Spec) == string(y.Spec) && x.By == y.By
	}) {
		t.Fatalf("reloaded %+v, wrote %+v", again.Records(), a.Records())
	}
	if rec, _ := again.Update(KindSet, "orders", put(Record{Action: "clear"})); rec.Version != at(t0, 2) {
		t.Fatalf("version after a restart %d, want %d (the clock continues)", rec.Version, at(t0, 2))
	}
	// A damaged file is an error naming it, not an empty state.
	path := filepath.Join(dir, runtimeFileName)
	if err := os.WriteFile(path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("damaged state file: %v", err)
	}
	// No temporary files are left behind.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != runtimeFileName {
			t.Errorf("left in the state directory: %s", e.Name())
		}
	}
}

func TestRuntimeUpdateRefuses(t *testing.T) {
	net := newRuntimeNet(t)
	a := net.add("a", "", nil)
	if _, err := a.Update(KindSet, "orders", putUnless(Record{Spec: []byte(`{}`), Action: "create"})); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Update(KindSet, "orders", putUnless(Record{Spec: []byte(`{}`), Action: "create"})); err != os.ErrExist {
		t.Fatalf("second create: %v", err)
	}
	if got, _ := a.Get(KindSet, "orders"); got.Version != at(t0, 0) {
		t.Fatalf("a refused write changed the record: %+v", got)
	}
}

func TestRuntimeSyncedAfterWaitingAlone(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	r, err := New(Options{Interval: time.Second, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.started = now
	r.mu.Unlock()
	if r.Synced() {
		t.Fatal("synced at once")
	}
	mu.Lock()
	now = now.Add(3 * time.Second)
	mu.Unlock()
	if !r.Synced() {
		t.Fatal("not synced after 3 intervals alone")
	}
}

// A proxy's writes carry its fleet ID as origin, whichever process wrote
// them, while its messages name its gossip node (where peers reply). A
// node without an ID writes its node name.
func TestRuntimeOriginIsTheProxyID(t *testing.T) {
	cfg := membership.DefaultConfig()
	cfg.BindAddr = "127.0.0.1"
	for id, want := range map[string]string{"edge-a": "edge-a", "": ""} {
		n, err := membership.New(cfg, membership.Meta{Role: membership.RoleProxy, ID: id}, membership.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if want == "" {
			want = n.Name()
		}
		r, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		r.Attach(n)
		var sent []runtimeRecords
		r.proxies = func() []string { return []string{"peer.1"} }
		r.sendFn = func(to string, msg []byte, _ bool) error {
			var rr runtimeRecords
			if err := json.Unmarshal(msg, &rr); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, rr)
			return nil
		}
		rec, err := r.Update(KindSet, "orders", put(Record{Stopped: ptr(true), Action: "stop"}))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Origin != want {
			t.Fatalf("id %q: origin %q, want %q", id, rec.Origin, want)
		}
		if len(sent) != 1 || sent[0].Node != n.Name() || sent[0].Records[0].Origin != want {
			t.Fatalf("id %q: sent %+v; want one message from node %s with origin %s", id, sent, n.Name(), want)
		}
	}
}

// The two processes of one proxy (a binary upgrade: one ID, one host
// clock) may write one set at one version (within one millisecond) before
// either hears the other: the later write wins everywhere, and a digest
// that tells the two apart makes them converge even when the pushes are
// lost.
func TestRuntimeTwoProcessesOfOneProxyConverge(t *testing.T) {
	net := newRuntimeNet(t)
	c := net.add("c", "", nil)
	old := net.addProcess("b.1", "edge-b")
	upgraded := net.addProcess("b.2", "edge-b")
	old.now = func() time.Time { return t0 }
	upgraded.now = func() time.Time { return t0.Add(500 * time.Microsecond) }
	net.drop = func(runtimeMsg) bool { return true }
	if _, err := upgraded.Update(KindSet, "orders", put(Record{Replicas: ptr(7), Action: "scale"})); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Update(KindSet, "orders", put(Record{Replicas: ptr(5), Action: "scale"})); err != nil {
		t.Fatal(err)
	}
	net.pump()
	if o, u := old.Records()[0], upgraded.Records()[0]; o.Version != u.Version {
		t.Fatalf("versions %d and %d; the test wants one", o.Version, u.Version)
	}
	if old.Digest() == upgraded.Digest() {
		t.Fatal("two records of one version and origin but different times have one digest: the processes would never compare them")
	}
	net.drop = nil
	for range 3 {
		net.tick()
	}
	sameRecords(t, c, old, upgraded)
	for name, r := range map[string]*State{"c": c, "b.1": old, "b.2": upgraded} {
		if got, _ := r.Get(KindSet, "orders"); got.Origin != "edge-b" || *got.Replicas != 7 || !got.At.Equal(t0.Add(500*time.Microsecond)) {
			t.Fatalf("%s holds %+v; want the later write (7 replicas)", name, got)
		}
	}
	a := Record{Version: 3, Origin: "edge-b", At: t0}
	b := a
	b.At = t0.Add(time.Nanosecond)
	if !b.Newer(a) || a.Newer(b) || a.Newer(a) {
		t.Fatal("Newer: of one version and origin, the later time must win, and a record is not newer than itself")
	}
}
