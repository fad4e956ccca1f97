package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	mu   sync.Mutex
	objs map[string][]byte
	down bool
	puts int
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
	return nil
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

// While the store is unreachable, segments are spooled and nothing is
// lost; once it is back they are uploaded in the order they were cut. One
// warning says so, not one per attempt.
func TestSinkSpoolsThroughAnOutage(t *testing.T) {
	store := &memStore{objs: map[string][]byte{}}
	s, logs, stop := startSink(t, testSinkConfig(), store)
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
	store.setDown(false)
	poll.Until(t, 10*time.Second, "the spool uploaded", func() bool { return s.Spooled() == 0 && len(store.lines("keyway", "orders")) == 200 })
	stop()
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
func TestSinkDropsWhenFull(t *testing.T) {
	store := &memStore{objs: map[string][]byte{}, down: true}
	cfg := testSinkConfig()
	cfg.SpoolBytes, cfg.Queue = 400, 4
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
