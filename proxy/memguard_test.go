package proxy

import (
	"runtime/debug"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/proxy/internal/wire"

	"go.uber.org/zap/zaptest"
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
	poll.Until(t, 5*time.Second, "a collection under the lowered limit", func() bool {
		sink = append(sink[:0], make([]byte, 64<<10))
		return l.now().cycles != start
	})
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

// TestMemLimitsForceWhenNothingAllocates: the runtime collects under a
// lowered limit only when something allocates; a guard whose request saw
// no collection within memForceAfter forces one, and its request then
// ends with the limit restored.
func TestMemLimitsForceWhenNothingAllocates(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	l := &memLimitState{}
	t0 := time.Now()
	l.collect(t0)
	start := l.now().cycles
	l.tick(t0.Add(memForceAfter / 2)) // not yet
	if l.forced {
		t.Fatal("forced a collection before memForceAfter")
	}
	l.tick(t0.Add(memForceAfter))
	if l.now().cycles == start {
		t.Fatal("no collection after memForceAfter")
	}
	l.tick(t0.Add(memForceAfter + memSample))
	if l.guard != 0 {
		t.Fatal("the request did not end after the collection")
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("limit %d after the request ended, want %d restored", got, before)
	}
}

// TestReclaimForcesWhenNothingAllocates: a reclaim after a burst of
// parking whose lowered limit brought no collection within reclaimIdle
// forces the two collections fasthttp's pools need, releases, and ends
// with the limit restored.
func TestReclaimForcesWhenNothingAllocates(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	r := memReclaim{log: zaptest.NewLogger(t)}
	t0 := time.Now()
	r.step(t0, true, wire.ReclaimMin)
	if r.phase != 1 {
		t.Fatalf("phase %d after a burst, want 1 (collect)", r.phase)
	}
	start := r.cycles
	r.step(t0.Add(reclaimIdle), false, 0)
	if got := memLimits.now().cycles; got < start+2 {
		t.Fatalf("%d collections after reclaimIdle, want 2", got-start)
	}
	now := t0.Add(reclaimIdle)
	for i := 0; r.phase != 0 && i < 200; i++ {
		now = now.Add(wire.ReclaimPoll)
		r.step(now, false, 0)
	}
	if r.phase != 0 {
		t.Fatalf("the reclaim did not end (phase %d)", r.phase)
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("limit %d after the reclaim, want %d restored", got, before)
	}
}
