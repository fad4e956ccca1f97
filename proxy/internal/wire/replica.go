package wire

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
)

// ErrStale is returned when a pooled connection is about to be reused but
// the replica has closed it (it crashed, restarted or idled it out), sent
// something unasked on it (over TLS, the close_notify alert that precedes
// its close), or it belongs to an earlier incarnation of the replica.
// Nothing was written: the request never reached the replica, so it is
// always safe to send it again.
var ErrStale = errors.New("wire: pooled connection already closed by the replica")

// ReplicaConn is a connection to a replica that watches how each exchange
// on it begins, so that RoundTrip can say what became of a request that
// failed:
//
//   - Before the first write that follows a read (a pooled connection
//     reused for the next request) it peeks at the socket without
//     blocking. A closed or reset socket, or one with bytes waiting (a
//     replica has nothing to say between a reply and the next request;
//     over TLS a close_notify shows this way before the FIN), fails the
//     write with ErrStale: nothing is sent. Over TLS it peeks at the TCP
//     socket beneath the tls.Conn, so the alert is seen before crypto/tls
//     reads it. The peek runs through RawConn.Control, which works
//     whatever the connection's read deadline.
//   - The peek cannot close the race in which the replica closes the
//     connection while the request is on its way. For that, it remembers
//     whether an exchange on a reused connection failed before the first
//     reply byte (a read ending in EOF or a reset, a write failing with
//     EPIPE or a reset): the request's fate is unknown, but the replica
//     is not at fault.
//   - Over TLS, it remembers an alert that answered a fresh connection's
//     first exchange before any reply byte: with TLS 1.3 the client's
//     handshake ends before the server has checked the client's
//     certificate, and a replica refusing it (mTLS) says so in place of
//     the first reply.
//
// A ReplicaConn is used by one goroutine at a time, like the connection
// it wraps, and must not be copied.
type ReplicaConn struct {
	net.Conn
	raw syscall.RawConn // the TCP socket's; nil: no peek
	// peekFn is peekFD bound once: a method value made per peek would
	// allocate. peeked is what it found.
	peekFn func(fd uintptr)
	peeked bool
	// gen is the generation of the replica's pool when the connection was
	// made, cur the pool's generation now (nil: no generations).
	gen uint64
	cur *atomic.Uint64

	isTLS    bool
	readSeen bool // a read since the last write: the next write reuses the connection
	reused   bool // the current exchange runs on a reused connection
	answered bool // a reply byte of the current exchange has arrived
	stale    bool // the current exchange was refused by the stale check
	lost     bool // the current exchange on a reused connection failed before its first reply byte
	alert    error
}

// NewReplicaConn wraps c, a TCP connection or a *tls.Conn over one whose
// handshake is done. gen is the replica's pool generation when c was
// dialed and cur the generation in force (nil: none): once they differ,
// the connection is never reused. A connection that exposes no socket (an
// in-memory one in tests) is watched without the peek.
func NewReplicaConn(c net.Conn, gen uint64, cur *atomic.Uint64) *ReplicaConn {
	w := &ReplicaConn{Conn: c, gen: gen, cur: cur}
	under := c
	if tc, ok := c.(*tls.Conn); ok {
		w.isTLS = true
		under = tc.NetConn()
	}
	if sc, ok := under.(syscall.Conn); ok && peekSupported {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
			w.peekFn = w.peekFD
		}
	}
	return w
}

// outcome reports what the connection saw of the current exchange.
func (c *ReplicaConn) outcome(o *Outcome) {
	o.Stale = o.Stale || c.stale
	o.LostReused = c.lost
	o.TLSRefused = c.alert
}

func (c *ReplicaConn) Read(b []byte) (int, error) {
	c.readSeen = true
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.answered = true
	} else if err != nil && !c.answered {
		if c.reused && connLost(err) {
			c.lost = true
		} else if !c.reused && c.isTLS && c.alert == nil && IsRemoteAlert(err) {
			c.alert = err
		}
	}
	return n, err
}

func (c *ReplicaConn) Write(b []byte) (int, error) {
	if c.readSeen {
		// The first write of an exchange on a reused connection.
		c.readSeen = false
		c.reused, c.answered, c.lost, c.stale = true, false, false, false
		if c.cur != nil && c.cur.Load() != c.gen {
			c.stale = true
			return 0, ErrStale // made for an earlier incarnation of the replica
		}
		if c.raw != nil && c.peekClosed() {
			c.stale = true
			return 0, ErrStale
		}
	}
	n, err := c.Conn.Write(b)
	if err != nil && c.reused && !c.answered && connLost(err) {
		c.lost = true
	}
	return n, err
}

// peekClosed runs the stale check through RawConn.Control, which, unlike
// RawConn.Read, runs whatever the read deadline (fasthttp leaves the last
// reply's on a pooled connection), and reports a closed connection.
func (c *ReplicaConn) peekClosed() bool {
	c.peeked = false
	err := c.raw.Control(c.peekFn)
	return err == nil && c.peeked
}

// peekFD runs inside RawConn.Control: it never blocks.
func (c *ReplicaConn) peekFD(fd uintptr) { c.peeked = peekFD(fd) }

// connLost reports whether an I/O error says the peer closed or reset the
// connection.
func connLost(err error) bool {
	return err == io.EOF || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// IsRemoteAlert reports whether err is a TLS alert the peer sent, as
// crypto/tls reports it: a *net.OpError with Op "remote error".
func IsRemoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}
