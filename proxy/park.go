package proxy

import (
	"runtime"
	"strconv"
	"time"

	"keyway/proxy/internal/wire"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Parking idle keep-alive client connections is the wire layer's
// (wire.Parker, proxy/internal/wire/park.go). Here: its metrics, the
// answer to a connection beyond server.max_conns while connections are
// parked, and how the memory of a burst of parked connections is given
// back (memReclaim, the parker's wire.Reclaimer).

// registerParkStats exports the parker's counters as metrics.
func registerParkStats(reg prometheus.Registerer, s *wire.ParkStats) error {
	if reg == nil {
		return nil
	}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "parked_connections",
			Help: "Idle keep-alive client connections parked now (server.park_idle_after): held without a goroutine or buffers.",
		}, func() float64 { return float64(s.Parked.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "keyway", Name: "connection_parks_total",
			Help: "Idle keep-alive client connections parked.",
		}, func() float64 { return float64(s.Parks.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "keyway", Name: "connection_unparks_total",
			Help: "Parked client connections served again because the client sent a request or closed.",
		}, func() float64 { return float64(s.Wakes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "keyway", Name: "parked_connections_expired_total",
			Help: "Parked client connections closed by server.idle_timeout.",
		}, func() float64 { return float64(s.Closed.Load()) }),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// maxConnsBody is the answer to a connection beyond server.max_conns
// while connections are parked (fasthttp counts only the ones it serves,
// so keyway refuses beyond the sum itself).
const maxConnsBody = `{"error":"too many client connections: server.max_conns is reached","replica_set":"","replica":"","reason":"max_conns"}` + "\n"

var maxConnsAnswer = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
	strconv.Itoa(len(maxConnsBody)) + "\r\n\r\n" + maxConnsBody)

// memReclaim gives back the memory of a burst of parked connections
// through the runtime's memory limit (debug.SetMemoryLimit), lowered for
// a few seconds, rather than forced collections. The runtime collects at
// its own pace (concurrently, its GC CPU limiter capping the GC at half
// the CPU), and once the pooled objects are gone it returns the free
// memory to the OS itself to stay under the limit.
//
//  1. collect: the limit is set to the memory the runtime holds less its
//     free pages (what the heap's objects, garbage included, and the
//     runtime's other memory take). The heap goal drops just below the
//     heap: the runtime collects at its next allocations, and again while
//     nothing is freed (fasthttp's pools need two collections).
//  2. release: after two collections, the limit is set to the memory the
//     runtime holds besides the heap, plus the live heap the last
//     collection found and a quarter of it more (at least reclaimMargin).
//     Above it, the runtime returns free memory to the OS as it allocates,
//     and its background scavenger works down to 95% of it.
//  3. the limit in force before is restored once the memory is down to
//     the limit, or reclaimRelease after the release began, or
//     reclaimCollect after the start if two collections did not happen.
//
// The bound on GC work (a limit below what is live makes the GC run
// continuously, up to the half of the CPU its limiter allows): in phase 1
// the goal is the heap as it is, so the GC runs until a collection frees
// something, and if nothing is garbage (load came back) the phase ends at
// the next poll after two collections (wire.ReclaimPoll). In phase 2 the heap
// goal is the live heap + max(live/4, reclaimMargin) instead of GOGC's
// twice the live heap, for at most reclaimRelease: the GC runs up to
// four times as often as usual for those 3 s, and continuously only if
// the live heap grows past that goal within them. A reclaim starts at
// most once a minute, only after 3 s without a park (wire.Parker).
type memReclaim struct {
	log    *zap.Logger
	phase  int // 0: none under way; 1: collect; 2: release
	limit  int64
	cycles uint64 // GC cycles at the start of phase 1
	start  time.Time
	until  time.Time
	parked int
	forced bool // the collections were forced: nothing allocated (reclaimIdle)
}

const (
	reclaimCollect = 10 * time.Second
	reclaimRelease = 3 * time.Second
	// reclaimIdle is how long phase 1 waits for the runtime's own
	// collections before it forces them. The runtime starts a collection
	// only when something allocates, and keyway's request path allocates
	// nothing: an idle proxy, or one whose traffic allocates nothing,
	// never collects under the lowered limit. Measured with the bench
	// harness (10,000 idle connections, -idle-hold 15s, 3 rounds): without
	// this fallback one round in three kept 14,785 bytes per connection,
	// against 2,648-2,716 in the others. A collection forced then delays
	// nobody's request but the few that allocate nothing, by its
	// stop-the-world pauses (tens of microseconds for keyway's heap).
	reclaimIdle   = 2 * time.Second
	reclaimMargin = 4 << 20
)

// Step advances a reclaim under way, or starts one (begin); it reports
// whether one is under way (wire.Reclaimer).
func (r *memReclaim) Step(now time.Time, begin bool, parked int) bool {
	r.step(now, begin, parked)
	return r.phase != 0
}

// Abort ends a reclaim under way: the limit in force before is restored.
func (r *memReclaim) Abort() {
	if r.phase != 0 {
		memLimits.setPark(0)
		r.phase = 0
	}
}

func (r *memReclaim) step(now time.Time, begin bool, parked int) {
	switch r.phase {
	case 0:
		if !begin {
			return
		}
		m := memLimits.now()
		r.phase, r.limit, r.cycles, r.start, r.until, r.parked, r.forced = 1, m.collectLimit(), m.cycles, now, now.Add(reclaimCollect), parked, false
		memLimits.setPark(r.limit)
	case 1:
		m := memLimits.now()
		if m.cycles < r.cycles+2 {
			switch {
			case !r.forced && now.Sub(r.start) >= reclaimIdle:
				// Nothing allocates (reclaimIdle): the two collections
				// fasthttp's pools need, forced, off the request path.
				// Measured reason: without them one idle-memory round
				// in eight kept 14,785 bytes per parked connection
				// instead of 2.6-2.7 KB (reclaimIdle);
				// TestReclaimForcesWhenNothingAllocates holds it.
				r.forced = true
				runtime.GC()
				runtime.GC()
			case now.After(r.until):
				r.end(m, "no collection came")
			}
			return
		}
		var nonHeap uint64 // stacks, the runtime's own structures, spans' unused room
		if m.mapped > m.free+m.objects {
			nonHeap = m.mapped - m.free - m.objects
		}
		limit := int64(nonHeap + m.live + max(m.live/4, reclaimMargin))
		if limit >= int64(m.mapped) {
			r.end(m, "")
			return
		}
		r.phase, r.limit, r.until = 2, limit, now.Add(reclaimRelease)
		memLimits.setPark(limit)
	case 2:
		m := memLimits.now()
		if int64(m.mapped) <= r.limit || now.After(r.until) {
			r.end(m, "")
		}
	}
}

func (r *memReclaim) end(m memNow, why string) {
	memLimits.setPark(0)
	r.phase = 0
	r.log.Info("returned the memory of parked connections to the OS",
		zap.Int("parked", r.parked), zap.Duration("took", time.Since(r.start)),
		zap.Uint64("held_bytes", m.mapped), zap.Uint64("live_heap_bytes", m.live),
		zap.Uint64("collections", m.cycles-r.cycles), zap.Bool("forced", r.forced), zap.String("incomplete", why))
}
