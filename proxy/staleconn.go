package proxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/valyala/fasthttp"
)

// errStaleConn is returned when keyway is about to reuse a pooled
// connection that the replica has already closed (it crashed, restarted or
// idled the connection out), one on which the replica sent something
// unasked (over TLS, the close_notify alert that precedes its close), or
// one that belongs to an earlier incarnation of the replica. Nothing was
// written: the request never reached the replica, so it is always safe to
// send it again.
var errStaleConn = errors.New("proxy: pooled connection already closed by the replica")

// staleCheckConn wraps a connection to a replica and watches how each
// exchange on it begins.
//
// Before the first write that follows a read — that is, before a pooled
// connection is reused for the next request — it peeks at the socket
// without blocking: a closed or reset socket fails the write with
// errStaleConn instead of sending a request into a dead connection, whose
// fate keyway could then not know (a non-replayable POST would get 502).
// So does a socket with bytes waiting: between a response read whole and
// the next request a replica has nothing to say, and whatever it said
// would be read as the next request's answer. Over TLS that is how a
// replica closing an idle connection shows first: its close_notify alert
// (a record of content type 21 in TLS 1.2; in TLS 1.3 every record looks
// like application data, 23) arrives before its FIN, or alone while the
// FIN is still on its way. For a TLS connection the wrapper sits above the
// tls.Conn and peeks at the TCP socket beneath it ((*tls.Conn).NetConn),
// so the record is seen before crypto/tls reads it.
// The check is one non-blocking recvfrom(MSG_PEEK) per reuse and allocates
// nothing. On a plain-TCP connection Write only holds the request of a
// reused exchange, and the Read that follows makes the check and sends
// it from inside RawConn.Read (sendAndRead): the wait for the answer is
// then armed before the request leaves, which spares the read that Go's
// netpoller would otherwise try first and see return EAGAIN. The check
// keeps its place, before anything is sent. It runs through RawConn.Control, not RawConn.Read: Read refuses
// to run the check at all once the connection's read deadline has passed,
// and fasthttp leaves the previous response's read deadline on a pooled
// connection until after it has written the next request — so every
// connection idle for longer than timeouts.request went unchecked.
//
// The peek cannot close the race in which the replica closes the
// connection while the request is on its way (keeping timeouts.idle below
// the replica's keep-alive timeout narrows it). For that race the wrapper
// remembers whether the exchange on a reused connection failed before its
// first response byte — a read ending in EOF or a reset, or a write failing
// with EPIPE or a reset — and forward learns it through the connection's
// RemoteAddr (see lostReusedConn): fasthttp turns any error on the first
// response byte into ErrConnectionClosed, so the error itself cannot say.
//
// Like the connection, it is used by one goroutine at a time.
type staleCheckConn struct {
	net.Conn
	raw  syscall.RawConn // nil when the conn exposes no file descriptor
	peek func(fd uintptr)
	addr connAddr
	// gen is the generation of the backend's pool when the connection
	// was made, cur the pool's generation now (nil: no generations).
	gen uint64
	cur *atomic.Uint64

	// pending holds a reused plain-TCP connection's request bytes that
	// Write took but did not send: the next Read sends them, after the
	// stale check, from inside the wait for the answer (sendAndRead).
	// Its buffer (held) comes from heldPool for the exchange only.
	// check says that the stale check of the exchange is still due.
	pending  []byte
	held     *[]byte
	check    bool
	io       heldIO
	sendRead func(fd uintptr) bool
	// stale is set when the check, made by sendAndRead, found the
	// connection closed: nothing was sent (staleAtSend).
	stale bool

	readSeen bool // a read since the last write: the next write reuses the connection
	reused   bool // the current exchange runs on a reused connection
	answered bool // a response byte of the current exchange has arrived
	lost     bool // the current exchange on a reused connection failed before its first response byte
	closed   bool // set by peekFD
	buf      [1]byte

	// Over TLS (isTLS): serverName is the name verified; refused is set when the
	// replica answered the first exchange with a TLS alert before any
	// response byte. With TLS 1.3 the client's handshake ends before the
	// server has checked the client's certificate: a replica refusing it
	// (mTLS) says so with an alert in place of the first answer, having
	// read no request.
	isTLS      bool
	serverName string
	refused    *HandshakeError
}

// connAddr is a staleCheckConn's remote address. fasthttp keeps the
// RemoteAddr of the connection a response came over (Response.RemoteAddr),
// which leads from a failed attempt back to its connection.
type connAddr struct {
	net.Addr
	c *staleCheckConn
}

// newStaleCheckConn wraps c, a TCP connection or a *tls.Conn over one
// (whose handshake is done). gen and cur are the backend's pool generation
// (see Backend.retirePool); cur may be nil. A connection without a file
// descriptor (an in-memory one in tests) is returned as it is.
func newStaleCheckConn(c net.Conn, gen uint64, cur *atomic.Uint64) net.Conn {
	under := c
	tc, isTLS := c.(*tls.Conn)
	if isTLS {
		under = tc.NetConn()
	}
	sc, ok := under.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	s := &staleCheckConn{Conn: c, raw: raw, gen: gen, cur: cur, isTLS: isTLS}
	s.peek = s.peekFD
	s.sendRead = s.sendReadFD
	s.addr = connAddr{Addr: c.RemoteAddr(), c: s}
	return s
}

// RemoteAddr returns the peer's address, as a *connAddr.
func (c *staleCheckConn) RemoteAddr() net.Addr { return &c.addr }

func (c *staleCheckConn) Read(b []byte) (int, error) {
	c.readSeen = true
	var n int
	var err error
	if c.check || len(c.pending) > 0 {
		n, err = c.sendAndRead(b)
	} else {
		n, err = c.Conn.Read(b)
	}
	if n > 0 {
		c.answered = true
	} else if err != nil && !c.answered {
		if c.reused && connLost(err) {
			c.lost = true
		} else if !c.reused && c.isTLS && c.refused == nil && isRemoteAlert(err) {
			c.refused = &HandshakeError{Addr: c.addr.String(), ServerName: c.serverName, Err: err}
		}
	}
	return n, err
}

func (c *staleCheckConn) Write(b []byte) (int, error) {
	if c.readSeen {
		// The first write of an exchange on a reused connection.
		c.readSeen = false
		c.reused, c.answered, c.lost = true, false, false
		c.stale = false
		if c.cur != nil && c.cur.Load() != c.gen {
			return 0, errStaleConn // made for an earlier incarnation of the replica
		}
		if !c.isTLS {
			// Checked and sent by the Read that follows (sendAndRead).
			c.check = true
		} else if c.peekClosed() {
			return 0, errStaleConn
		}
	}
	if c.check {
		if len(c.pending)+len(b) <= maxHeldRequest {
			if c.held == nil {
				c.held = heldPool.Get().(*[]byte)
				c.pending = (*c.held)[:0]
			}
			c.pending = append(c.pending, b...)
			return len(b), nil
		}
		// Too large to hold: check, and send what is held, now.
		if err := c.flushHeld(); err != nil {
			return 0, err
		}
	}
	return c.write(b)
}

// write sends b, noting a reused connection lost before its answer.
func (c *staleCheckConn) write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil && c.reused && !c.answered && connLost(err) {
		c.lost = true
	}
	return n, err
}

// maxHeldRequest bounds the request bytes a reused connection holds for
// its next Read (sendAndRead): the head and a body of a few pages, which
// a pooled connection's empty send buffer takes at once. Larger requests
// are checked and sent as before, by Write.
const maxHeldRequest = 16 << 10

// heldPool holds the buffers of held requests, maxHeldRequest each: a
// connection has one only between a Write and the Read that sends it.
var heldPool = sync.Pool{New: func() any {
	b := make([]byte, 0, maxHeldRequest)
	return &b
}}

// dropHeld empties pending and gives its buffer back.
func (c *staleCheckConn) dropHeld() {
	c.pending = nil
	if c.held != nil {
		heldPool.Put(c.held)
		c.held = nil
	}
}

// flushHeld makes the due stale check and sends the held bytes the
// ordinary way (Write blocking on the netpoller while the socket is full).
func (c *staleCheckConn) flushHeld() error {
	if c.check {
		c.check = false
		if c.peekClosed() {
			c.dropHeld()
			c.stale = true
			return errStaleConn
		}
	}
	for len(c.pending) > 0 {
		n, err := c.write(c.pending)
		c.pending = c.pending[n:]
		if err != nil {
			c.dropHeld()
			return err
		}
	}
	c.dropHeld()
	return nil
}

// sendAndRead is the first Read of an exchange on a reused plain-TCP
// connection. It makes the stale check and sends the held request from
// inside RawConn.Read, which has armed the wait for the answer before
// calling it: the answer cannot arrive before the wait is armed, so the
// read that follows can wait for it at once instead of first trying a
// read that returns EAGAIN (as Go's netpoller does, since arming the
// wait clears the readiness seen before). One system call fewer per
// request. A send the socket cannot take whole at once falls back to
// flushHeld and an ordinary read.
func (c *staleCheckConn) sendAndRead(b []byte) (int, error) {
	c.io = heldIO{b: b}
	err := c.raw.Read(c.sendRead)
	st := c.io
	c.io = heldIO{}
	switch {
	case c.stale:
		c.dropHeld()
		return 0, errStaleConn
	case st.fallback || !st.called:
		// The socket could not take the request at once, or RawConn.Read
		// refused to start (a read deadline already past): check and send
		// the ordinary way; the read reports the deadline.
		if err := c.flushHeld(); err != nil {
			return 0, err
		}
		return c.Conn.Read(b)
	case st.err != nil:
		c.dropHeld()
		return st.n, st.err
	case err != nil:
		// The read deadline passed, or the connection was closed.
		c.dropHeld()
		return 0, &net.OpError{Op: "read", Net: "tcp", Addr: c.addr.Addr, Err: err}
	}
	c.dropHeld()
	return st.n, nil
}

// heldIO is the state of one sendAndRead, kept in the connection so that
// the callback (sendReadFD, bound once as sendRead) allocates nothing.
type heldIO struct {
	b                      []byte
	n                      int
	err                    error
	sent, fallback, called bool
}

// sendReadFD is sendAndRead's RawConn.Read callback: first the stale
// check and the send, then the read of the answer.
func (c *staleCheckConn) sendReadFD(fd uintptr) bool {
	st := &c.io
	st.called = true
	if !st.sent {
		if c.check {
			c.check = false
			c.closed = false
			c.peek(fd)
			if c.closed {
				c.stale = true
				return true
			}
		}
		for len(c.pending) > 0 {
			m, err := syscall.Write(int(fd), c.pending)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				st.fallback = true
				return true
			case err != nil:
				st.err = &net.OpError{Op: "write", Net: "tcp", Addr: c.addr.Addr, Err: os.NewSyscallError("write", err)}
				return true
			}
			c.pending = c.pending[m:]
		}
		st.sent = true
		return false // wait for the answer
	}
	m, err := syscall.Read(int(fd), st.b)
	for err == syscall.EINTR {
		m, err = syscall.Read(int(fd), st.b)
	}
	switch {
	case err == syscall.EAGAIN:
		return false
	case err != nil:
		st.err = &net.OpError{Op: "read", Net: "tcp", Addr: c.addr.Addr, Err: os.NewSyscallError("read", err)}
	case m == 0 && len(st.b) > 0:
		st.err = io.EOF
	default:
		st.n = m
	}
	return true
}

// peekClosed runs the stale check through RawConn.Control, which works
// whatever the read deadline, and reports a closed connection.
func (c *staleCheckConn) peekClosed() bool {
	c.closed = false
	err := c.raw.Control(c.peek)
	return err == nil && c.closed
}

// peekFD runs inside RawConn.Control: it never blocks.
func (c *staleCheckConn) peekFD(fd uintptr) {
	n, _, err := syscall.Recvfrom(int(fd), c.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == nil && n == 0: // orderly shutdown by the replica
		c.closed = true
	case err == nil: // unasked bytes: a TLS close_notify, or anything else
		c.closed = true
	case err == syscall.ECONNRESET || err == syscall.EPIPE:
		c.closed = true
	}
}

// connLost reports whether an I/O error says the peer closed or reset the
// connection.
func connLost(err error) bool {
	return err == io.EOF || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// tlsRefused returns the refused handshake (staleCheckConn.refused) of the
// connection of a failed attempt, or nil. Valid after a failed attempt
// only, like lostReusedConn.
func tlsRefused(resp *fasthttp.Response) *HandshakeError {
	if a, ok := resp.RemoteAddr().(*connAddr); ok && a.c.refused != nil {
		return a.c.refused
	}
	return nil
}

// staleAtSend reports whether the attempt that filled resp found its
// reused connection closed by the stale check made when the request was
// about to be sent (sendAndRead): nothing was sent. Valid after a failed
// attempt only, like lostReusedConn.
func staleAtSend(resp *fasthttp.Response) bool {
	a, ok := resp.RemoteAddr().(*connAddr)
	return ok && a.c.stale
}

// lostReusedConn reports whether the attempt that filled resp ran on a
// reused connection that the replica closed or reset before the first
// response byte. Valid after a failed attempt only: fasthttp has closed
// that connection, so nothing else uses it.
func lostReusedConn(resp *fasthttp.Response) bool {
	a, ok := resp.RemoteAddr().(*connAddr)
	return ok && a.c.lost
}
