package proxy

import (
	"context"
	"runtime"
	rtmetrics "runtime/metrics"
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
	// collect runs a garbage collection (runtime.GC), at most once per
	// memCollectEvery, when the heap reads above the bound; lastCollect
	// is when it last ran (run's goroutine only).
	collect     func()
	lastCollect time.Time
}

const memSample = 20 * time.Millisecond

// memCollectEvery spaces the collections the guard forces while the heap
// reads above max_heap_bytes: one full GC a second at most, only then.
const memCollectEvery = time.Second

// heapMetric is the live heap objects' bytes: what a request's buffers
// and bodies add to, without the freed memory the runtime keeps.
const heapMetric = "/memory/classes/heap/objects:bytes"

func newMemGuard(c ServerConfig) *memGuard {
	g := &memGuard{maxHeap: uint64(c.MaxHeapBytes), maxBody: int64(c.MaxInflightBodyBytes), collect: runtime.GC}
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
// The heap metric counts dead objects until a collection frees them, and
// nothing else starts one while a shedding proxy allocates little (the
// runtime forces one only every 2 minutes): without a collection here,
// the guard went on shedding every request for 4 minutes after the
// requests that filled the heap had ended (pooled buffers need two
// collections); and between collections
// garbage alone may cross the bound (GOGC=100 lets the heap grow to twice
// what is live). So above the bound the guard collects first and decides
// on what is left.
func (g *memGuard) sample(now time.Time) (heap uint64, changed bool) {
	heap = g.read()
	if g.maxHeap > 0 && heap > g.maxHeap && now.Sub(g.lastCollect) >= memCollectEvery {
		g.collect()
		g.lastCollect = now
		heap = g.read()
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
	t := time.NewTicker(memSample)
	defer t.Stop()
	var lastLog time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		heap, changed := g.sample(time.Now())
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

// admitBody adds n body bytes to the sum in flight, and reports whether
// the sum stays within the bound. The caller gives them back with
// releaseBody, admitted or not.
func (g *memGuard) admitBody(n int64) bool {
	return g.body.Add(n) <= g.maxBody
}

func (g *memGuard) releaseBody(n int64) { g.body.Add(-n) }
