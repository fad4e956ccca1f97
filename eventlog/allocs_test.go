//go:build !race

package eventlog

import (
	"testing"
	"time"
)

// Emit allocates nothing of its own, queued or dropped: the caller's
// Fields map is the only allocation an event costs.
func TestEmitNoAllocs(t *testing.T) {
	fields := map[string]any{"reason": "5xx"}
	for name, buffer := range map[string]int{"queued": 100000, "dropped": 1} {
		t.Run(name, func(t *testing.T) {
			cfg := fileConfig(t)
			cfg.Buffer = buffer
			l, _ := newLog(t, cfg, Options{Now: time.Now})
			ev := Event{Kind: KindEjected, Set: "orders", Replica: "orders-1", Fields: fields}
			l.Emit(ev) // resolves the kind's counter once
			if n := testing.AllocsPerRun(1000, func() { l.Emit(ev) }); n != 0 {
				t.Errorf("Emit allocated %v times per call, want 0", n)
			}
		})
	}
}
