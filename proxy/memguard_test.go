package proxy

import (
	"runtime/debug"
	"testing"
	"time"
)

// TestMemGuardAsksForCollectionsAboveTheBound: while the live heap reads
// above max_heap_bytes the guard sheds, and asks the runtime for a
// collection (at most one per memCollectEvery), so that a reading left
// over from the last collection does not keep it shedding once the
// requests that filled the heap ended.
func TestMemGuardAsksForCollectionsAboveTheBound(t *testing.T) {
	var heap uint64 // what the metric reads
	asks := 0
	g := &memGuard{maxHeap: 100,
		read:    func() uint64 { return heap },
		collect: func(time.Time) { asks++ },
	}
	t0 := time.Unix(1000, 0)
	step := func(at time.Duration, reads uint64, wantOver bool, wantAsks int) {
		t.Helper()
		heap = reads
		g.sample(t0.Add(at))
		if g.over.Load() != wantOver || asks != wantAsks {
			t.Fatalf("at %s, heap %d: over %v after %d requests for a collection, want %v after %d",
				at, reads, g.over.Load(), asks, wantOver, wantAsks)
		}
	}
	step(0, 50, false, 0)                     // below: nothing asked
	step(20*time.Millisecond, 150, true, 1)   // above: shed, and ask for a collection
	step(40*time.Millisecond, 150, true, 1)   // above again within a second: no second request
	step(time.Second, 150, true, 1)           // 980ms since the request
	step(1020*time.Millisecond, 150, true, 2) // still above a second later: ask again
	step(1040*time.Millisecond, 40, false, 2) // the collection found the requests ended
	step(1060*time.Millisecond, 40, false, 2)
	if got := g.heap.Load(); got != 40 {
		t.Fatalf("heap gauge %d, want the last reading (40)", got)
	}
}

// TestMemLimitsCollect: a request for a collection lowers the runtime's
// memory limit until a collection completes, then restores the limit in
// force before; the parker's request and the guard's combine, the lower
// one applying.
func TestMemLimitsCollect(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	l := &memLimitState{}
	sink := make([][]byte, 0, 64)
	now := time.Now()
	l.collect(now)
	lowered := debug.SetMemoryLimit(-1)
	if lowered >= before {
		t.Fatalf("limit %d after a request for a collection, want below %d", lowered, before)
	}
	start := l.now().cycles
	// The runtime collects at its next allocations.
	deadline := time.Now().Add(5 * time.Second)
	for l.now().cycles == start && time.Now().Before(deadline) {
		sink = append(sink[:0], make([]byte, 64<<10))
		time.Sleep(time.Millisecond)
	}
	if l.now().cycles == start {
		t.Fatal("no collection within 5s under the lowered limit")
	}
	_ = sink
	l.tick(time.Now())
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("limit %d after the collection, want %d restored", got, before)
	}
	l.setPark(lowered + 1)
	l.collect(time.Now())
	if got := debug.SetMemoryLimit(-1); got > lowered+1 {
		t.Fatalf("limit %d with both requests, want the lower one", got)
	}
	l.tick(time.Now().Add(2 * memCollectWithin))
	l.setPark(0)
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("limit %d with no request, want %d restored", got, before)
	}
}
