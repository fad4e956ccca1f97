package wire

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

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
// one. ClientConn.SetReadDeadline moves that deadline to now +
// park_idle_after and remembers the real one. If the wait runs out
// before the real deadline, Read reports ErrParked: fasthttp takes it as
// a keep-alive connection that ended, returns, and closes the connection;
// ClientConn.Close hands it to the parker instead.
//
// Not parked: TLS connections (crypto/tls would send close_notify when
// fasthttp closes it, and keeps its own buffers), and a connection with a
// request in progress: only the wait for a request's first byte parks.

// ErrParked ends fasthttp's wait for the next request of a connection
// that parks. fasthttp treats any error before a keep-alive request's
// first byte as the connection ending, answers nothing and closes it.
var ErrParked = errors.New("keyway: idle connection parked")

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
	// Once at least ReclaimMin connections parked since the last time,
	// and none parked for reclaimQuiet (by then fasthttp's idle workers
	// ended, see ParkWorkerIdle), the parker has its Reclaimer give the
	// memory back, at most once per reclaimEvery.
	ReclaimMin   = 1024
	reclaimQuiet = 3 * time.Second
	reclaimEvery = time.Minute
	// ReclaimPoll is how often the parker steps its Reclaimer while a
	// reclaim is under way.
	ReclaimPoll = 100 * time.Millisecond
	// ParkWorkerIdle is fasthttp's MaxIdleWorkerDuration while parking is
	// on: a goroutine left without a connection ends within twice this,
	// not fasthttp's usual 10-20 s, so that its stack can be given back.
	// A new connection then starts a goroutine (about a microsecond)
	// rather than reusing one.
	ParkWorkerIdle = time.Second
)

// ParkStats are the parker's counters.
type ParkStats struct {
	Parked atomic.Int64  // parked now
	Parks  atomic.Uint64 // connections parked, in all
	Wakes  atomic.Uint64 // parked connections served again
	Closed atomic.Uint64 // parked connections closed at their idle deadline
}

// ParkConfig is what parking needs from the server settings.
type ParkConfig struct {
	After time.Duration // server.park_idle_after; 0: off
	Idle  time.Duration // fasthttp's wait for a keep-alive request (server.idle_timeout)
	// MaxConns is the server's connection limit (fasthttp's
	// Concurrency): parked connections count towards it.
	MaxConns int
}

// On reports whether parking can ever happen.
func (c ParkConfig) On() bool { return c.After > 0 && c.After < c.Idle }

// Server is what the parker needs from the server: fasthttp.Server's.
type Server interface {
	// ServeConn serves a woken connection, as if freshly accepted.
	ServeConn(c net.Conn) error
	// GetOpenConnectionsCount returns the connections it serves now.
	GetOpenConnectionsCount() int32
}

// Reclaimer gives back the memory a burst of parked connections left
// behind: their goroutines' stacks and buffers are garbage or sit in
// fasthttp's pools, and stay resident until the runtime collects twice.
// The parker steps it from its own goroutine only.
type Reclaimer interface {
	// Step starts a reclaim (begin) or advances the one under way; parked
	// is the connections parked now. It reports whether a reclaim is
	// under way: then the parker steps it again every ReclaimPoll.
	Step(now time.Time, begin bool, parked int) bool
	// Abort ends a reclaim under way: the parker stopped.
	Abort()
}

// NewParker returns a parker for connections served by srv; Start starts
// it. r may be nil: nothing is reclaimed.
func NewParker(cfg ParkConfig, srv Server, r Reclaimer, log *zap.Logger) *Parker {
	pk := newParker()
	pk.cfg, pk.srv, pk.reclaimer, pk.log = cfg, srv, r, log
	return pk
}

// Stats are the parker's counters.
func (pk *Parker) Stats() *ParkStats { return &pk.stats }

// parkState is a ClientConn's part in parking. The connection's serving
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

// parkingSetReadDeadline is ClientConn.SetReadDeadline with parking on.
func (c *ClientConn) parkingSetReadDeadline(pk *Parker, t time.Time) error {
	if c.ps.idleNext {
		c.ps.idleNext = false
		if !t.IsZero() {
			// fasthttp set t = now + idle: now + after is t - idle + after,
			// without reading the clock again.
			c.ps.idleUntil = t
			c.ps.parkAt = true
			return c.tcp.SetReadDeadline(parkDeadline(t.Add(pk.cfg.After-pk.cfg.Idle), pk.cfg.After))
		}
	}
	c.ps.parkAt = false
	return c.tcp.SetReadDeadline(t)
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
func (c *ClientConn) parkDue(err error) bool {
	return c.ps.parkAt && errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(c.ps.idleUntil)
}

// parkerBase is the platform-independent part of the parker.
type parkerBase struct {
	cfg       ParkConfig
	srv       Server
	reclaimer Reclaimer // nil: none
	stats     ParkStats
	log       *zap.Logger

	mu      sync.Mutex
	conns   map[int]*ClientConn // parked, by socket
	stopped bool
	resumes sync.WaitGroup // goroutines serving woken connections

	// reclaim bookkeeping (under mu)
	sinceReclaim int
	lastPark     time.Time
	lastReclaim  time.Time
	reclaiming   bool // a reclaim is under way
}

// full reports whether a new connection would take the open ones, served
// and parked, beyond the connection limit.
func (pk *Parker) full() bool {
	n := pk.stats.Parked.Load()
	return n > 0 && int(n)+int(pk.srv.GetOpenConnectionsCount()) >= pk.cfg.MaxConns
}

// stepReclaim steps the Reclaimer, if one is under way or begin starts one
// (the parker's goroutine only).
func (pk *Parker) stepReclaim(now time.Time, begin bool, parked int) {
	pk.mu.Lock()
	active := pk.reclaiming
	pk.mu.Unlock()
	if pk.reclaimer == nil || !active && !begin {
		return
	}
	active = pk.reclaimer.Step(now, begin, parked)
	pk.mu.Lock()
	pk.reclaiming = active
	pk.mu.Unlock()
}

// abortReclaim ends a reclaim under way (the parker's goroutine has ended).
func (pk *Parker) abortReclaim() {
	pk.mu.Lock()
	active := pk.reclaiming
	pk.reclaiming = false
	pk.mu.Unlock()
	if active && pk.reclaimer != nil {
		pk.reclaimer.Abort()
	}
}
