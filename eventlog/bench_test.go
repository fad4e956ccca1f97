package eventlog

import (
	"context"
	"testing"
	"time"
)

// BenchmarkEmit measures Emit, the call on the routing side: memory only,
// with the writer running (files in a temp dir), and with the queue full
// (every event dropped). Fields are built once: callers pay for their own
// map.
func BenchmarkEmit(b *testing.B) {
	fields := map[string]any{"reason": "5xx", "consecutive": 5, "backoff": 30 * time.Second}
	ev := Event{Kind: KindEjected, Set: "orders", Replica: "orders-1", Fields: fields}
	for _, bc := range []struct {
		name string
		dir  bool
		run  bool
	}{
		{name: "memory_only"},
		{name: "writer_running", dir: true, run: true},
		{name: "queue_full", dir: true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.MaxFileBytes = 4 << 20
			cfg.Retain = 2
			if bc.dir {
				cfg.Dir = b.TempDir()
			}
			l, err := New(cfg, "bench", Options{})
			if err != nil {
				b.Fatal(err)
			}
			if bc.run {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error)
				go func() { done <- l.Run(ctx) }()
				defer func() { cancel(); <-done }()
			} else if bc.dir {
				for range cfg.Buffer {
					l.Emit(ev)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				l.Emit(ev)
			}
		})
	}
}
