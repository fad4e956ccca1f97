//go:build !race

package health

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// Observe is on the request path: no allocation, whatever the outcome.
// (The race detector instruments atomics and allocates, hence !race.) The
// one call per run of failures that reaches the threshold ejects the
// replica and allocates (the Sink builds a routing table); the threshold
// is set out of reach so that AllocsPerRun's average, which rounds down,
// cannot hide an allocation in the counting itself.
func TestObserveAllocs(t *testing.T) {
	cfg := passiveConfig()
	cfg.Passive.ConsecutiveFailures = 10000
	f := newFixture(t, cfg)
	f.c.SetTargets("orders", targets("orders", "orders-0", "orders-1", "orders-2"))
	connect := &connectErr{syscall.ECONNREFUSED}
	wrapped := errors.Join(errors.New("attempt"), &net.OpError{Op: "read", Err: syscall.ECONNRESET})
	cases := map[string]func(){
		"success":         func() { f.c.Observe("orders", "orders-1", 200, nil, time.Millisecond) },
		"5xx":             func() { f.c.Observe("orders", "orders-1", 503, nil, time.Millisecond) },
		"connect":         func() { f.c.Observe("orders", "orders-1", 0, connect, time.Millisecond) },
		"timeout":         func() { f.c.Observe("orders", "orders-1", 0, context.DeadlineExceeded, time.Millisecond) },
		"reset, joined":   func() { f.c.Observe("orders", "orders-1", 0, wrapped, time.Millisecond) },
		"unknown replica": func() { f.c.Observe("orders", "orders-9", 503, nil, time.Millisecond) },
		"unknown set":     func() { f.c.Observe("events", "orders-1", 503, nil, time.Millisecond) },
		"success after 5xx": func() {
			f.c.Observe("orders", "orders-2", 500, nil, 0)
			f.c.Observe("orders", "orders-2", 200, nil, 0)
		},
	}
	for name, fn := range cases {
		if n := testing.AllocsPerRun(1000, fn); n != 0 {
			t.Errorf("Observe, %s: %v allocations per call, want 0", name, n)
		}
	}
}
