package proxy

import (
	"errors"
	"net"
	"syscall"
)

// errStaleConn is returned when keyway is about to reuse a pooled
// connection that the replica has already closed (it crashed, restarted or
// idled the connection out). Nothing was written: the request never
// reached the replica, so it is always safe to send it again.
var errStaleConn = errors.New("proxy: pooled connection already closed by the replica")

// staleCheckConn wraps a connection to a replica. Before the first write
// that follows a read — that is, before a pooled connection is reused for
// the next request — it peeks at the socket without blocking: a closed or
// reset socket fails the write with errStaleConn instead of sending a
// request into a dead connection, whose fate keyway could then not know
// (a non-replayable POST would get 502). The check is one non-blocking
// recvfrom(MSG_PEEK) per reuse and allocates nothing.
//
// It cannot close the race in which the replica closes the connection
// while the request is on its way; keeping timeouts.idle below the
// replica's keep-alive timeout does.
type staleCheckConn struct {
	net.Conn
	raw      syscall.RawConn // nil when the conn exposes no file descriptor
	peek     func(fd uintptr) bool
	readSeen bool
	closed   bool
	buf      [1]byte
}

func newStaleCheckConn(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	s := &staleCheckConn{Conn: c, raw: raw}
	s.peek = s.peekFD
	return s
}

func (c *staleCheckConn) Read(b []byte) (int, error) {
	c.readSeen = true
	return c.Conn.Read(b)
}

func (c *staleCheckConn) Write(b []byte) (int, error) {
	if c.readSeen {
		c.readSeen = false
		c.closed = false
		if err := c.raw.Read(c.peek); err == nil && c.closed {
			return 0, errStaleConn
		}
	}
	return c.Conn.Write(b)
}

// peekFD runs inside RawConn.Read: it never blocks (it returns true).
func (c *staleCheckConn) peekFD(fd uintptr) bool {
	n, _, err := syscall.Recvfrom(int(fd), c.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == nil && n == 0: // orderly shutdown by the replica
		c.closed = true
	case err == syscall.ECONNRESET || err == syscall.EPIPE:
		c.closed = true
	}
	return true
}
