package proxy

import (
	"context"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// memGuard is the global memory guard (server.max_heap_bytes,
// server.max_inflight_body_bytes). A goroutine samples the live heap every
// memSample into an atomic; the request path reads one flag and adds its
// body's size to one sum: no per-request reading of runtime metrics.
type memGuard struct {
	maxHeap uint64 // 0: off
	maxBody int64  // 0: off
	over    atomic.Bool
	heap    atomic.Uint64 // the last sample, bytes
	body    atomic.Int64  // request bodies held by requests in flight, bytes
	// read returns the live heap in bytes; tests inject it.
	read func() uint64
	// collect asks the runtime for a collection (memLimits.collect), at
	// most once per memCollectEvery, while the heap reads above the
	// bound; lastCollect is when it last asked (run's goroutine only).
	collect     func(now time.Time)
	lastCollect time.Time
}

const memSample = 20 * time.Millisecond

// memCollectEvery spaces the collections the guard forces while the heap
// reads above max_heap_bytes: one full GC a second at most, only then.
const memCollectEvery = time.Second

// heapMetric is the live heap as the last collection found it: what a
// request's buffers and bodies add to, without the garbage and free memory
// the runtime keeps. It is updated at the end of each collection; under
// load the heap's growth starts them often.
const heapMetric = "/gc/heap/live:bytes"

func newMemGuard(c ServerConfig) *memGuard {
	g := &memGuard{maxHeap: uint64(c.MaxHeapBytes), maxBody: int64(c.MaxInflightBodyBytes), collect: func(now time.Time) { memLimits.collect(now) }}
	s := []rtmetrics.Sample{{Name: heapMetric}}
	g.read = func() uint64 {
		rtmetrics.Read(s)
		if s[0].Value.Kind() != rtmetrics.KindUint64 {
			return 0
		}
		return s[0].Value.Uint64()
	}
	return g
}

// sample reads the heap once and sets the guard's flag; it reports whether
// the guard changed state.
//
// The live heap reads what the last collection found, and nothing starts
// one while a shedding proxy allocates little (the runtime forces one
// only every 2 minutes): the guard went on shedding every request for 4
// minutes after the requests that filled the heap had ended (pooled
// buffers need two collections). So above the bound the guard asks the
// runtime for a collection (memLimits.collect: the memory limit lowered
// until one completes), at most once per memCollectEvery, and decides on
// what the next samples read. The runtime collects concurrently, at its
// next allocation; only if none came within memForceAfter (nothing
// allocates) is one forced (runtime.GC).
func (g *memGuard) sample(now time.Time) (heap uint64, changed bool) {
	heap = g.read()
	if g.maxHeap > 0 && heap > g.maxHeap && now.Sub(g.lastCollect) >= memCollectEvery {
		g.collect(now)
		g.lastCollect = now
	}
	g.heap.Store(heap)
	over := g.maxHeap > 0 && heap > g.maxHeap
	return heap, g.over.Swap(over) != over
}

// run samples the heap until ctx ends, logging each change of state (at
// most one line per memSample, and a state lasts at least that long).
func (p *Proxy) runMemGuard(ctx context.Context) {
	g := p.mem
	if g.maxHeap == 0 {
		return
	}
	defer memLimits.endGuard()
	t := time.NewTicker(memSample)
	defer t.Stop()
	var lastLog time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		memLimits.tick(now)
		heap, changed := g.sample(now)
		if !changed && !(g.over.Load() && time.Since(lastLog) > time.Minute) {
			continue
		}
		lastLog = time.Now()
		if g.over.Load() {
			p.metrics.memShedding.Set(1)
			p.log.Warn("memory guard: the heap is above server.max_heap_bytes; shedding new requests with 503",
				zap.Uint64("heap_bytes", heap), zap.Uint64("max_heap_bytes", g.maxHeap))
		} else {
			p.metrics.memShedding.Set(0)
			p.log.Info("memory guard: the heap is below server.max_heap_bytes again; admitting requests",
				zap.Uint64("heap_bytes", heap), zap.Uint64("max_heap_bytes", g.maxHeap))
		}
	}
}

// Take adds n buffered body bytes to the sum (wire.Body's budget), and
// reports whether the sum stays within server.max_inflight_body_bytes
// (always, when it is off). The caller gives them back with Give, taken
// or not.
func (g *memGuard) Take(n int64) bool { return g.body.Add(n) <= g.maxBody || g.maxBody == 0 }

// Give takes n body bytes off the sum.
func (g *memGuard) Give(n int64) { g.body.Add(-n) }

// memLimits is the one place that sets the runtime's memory limit
// (debug.SetMemoryLimit), one per process as the limit is: the memory
// guard and the parker each lower it
// for a short while, to make the runtime collect and give memory back by
// itself rather than by forced collections (runtime.GC,
// debug.FreeOSMemory), which each forces only when nothing allocates and
// so no collection comes (memForceAfter, reclaimIdle). The limit in force
// is the lowest of the
// operator's (GOMEMLIMIT, read the first time) and the requests under
// way; each request ends by itself.
var memLimits memLimitState

type memLimitState struct {
	mu     sync.Mutex
	base   int64 // the operator's limit; 0: not read yet
	park   int64 // the parker's request; 0: none
	guard  int64 // the memory guard's request; 0: none
	cycles uint64
	asked  time.Time // when the guard asked for a collection
	forced bool      // and forced it, after memForceAfter without one
	until  time.Time // the guard's request ends then, or after a collection
	s      []rtmetrics.Sample
}

// memCollectWithin bounds how long the guard's request stays when no
// collection comes (nothing allocates). Measured with
// TestShedMemoryGuard: with 500ms, an idle keyway did not collect in time
// and the guard did not let go within 5s; with this, in 1.8-1.9s.
const memCollectWithin = 5 * time.Second

// memForceAfter is how long the guard's request waits for the runtime's
// own collection before the guard forces one: the runtime collects only
// when something allocates, and a shedding keyway may allocate nothing at
// all (its request path and its shed answers allocate nothing), which
// left it shedding until the runtime's periodic collection, 2 minutes.
const memForceAfter = time.Second

var limitMetrics = []string{
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/live:bytes",
	"/gc/cycles/total:gc-cycles",
}

// memNow is the runtime's memory, as the memory limit counts it.
type memNow struct {
	mapped  uint64 // held and not returned to the OS (what the limit bounds)
	free    uint64 // free heap pages not returned yet
	objects uint64 // heap objects, garbage included
	live    uint64 // the live heap the last collection found
	cycles  uint64 // collections so far
}

// read reads the runtime's memory; under l.mu.
func (l *memLimitState) read() memNow {
	if l.s == nil {
		l.s = make([]rtmetrics.Sample, len(limitMetrics))
		for i, n := range limitMetrics {
			l.s[i].Name = n
		}
	}
	rtmetrics.Read(l.s)
	v := func(i int) uint64 {
		if l.s[i].Value.Kind() != rtmetrics.KindUint64 {
			return 0
		}
		return l.s[i].Value.Uint64()
	}
	return memNow{mapped: v(0) - v(1), free: v(2), objects: v(3), live: v(4), cycles: v(5)}
}

// apply sets the lowest limit wanted; under l.mu.
func (l *memLimitState) apply() {
	if l.base == 0 {
		l.base = debug.SetMemoryLimit(-1)
	}
	lim := l.base
	for _, r := range []int64{l.park, l.guard} {
		if r > 0 && r < lim {
			lim = r
		}
	}
	debug.SetMemoryLimit(lim)
}

// collectLimit is the limit under which the runtime collects at its next
// allocation: the memory it holds less its free pages, so that the heap
// goal falls just below the heap. It collects again while nothing is
// freed, and stops once a collection frees something.
func (m memNow) collectLimit() int64 { return int64(m.mapped - m.free) }

// collect asks the runtime for one collection: the limit is lowered to
// collectLimit until a collection completes, or for memCollectWithin.
// It cannot make the GC run continuously: the request ends at the first
// sample after a collection, and the guard asks at most once a second.
func (l *memLimitState) collect(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.read()
	l.guard, l.cycles, l.asked, l.until, l.forced = m.collectLimit(), m.cycles, now, now.Add(memCollectWithin), false
	l.apply()
}

// tick ends the guard's request once a collection completed or its time
// is up; the guard calls it on every sample.
func (l *memLimitState) tick(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.guard == 0 {
		return
	}
	m := l.read()
	switch {
	case m.cycles > l.cycles || now.After(l.until):
		l.guard = 0
		l.apply()
	case !l.forced && now.Sub(l.asked) >= memForceAfter:
		// Nothing allocates, so the runtime starts no collection under
		// the lowered limit (keyway's request path and its shed answers
		// allocate nothing): force one, off the request path, while the
		// guard sheds anyway. Measured reason: without it a shedding
		// keyway shed every request until the runtime's periodic
		// collection, 2 minutes (memForceAfter);
		// TestMemLimitsForceWhenNothingAllocates holds it.
		l.forced = true
		l.mu.Unlock()
		runtime.GC()
		l.mu.Lock()
	}
}

// endGuard ends the guard's request.
func (l *memLimitState) endGuard() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.guard != 0 {
		l.guard = 0
		l.apply()
	}
}

// setPark sets (0: ends) the parker's request.
func (l *memLimitState) setPark(limit int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.park = limit
	l.apply()
}

// now reads the runtime's memory.
func (l *memLimitState) now() memNow {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.read()
}
