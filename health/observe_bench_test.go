package health

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkObserve measures the request path's cost of passive health:
// the steady state (successes), failures, and successes from all cores at
// once on 16 replicas. The threshold is the highest allowed, so failures
// are counted, not ejections made (one per 10000 failures here).
func BenchmarkObserve(b *testing.B) {
	cfg := passiveConfig()
	cfg.Passive.ConsecutiveFailures = 10000
	newChecker := func(b *testing.B) *Checker {
		c, err := NewChecker(cfg, newRecSink(b), Options{Registerer: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		var names []string
		for i := range 16 {
			names = append(names, fmt.Sprintf("orders-%d", i))
		}
		c.SetTargets("orders", targets("orders", names...))
		c.SetTargets("events", targets("events", names...))
		return c
	}
	b.Run("success", func(b *testing.B) {
		c := newChecker(b)
		b.ReportAllocs()
		for b.Loop() {
			c.Observe("orders", "orders-7", 200, nil, time.Millisecond)
		}
	})
	b.Run("5xx", func(b *testing.B) {
		c := newChecker(b)
		b.ReportAllocs()
		for b.Loop() {
			c.Observe("orders", "orders-7", 503, nil, time.Millisecond)
		}
	})
	b.Run("connect", func(b *testing.B) {
		c := newChecker(b)
		err := &connectErr{syscall.ECONNREFUSED}
		b.ReportAllocs()
		for b.Loop() {
			c.Observe("orders", "orders-7", 0, err, time.Millisecond)
		}
	})
	b.Run("success-parallel", func(b *testing.B) {
		c := newChecker(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				c.Observe("orders", names16[i&15], 200, nil, time.Millisecond)
				i++
			}
		})
	})
}

var names16 = func() []string {
	var n []string
	for i := range 16 {
		n = append(n, fmt.Sprintf("orders-%d", i))
	}
	return n
}()
