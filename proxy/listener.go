package proxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// frontListener is the listener the front end serves. It tells Run when
// Serve is accepting, and it gives TCP connections a lingering close.
//
// Why lingering: when keyway answers a request it could not read (headers
// over max_header_bytes, a body over the limit) the client is usually still
// sending. Closing a socket with unread input makes the kernel send RST at
// once, and the client loses the 431/413 it has not read yet
// (fasthttp#1348; nginx's lingering_close exists for the same reason). A
// marked connection instead half-closes (FIN after the answer) and reads
// and discards what the client still sends, for a bounded time and size,
// before it really closes.
type frontListener struct {
	net.Listener
	p         *Proxy
	once      sync.Once
	accepting chan struct{} // closed when Serve first calls Accept
}

func newFrontListener(ln net.Listener, p *Proxy) *frontListener {
	return &frontListener{Listener: ln, p: p, accepting: make(chan struct{})}
}

func (l *frontListener) Accept() (net.Conn, error) {
	l.once.Do(func() { close(l.accepting) })
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &lingerConn{TCPConn: tc, p: l.p}, nil
	}
	return c, nil
}

const (
	defaultLingerTime = 2 * time.Second // longest a closed connection is drained (Proxy.lingerTime)
	lingerMaxBytes    = 64 << 20        // most bytes drained from one connection
	lingerPoll        = 100 * time.Millisecond
)

// lingerConn is a client connection that can close gracefully; see
// frontListener. It must not be copied.
type lingerConn struct {
	*net.TCPConn
	p      *Proxy
	linger atomic.Bool
}

// markLinger asks for a lingering close of the connection that carried ctx.
func markLinger(c net.Conn) {
	if lc, ok := c.(*lingerConn); ok {
		lc.linger.Store(true)
	}
}

func (c *lingerConn) Close() error {
	if !c.linger.Load() {
		return c.TCPConn.Close()
	}
	if err := c.TCPConn.CloseWrite(); err != nil {
		return c.TCPConn.Close()
	}
	c.p.lingering.Add(1)
	go func() {
		defer c.p.lingering.Done()
		drain(c.TCPConn, c.p.lingerTime, &c.p.stopLinger)
	}()
	return nil
}

// drain reads and discards until EOF, an error, linger time or
// lingerMaxBytes, or until stop is set, then closes the connection.
func drain(c *net.TCPConn, linger time.Duration, stop *atomic.Bool) {
	defer c.Close()
	var buf [4096]byte
	end := time.Now().Add(linger)
	for n := 0; n < lingerMaxBytes && !stop.Load(); {
		now := time.Now()
		if !now.Before(end) {
			return
		}
		dl := now.Add(lingerPoll)
		if dl.After(end) {
			dl = end
		}
		_ = c.SetReadDeadline(dl)
		m, err := c.Read(buf[:])
		n += m
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return
		}
	}
}
