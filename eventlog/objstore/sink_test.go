package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"keyway/internal/poll"
)

// memStore keeps objects in memory; down makes Put fail.
type memStore struct {
	mu    sync.Mutex
	objs  map[string][]byte
	down  bool
	puts  int
	order []string // keys written, in order
}

func (m *memStore) Put(_ context.Context, key string, body []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.puts++
	if m.down {
		return errors.New("connection refused")
	}
	if _, ok := m.objs[key]; ok {
		return fmt.Errorf("%s written twice", key)
	}
	m.objs[key] = append([]byte(nil), body...)
	m.order = append(m.order, key)
	return nil
}

func (m *memStore) written() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.order)
}

func (m *memStore) setDown(v bool) {
	m.mu.Lock()
	m.down = v
	m.mu.Unlock()
}

// lines returns every stored line of set, in key order.
func (m *memStore) lines(prefix, set string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []string
	for k := range m.objs {
		if s, _, _, err := ParseKey(prefix, k); err == nil && s == set {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		out = append(out, strings.Split(strings.TrimSuffix(string(m.objs[k]), "\n"), "\n")...)
	}
	return out
}

func startSink(t *testing.T, cfg SinkConfig, store Store) (*Sink, *observer.ObservedLogs, func()) {
	core, logs := observer.New(zap.InfoLevel)
	s := NewSink(cfg, store, zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return s, logs, func() { cancel(); <-done }
}

func testSinkConfig() SinkConfig {
	cfg := DefaultSinkConfig()
	cfg.Prefix, cfg.Run, cfg.SegmentBytes, cfg.SegmentAge = "keyway", "r1", 200, 50*time.Millisecond
	return cfg
}

// Events of two sets and of none are uploaded as segments, each set's in
// order, none missing, none twice; the last ones on stop.
func TestSinkUploadsInOrder(t *testing.T) {
	store := &memStore{objs: map[string][]byte{}}
	s, _, stop := startSink(t, testSinkConfig(), store)
	want := map[string][]string{}
	for i := range 300 {
		set := []string{"orders", "users", ""}[i%3]
		// The sink numbers each set's events from 1, first in the object.
		want[set] = append(want[set], fmt.Sprintf(`{"seq":%d,"i":%d,"set":%q}`, len(want[set])+1, i, set))
		if !s.Write(set, []byte(fmt.Sprintf(`{"i":%d,"set":%q}`, i, set))) {
			t.Fatalf("event %d dropped", i)
		}
	}
	poll.Until(t, 10*time.Second, "every event uploaded", func() bool {
		return len(store.lines("keyway", "orders")) == 100 && len(store.lines("keyway", "users")) == 100 && len(store.lines("keyway", "")) == 100
	})
	// The last segment of a set is cut by age, not left open.
	s.Write("orders", []byte(`{}`))
	want["orders"] = append(want["orders"], `{"seq":101}`)
	stop()
	for set, w := range want {
		if got := store.lines("keyway", set); strings.Join(got, "\n") != strings.Join(w, "\n") {
			t.Fatalf("set %q: %d lines back, want %d in order", set, len(got), len(w))
		}
	}
	if s.Dropped() != 0 {
		t.Fatalf("%d dropped", s.Dropped())
	}
}

// The sink's two spools: in memory, and in a directory (audit.dir).
var spools = map[string]func(t *testing.T) string{
	"memory": func(*testing.T) string { return "" },
	"disk":   func(t *testing.T) string { return filepath.Join(t.TempDir(), "spool") },
}

// While the store is unreachable, segments are spooled and nothing is
// lost; once it is back they are uploaded in the order they were cut. One
// warning says so, not one per attempt. On disk, the spooled segments
// are files whose bytes are the spool's, removed once uploaded.
func TestSinkSpoolsThroughAnOutage(t *testing.T) {
	for name, spoolDir := range spools {
		t.Run(name, func(t *testing.T) { testSinkSpoolsThroughAnOutage(t, spoolDir(t)) })
	}
}

func testSinkSpoolsThroughAnOutage(t *testing.T, dir string) {
	store := &memStore{objs: map[string][]byte{}}
	cfg := testSinkConfig()
	cfg.SpoolDir = dir
	s, logs, stop := startSink(t, cfg, store)
	store.setDown(true)
	var want []string
	for i := range 200 {
		want = append(want, fmt.Sprintf(`{"seq":%d,"i":%d}`, i+1, i))
		s.Write("orders", []byte(fmt.Sprintf(`{"i":%d}`, i)))
	}
	poll.Until(t, 10*time.Second, "segments spooled and attempts failing", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return s.Spooled() > 0 && store.puts >= 2
	})
	if n := logs.FilterMessageSnippet("unreachable").Len(); n != 1 {
		t.Fatalf("%d unreachable warnings, want 1", n)
	}
	if dir != "" {
		poll.Until(t, 10*time.Second, "every event in a file", func() bool {
			_, size := spoolFiles(t, dir)
			return spoolEvents(t, dir) == 200 && int64(size) == s.Spooled()
		})
	}
	store.setDown(false)
	poll.Until(t, 10*time.Second, "the spool uploaded", func() bool { return s.Spooled() == 0 && len(store.lines("keyway", "orders")) == 200 })
	stop()
	if dir != "" {
		if names, _ := spoolFiles(t, dir); len(names) != 0 {
			t.Fatalf("uploaded segments left files: %v", names)
		}
	}
	if got := store.lines("keyway", "orders"); strings.Join(got, "\n") != strings.Join(want, "\n") || s.Dropped() != 0 {
		t.Fatalf("after the outage: %d lines, dropped %d", len(got), s.Dropped())
	}
	if logs.FilterMessageSnippet("the object store is back;").Len() != 1 {
		for _, e := range logs.All() {
			t.Log(e.Message)
		}
		t.Fatal("no message that the store is back")
	}
}

// A full spool drops segments (counted, logged), and Write never blocks.
// On disk, the files stay within the bound.
func TestSinkDropsWhenFull(t *testing.T) {
	for name, spoolDir := range spools {
		t.Run(name, func(t *testing.T) { testSinkDropsWhenFull(t, spoolDir(t)) })
	}
}

func testSinkDropsWhenFull(t *testing.T, dir string) {
	store := &memStore{objs: map[string][]byte{}, down: true}
	cfg := testSinkConfig()
	cfg.SpoolBytes, cfg.Queue, cfg.SpoolDir = 700, 4, dir
	s, logs, stop := startSink(t, cfg, store)
	big := bytes.Repeat([]byte("x"), 100)
	deadline := time.Now().Add(10 * time.Second)
	for s.Dropped() == 0 && time.Now().Before(deadline) {
		s.Write("orders", big) // never blocks, whatever the store does
	}
	poll.Until(t, 10*time.Second, "drops counted and logged", func() bool {
		return s.Dropped() > 0 && logs.FilterMessageSnippet("dropp").Len() > 0
	})
	stop()
	if dir != "" {
		if names, size := spoolFiles(t, dir); len(names) == 0 || size > cfg.SpoolBytes || int64(size) != s.Spooled() {
			t.Fatalf("spool files %v: %d bytes (spooled %d), bound %d", names, size, s.Spooled(), cfg.SpoolBytes)
		}
	}
}

func TestNumbered(t *testing.T) {
	seqs := map[string]uint64{}
	for _, c := range []struct{ set, in, want string }{
		{"a", `{"ts":"x"}`, `{"seq":1,"ts":"x"}`},
		{"a", `{}`, `{"seq":2}`},
		{"b", `{"k":1}`, `{"seq":1,"k":1}`},
		{"a", `not json`, `not json`},
	} {
		if got := string(numbered([]byte(c.in), &seqs, c.set)); got != c.want {
			t.Errorf("numbered(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}

// A sink started on the spool directory an earlier one left during an
// outage uploads the leftovers first, in the order they were cut and
// under their keys (the earlier run's), then its own; the files go.
func TestSinkUploadsLeftoversFirst(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	store := &memStore{objs: map[string][]byte{}, down: true}
	cfg := testSinkConfig()
	cfg.SpoolDir = dir
	s1, _, stop1 := startSink(t, cfg, store)
	want := map[string][]string{}
	write := func(s *Sink, from, to int) {
		for i := from; i < to; i++ {
			set := []string{"orders", ""}[i%2]
			want[set] = append(want[set], fmt.Sprintf(`{"seq":%d,"i":%d}`, len(want[set])%50+1, i))
			s.Write(set, []byte(fmt.Sprintf(`{"i":%d}`, i)))
		}
	}
	write(s1, 0, 100)
	poll.Until(t, 10*time.Second, "the first run's events spooled", func() bool { return s1.Spooled() > 0 })
	stop1() // the open segments go to the spool too
	if n := spoolEvents(t, dir); n != 100 || s1.Dropped() != 0 || s1.Uploaded() != 0 {
		t.Fatalf("after the first run: %d events in the spool, %d dropped, %d uploaded", n, s1.Dropped(), s1.Uploaded())
	}
	leftovers, _ := spoolFiles(t, dir)

	store.setDown(false)
	cfg.Run = "r2"
	s2, logs, stop2 := startSink(t, cfg, store)
	write(s2, 100, 200)
	poll.Until(t, 10*time.Second, "both runs uploaded", func() bool {
		return s2.Spooled() == 0 && len(store.lines("keyway", "orders")) == 100 && len(store.lines("keyway", "")) == 100
	})
	stop2()
	for set, w := range want {
		if got := store.lines("keyway", set); strings.Join(got, "\n") != strings.Join(w, "\n") {
			t.Fatalf("set %q:\n%s\nwant\n%s", set, strings.Join(got, "\n"), strings.Join(w, "\n"))
		}
	}
	// In the order of the files: the first run's, then the second's.
	keys := store.written()
	for i, k := range keys {
		_, run, _, err := ParseKey("keyway", k)
		if err != nil || (i < len(leftovers)) != (run == "r1") {
			t.Fatalf("upload %d: %s (%d leftovers): %v", i, k, len(leftovers), keys)
		}
	}
	if names, _ := spoolFiles(t, dir); len(names) != 0 || s2.Dropped() != 0 {
		t.Fatalf("left in the spool: %v; dropped %d", names, s2.Dropped())
	}
	if logs.FilterMessageSnippet("earlier run").Len() != 1 {
		t.Fatal("the leftovers were not logged")
	}
}

// Damaged leftovers do not stop the sink: a file cut short (and a
// temporary one) is skipped with one warning and removed; a body whose
// CRC fails is dropped when it is read, its events counted; the rest is
// uploaded.
func TestSinkSkipsDamagedLeftovers(t *testing.T) {
	dir := t.TempDir()
	d, _, _ := openTestSpool(t, dir, 1<<20)
	for i := range 4 {
		if err := d.put(&Segment{Key: Key("keyway", "orders", "r1", i+1), Events: 1, Body: []byte(fmt.Sprintf("{\"seq\":%d}\n", i+1))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ".000000000005.seg.42"), []byte(`{"v":1,"ke`), 0o644); err != nil {
		t.Fatal(err)
	}
	damage := func(name string, f func([]byte) []byte) {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	damage("000000000002.seg", func(b []byte) []byte { return b[:len(b)-3] })         // cut short
	damage("000000000003.seg", func(b []byte) []byte { b[len(b)-2] = '7'; return b }) // CRC fails
	store := &memStore{objs: map[string][]byte{}}
	cfg := testSinkConfig()
	cfg.SpoolDir = dir
	s, logs, stop := startSink(t, cfg, store)
	poll.Until(t, 10*time.Second, "the readable leftovers uploaded", func() bool { return s.Uploaded() == 2 && s.Spooled() == 0 })
	stop()
	if got := store.written(); !slices.Equal(got, []string{Key("keyway", "orders", "r1", 1), Key("keyway", "orders", "r1", 4)}) {
		t.Fatalf("uploaded %v", got)
	}
	if s.Dropped() != 1 {
		t.Fatalf("%d events dropped, want 1 (the damaged body's)", s.Dropped())
	}
	if n := logs.FilterMessageSnippet("unreadable files").Len(); n != 1 {
		t.Fatalf("%d warnings about unreadable files, want 1", n)
	}
	if logs.FilterMessageSnippet("could not be read back").Len() != 1 {
		t.Fatal("the damaged body was not logged")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left in the spool: %v", ents)
	}
}

// A spool directory that cannot be used is logged, and the sink spools in
// memory.
func TestSinkSpoolDirUnusable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	store := &memStore{objs: map[string][]byte{}}
	cfg := testSinkConfig()
	cfg.SpoolDir = filepath.Join(file, "spool")
	s, logs, stop := startSink(t, cfg, store)
	s.Write("orders", []byte(`{}`))
	poll.Until(t, 10*time.Second, "the event uploaded", func() bool { return len(store.lines("keyway", "orders")) == 1 })
	stop()
	if logs.FilterMessageSnippet("spooling in memory").Len() != 1 {
		t.Fatal("no warning about the spool directory")
	}
}
