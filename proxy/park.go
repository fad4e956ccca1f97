package proxy

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Parking idle keep-alive client connections.
//
// fasthttp serves each client connection on a goroutine of its own, for
// the connection's whole life. That goroutine also proxies, so its stack
// grows to 8 KiB, and while the connection is idle the goroutine still
// uses more than a quarter of it: the garbage collector never shrinks it.
// With the connection's buffers, an idle keep-alive connection costs
// about 22 KB of memory, where an event-loop proxy spends 1 KB.
//
// A plain-HTTP connection idle for server.park_idle_after is therefore
// parked: its goroutine ends, fasthttp releases the request context and
// buffers, and the socket waits in an epoll set of keyway's own (one
// goroutine, asleep in the runtime's netpoller, watches them all). When
// the client sends the next request, or closes, the connection is served
// again on a new goroutine, as if freshly accepted. A parked connection
// costs its socket and about 2.4 KB of memory in all. Its idle deadline is kept:
// server.idle_timeout, counted from its last answer, closes it as before.
//
// How a connection parks, without an extra timer or clock read on the
// request path: fasthttp answers a request (ConnState StateIdle), then
// sets the read deadline now + idle_timeout for the wait for the next
// one. lingerConn.SetReadDeadline moves that deadline to now +
// park_idle_after and remembers the real one. If the wait runs out
// before the real deadline, Read reports errParked: fasthttp takes it as
// a keep-alive connection that ended, returns, and closes the connection;
// lingerConn.Close hands it to the parker instead.
//
// Not parked: TLS connections (crypto/tls would send close_notify when
// fasthttp closes it, and keeps its own buffers), and a connection with a
// request in progress: only the wait for a request's first byte parks.

// errParked ends fasthttp's wait for the next request of a connection
// that parks. fasthttp treats any error before a keep-alive request's
// first byte as the connection ending, answers nothing and closes it.
var errParked = errors.New("keyway: idle connection parked")

const (
	// parkSweep is how often the parker closes parked connections whose
	// idle deadline passed, while any are parked.
	parkSweep = time.Second
	// After a burst of connections parked, the memory their goroutines
	// and buffers held is garbage or sits in fasthttp's pools, and stays
	// resident: an idle proxy collects only every 2 minutes (the
	// runtime's periodic collection), and pools need two collections.
	// Measured with 10,000 idle connections: 15 KB each until then, and
	// the memory went back to the OS only 4 minutes after they parked.
	// Once at least reclaimMin connections parked since the last time,
	// and none parked for reclaimQuiet (by then fasthttp's idle workers
	// ended, see parkWorkerIdle), the parker lowers the runtime's memory
	// limit for a few seconds (memReclaim), at most once per
	// reclaimEvery.
	reclaimMin   = 1024
	reclaimQuiet = 3 * time.Second
	reclaimEvery = time.Minute
	// parkWorkerIdle is fasthttp's MaxIdleWorkerDuration while parking is
	// on: a goroutine left without a connection ends within twice this,
	// not fasthttp's usual 10-20 s, so that its stack can be given back.
	// A new connection then starts a goroutine (about a microsecond)
	// rather than reusing one.
	parkWorkerIdle = time.Second
)

// parkStats are the parker's counters, exported as metrics.
type parkStats struct {
	parked atomic.Int64  // parked now
	parks  atomic.Uint64 // connections parked, in all
	wakes  atomic.Uint64 // parked connections served again
	closed atomic.Uint64 // parked connections closed at their idle deadline
}

func (s *parkStats) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "parked_connections",
			Help: "Idle keep-alive client connections parked now (server.park_idle_after): held without a goroutine or buffers.",
		}, func() float64 { return float64(s.parked.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "keyway", Name: "connection_parks_total",
			Help: "Idle keep-alive client connections parked.",
		}, func() float64 { return float64(s.parks.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "keyway", Name: "connection_unparks_total",
			Help: "Parked client connections served again because the client sent a request or closed.",
		}, func() float64 { return float64(s.wakes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "keyway", Name: "parked_connections_expired_total",
			Help: "Parked client connections closed by server.idle_timeout.",
		}, func() float64 { return float64(s.closed.Load()) }),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// parkConfig is what parking needs from the server settings.
type parkConfig struct {
	after time.Duration // server.park_idle_after; 0: off
	idle  time.Duration // fasthttp's wait for a keep-alive request (server.idle_timeout)
}

// on reports whether parking can ever happen.
func (c parkConfig) on() bool { return c.after > 0 && c.after < c.idle }

// parkState is a lingerConn's part in parking. The connection's serving
// goroutine uses it while it is served, the parker while it is parked;
// parking (set by Read, taken by Close) is atomic because fasthttp's
// Shutdown may close an idle connection from another goroutine.
type parkState struct {
	idleNext  bool      // fasthttp answered a request: the next read deadline it sets is the idle wait's
	parkAt    bool      // the read deadline in force is the park deadline, not fasthttp's
	idleUntil time.Time // the idle deadline fasthttp asked for
	parking   atomic.Bool
	fd        int  // the socket, once known (0: not yet)
	inEpoll   bool // registered with the parker's epoll set (disarmed while served)
}

// parkingSetReadDeadline is lingerConn.SetReadDeadline with parking on.
func (c *lingerConn) parkingSetReadDeadline(pk *parker, t time.Time) error {
	if c.ps.idleNext {
		c.ps.idleNext = false
		if !t.IsZero() {
			// fasthttp set t = now + idle: now + after is t - idle + after,
			// without reading the clock again.
			c.ps.idleUntil = t
			c.ps.parkAt = true
			return c.TCPConn.SetReadDeadline(parkDeadline(t.Add(pk.cfg.after-pk.cfg.idle), pk.cfg.after))
		}
	}
	c.ps.parkAt = false
	return c.TCPConn.SetReadDeadline(t)
}

// parkDeadline rounds the park deadline at up to a grid of after/8, so
// that connections that went idle around the same time park together:
// parking wakes the connection's goroutine, and at a moderate rate
// keyway is idle between requests, so parks at their own instants would
// each wake the whole process once more. Rounded, one wake-up parks every
// connection due in that slice of time (measured with 500 connections
// each sending every 500 ms and parking between: 1.8 → 1.45 context
// switches per request, as many as with parking off).
func parkDeadline(at time.Time, after time.Duration) time.Time {
	grid := max(after/8, time.Millisecond)
	r := at.Truncate(grid)
	if r.Before(at) {
		r = r.Add(grid)
	}
	return r
}

// parkDue reports whether a read that failed with err, having read
// nothing, ended at the park deadline with the idle deadline still ahead.
func (c *lingerConn) parkDue(err error) bool {
	return c.ps.parkAt && errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(c.ps.idleUntil)
}

// maxConnsBody is the answer to a connection beyond server.max_conns
// while connections are parked (fasthttp counts only the ones it serves,
// so keyway refuses beyond the sum itself).
const maxConnsBody = `{"error":"too many client connections: server.max_conns is reached","replica_set":"","replica":"","reason":"max_conns"}` + "\n"

var maxConnsAnswer = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
	strconv.Itoa(len(maxConnsBody)) + "\r\n\r\n" + maxConnsBody)

// parkerBase is the platform-independent part of the parker.
type parkerBase struct {
	p     *Proxy
	cfg   parkConfig
	stats parkStats
	log   *zap.Logger

	mu      sync.Mutex
	conns   map[int]*lingerConn // parked, by socket
	stopped bool
	resumes sync.WaitGroup // goroutines serving woken connections

	// reclaim bookkeeping (the parker's goroutine only, under mu)
	sinceReclaim int
	lastPark     time.Time
	lastReclaim  time.Time
	reclaim      memReclaim // the parker's goroutine only
}

// full reports whether a new connection would take the open ones, served
// and parked, beyond server.max_conns.
func (pk *parker) full() bool {
	n := pk.stats.parked.Load()
	return n > 0 && int(n)+int(pk.p.server.GetOpenConnectionsCount()) >= pk.p.cfg.Server.MaxConns
}

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
// the next poll after two collections (reclaimPoll). In phase 2 the heap
// goal is the live heap + max(live/4, reclaimMargin) instead of GOGC's
// twice the live heap, for at most reclaimRelease: the GC runs up to
// four times as often as usual for those 3 s, and continuously only if
// the live heap grows past that goal within them. A reclaim starts at
// most once per reclaimEvery, only after reclaimQuiet without a park.
type memReclaim struct {
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
	// reclaimPoll is how often the parker looks at the runtime's memory
	// while a reclaim is under way.
	reclaimPoll = 100 * time.Millisecond
)

// step advances a reclaim under way, or starts one (begin).
func (r *memReclaim) step(now time.Time, begin bool, parked int, log *zap.Logger) {
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
				r.forced = true
				runtime.GC()
				runtime.GC()
			case now.After(r.until):
				r.end(m, "no collection came", log)
			}
			return
		}
		var nonHeap uint64 // stacks, the runtime's own structures, spans' unused room
		if m.mapped > m.free+m.objects {
			nonHeap = m.mapped - m.free - m.objects
		}
		limit := int64(nonHeap + m.live + max(m.live/4, reclaimMargin))
		if limit >= int64(m.mapped) {
			r.end(m, "", log)
			return
		}
		r.phase, r.limit, r.until = 2, limit, now.Add(reclaimRelease)
		memLimits.setPark(limit)
	case 2:
		m := memLimits.now()
		if int64(m.mapped) <= r.limit || now.After(r.until) {
			r.end(m, "", log)
		}
	}
}

func (r *memReclaim) end(m memNow, why string, log *zap.Logger) {
	memLimits.setPark(0)
	r.phase = 0
	log.Info("returned the memory of parked connections to the OS",
		zap.Int("parked", r.parked), zap.Duration("took", time.Since(r.start)),
		zap.Uint64("held_bytes", m.mapped), zap.Uint64("live_heap_bytes", m.live),
		zap.Uint64("collections", m.cycles-r.cycles), zap.Bool("forced", r.forced), zap.String("incomplete", why))
}
