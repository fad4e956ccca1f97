package health

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"keyway/balancer"
)

// call is one recorded Sink call.
type call struct {
	Set, Replica string
	Reason       balancer.Reason
	Excluded     bool
}

func (c call) String() string {
	return fmt.Sprintf("%s/%s %s=%v", c.Set, c.Replica, c.Reason, c.Excluded)
}

// recSink records Sink calls and keeps the resulting exclusions.
type recSink struct {
	mu    sync.Mutex
	calls []call
	excl  map[string]balancer.Reason // "set/replica" → reasons
	// inside, if non-nil, is checked on every call: a call while it
	// reports true fails the test (the Sink must not be called from inside
	// SetTargets).
	inside func() bool
	t      testing.TB
}

func newRecSink(t testing.TB) *recSink {
	return &recSink{excl: map[string]balancer.Reason{}, t: t}
}

func (s *recSink) SetExcluded(set, replica string, reason balancer.Reason, excluded bool) {
	if s.inside != nil && s.inside() {
		s.t.Errorf("Sink called from inside SetTargets: %s/%s %s=%v", set, replica, reason, excluded)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call{set, replica, reason, excluded})
	k := set + "/" + replica
	if excluded {
		s.excl[k] |= reason
	} else {
		s.excl[k] &^= reason
	}
}

// take returns the calls since the last take.
func (s *recSink) take() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	return c
}

func (s *recSink) reasons(set, replica string) balancer.Reason {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.excl[set+"/"+replica]
}

// clock is an injected clock for tests that call sweep directly.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock forward and returns the new time.
func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// events collects OnEvent calls.
type events struct {
	mu sync.Mutex
	ev []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ev = append(e.ev, ev)
}

func (e *events) take() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := e.ev
	e.ev = nil
	return ev
}

// kinds lists the kinds and replicas of events, e.g. "ejected a".
func kinds(ev []Event) []string {
	var out []string
	for _, e := range ev {
		out = append(out, e.Kind+" "+e.Replica)
	}
	return out
}

// fixture is a Checker with a recording sink, an injected clock and an
// event recorder.
type fixture struct {
	c     *Checker
	sink  *recSink
	clock *clock
	ev    *events
	reg   *prometheus.Registry
}

// passiveConfig is the default config with only passive checks and no
// supervision, for tests that look at one mechanism at a time.
func passiveConfig() Config {
	cfg := DefaultConfig()
	cfg.Supervision.MaxEjections = 0
	return cfg
}

func newFixture(t testing.TB, cfg Config) *fixture {
	t.Helper()
	f := &fixture{sink: newRecSink(t), clock: newClock(), ev: &events{}, reg: prometheus.NewPedanticRegistry()}
	c, err := NewChecker(cfg, f.sink, Options{
		Logger:     zaptest.NewLogger(t),
		Registerer: f.reg,
		Now:        f.clock.Now,
		OnEvent:    f.ev.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	return f
}

// targets makes targets named name... in set s at fake addresses.
func targets(s string, names ...string) []Target {
	var ts []Target
	for i, n := range names {
		ts = append(ts, Target{Set: s, Replica: n, Addr: fmt.Sprintf("10.0.0.%d:8080", i+1)})
	}
	return ts
}

// fail observes n counted failures (5xx) of a replica.
func (f *fixture) fail(set, replica string, n int) {
	for range n {
		f.c.Observe(set, replica, 503, nil, time.Millisecond)
	}
}

// sweepAfter advances the clock by d and sweeps.
func (f *fixture) sweepAfter(d time.Duration) time.Time {
	now := f.clock.Add(d)
	f.c.sweep(now)
	return now
}

func callsEqual(t *testing.T, got []call, want ...call) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("Sink calls:\n got %v\nwant %v", got, want)
	}
}
