package eventlog

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
)

// deadline bounds every wait of these tests: reaching it is a failure,
// never a pass.
const deadline = 5 * time.Second

// t0 is the fake clock's start.
var t0 = time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC)

// clock is a manual clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: t0} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newLog returns a Log on a fresh pedantic registry, logging to t, with a
// manual clock unless opts has one.
func newLog(t *testing.T, cfg Config, opts Options) (*Log, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if opts.Registerer == nil {
		opts.Registerer = reg
	}
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	if opts.Now == nil {
		opts.Now = newClock().Now
	}
	l, err := New(cfg, "proxy-1", opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l, reg
}

// fileConfig returns the default config writing under a new temp dir.
func fileConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	return cfg
}

// start runs l.Run in a goroutine and returns a stop function that
// cancels it and waits for it to return (also called at cleanup).
func start(t *testing.T, l *Log) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(deadline):
				t.Errorf("Run did not return within %s of cancel", deadline)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// flush calls l.Flush with the test deadline.
func flush(t *testing.T, l *Log) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	err := l.Flush(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Flush did not return within %s", deadline)
	}
	return err
}

// within runs f in a goroutine and fails the test if it has not returned
// by the deadline.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(deadline):
		t.Fatalf("%s did not return within %s", what, deadline)
	}
}

// wait fails the test if c does not deliver by the deadline.
func wait[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(deadline):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func counter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// kinds returns the Kind of each event.
func kindsOf(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Kind
	}
	return out
}
