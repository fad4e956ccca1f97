package proxy

import (
	"testing"
	"time"
)

// TestMemGuardCollectsAboveTheBound: a heap reading above max_heap_bytes
// is checked after a forced collection (at most one per memCollectEvery),
// so that garbage the runtime has not collected yet neither starts the
// guard nor keeps it shedding.
func TestMemGuardCollectsAboveTheBound(t *testing.T) {
	var heap, live uint64 // what the metric reads, and what a collection leaves
	collections := 0
	g := &memGuard{maxHeap: 100,
		read:    func() uint64 { return heap },
		collect: func() { collections++; heap = live },
	}
	t0 := time.Unix(1000, 0)
	step := func(at time.Duration, reads, isLive uint64, wantOver bool, wantCollections int) {
		t.Helper()
		heap, live = reads, isLive
		g.sample(t0.Add(at))
		if g.over.Load() != wantOver || collections != wantCollections {
			t.Fatalf("at %s, heap %d (live %d): over %v after %d collections, want %v after %d",
				at, reads, isLive, g.over.Load(), collections, wantOver, wantCollections)
		}
	}
	step(0, 50, 50, false, 0)                      // below: no collection
	step(20*time.Millisecond, 150, 50, false, 1)   // garbage above the bound: collected, not over
	step(40*time.Millisecond, 150, 150, true, 1)   // above again within a second: no second collection
	step(time.Second, 150, 150, true, 1)           // 980ms since the collection
	step(1020*time.Millisecond, 150, 150, true, 2) // live above the bound: over after a collection
	step(2020*time.Millisecond, 150, 40, false, 3) // the requests ended: the next collection ends it
	if got := g.heap.Load(); got != 40 {
		t.Fatalf("heap gauge %d, want the reading after the collection (40)", got)
	}
}
