package proxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"keyway/tlsconfig"
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
//
// It also follows each request head a connection reads (headScan), unless
// the connections carry TLS: then tlsHeadListener does, above TLS.
type frontListener struct {
	net.Listener
	p         *Proxy
	scan      bool // follow request heads (plain HTTP)
	once      sync.Once
	accepting chan struct{} // closed when Serve first calls Accept
}

func newFrontListener(ln net.Listener, p *Proxy, scan bool) *frontListener {
	return &frontListener{Listener: ln, p: p, scan: scan, accepting: make(chan struct{})}
}

func (l *frontListener) Accept() (net.Conn, error) {
	l.once.Do(func() { close(l.accepting) })
	c, err := l.Listener.Accept()
	for err == nil && l.p.parker != nil && l.p.parker.full() {
		// fasthttp's Concurrency counts the connections it serves; the
		// parked ones count towards server.max_conns too.
		refuseConn(c)
		c, err = l.Listener.Accept()
	}
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &lingerConn{TCPConn: tc, p: l.p, scan: l.scan}, nil
	}
	if l.scan {
		return &headConn{Conn: c}, nil
	}
	return c, nil
}

// tlsHeadListener follows the request heads of TLS connections, whose
// plaintext only the TLS connection sees.
type tlsHeadListener struct{ net.Listener }

func (l tlsHeadListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*tlsconfig.Conn); ok {
		return &tlsHeadConn{Conn: tc}, nil
	}
	return &headConn{Conn: c}, nil
}

// headConn is a client connection whose request heads are followed. It
// must not be copied.
type headConn struct {
	net.Conn
	clientState
}

func (c *headConn) Read(b []byte) (int, error) {
	if c.head.st == hsBare {
		return 0, errBareLF
	}
	n, err := c.Conn.Read(b)
	c.head.scan(b[:n])
	return n, err
}

// tlsHeadConn is headConn for a TLS connection: it keeps the methods
// fasthttp looks for to know a connection is TLS (Handshake,
// ConnectionState), and NetConn for markLinger. It must not be copied.
type tlsHeadConn struct {
	*tlsconfig.Conn
	clientState
}

func (c *tlsHeadConn) Read(b []byte) (int, error) {
	if c.head.st == hsBare {
		return 0, errBareLF
	}
	n, err := c.Conn.Read(b)
	c.head.scan(b[:n])
	return n, err
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
	scan   bool // follow request heads in head (not beneath TLS); only these park
	clientState
	ps parkState // parking while idle (park.go)
}

func (c *lingerConn) Read(b []byte) (int, error) {
	if !c.scan {
		return c.TCPConn.Read(b)
	}
	if c.head.st == hsBare {
		return 0, errBareLF
	}
	n, err := c.TCPConn.Read(b)
	if n > 0 {
		c.ps.parkAt = false
	} else if err != nil && c.parkDue(err) {
		c.ps.parking.Store(true)
		return 0, errParked
	}
	c.head.scan(b[:n])
	return n, err
}

// SetReadDeadline is the TCP connection's, but the wait for a keep-alive
// request ends at server.park_idle_after instead (see park.go).
func (c *lingerConn) SetReadDeadline(t time.Time) error {
	if pk := c.p.parker; pk != nil && c.scan {
		return c.parkingSetReadDeadline(pk, t)
	}
	return c.TCPConn.SetReadDeadline(t)
}

// refuseConn answers a connection over server.max_conns with 503 and
// closes it, as fasthttp does with one over its Concurrency.
func refuseConn(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(maxConnsAnswer)
	_ = c.Close()
}

// markLinger asks for a lingering close of the connection that carried ctx
// (under TLS, of the TCP connection beneath it).
func markLinger(c net.Conn) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*lingerConn); ok {
		lc.linger.Store(true)
	}
}

func (c *lingerConn) Close() error {
	if c.ps.parking.CompareAndSwap(true, false) && c.p.parker.park(c) {
		return nil
	}
	if !c.linger.Load() || !c.p.lingering.start() {
		return c.TCPConn.Close()
	}
	if err := c.TCPConn.CloseWrite(); err != nil {
		c.p.lingering.done()
		return c.TCPConn.Close()
	}
	go func() {
		defer c.p.lingering.done()
		drain(c.TCPConn, c.p.lingerTime, &c.p.lingering.stopping)
	}()
	return nil
}

// lingerTracker counts draining connections so that Run can stop and wait
// for them. A WaitGroup does not fit: fasthttp closes a connection after
// it stopped counting it as open, so a Close may come after Shutdown
// returned, and WaitGroup forbids an Add from zero concurrent with Wait.
// The zero value is ready to use.
type lingerTracker struct {
	stopping atomic.Bool // drainers poll it
	mu       sync.Mutex
	cond     *sync.Cond
	n        int
	stopped  bool
}

// start registers a draining connection; false once stopped.
func (t *lingerTracker) start() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.n++
	return true
}

func (t *lingerTracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.cond != nil {
		t.cond.Broadcast()
	}
	t.mu.Unlock()
}

// stopAndWait ends every drain (within lingerPoll) and waits for them;
// connections closed afterwards close at once.
func (t *lingerTracker) stopAndWait() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	t.stopping.Store(true)
	if t.cond == nil {
		t.cond = sync.NewCond(&t.mu)
	}
	for t.n > 0 {
		t.cond.Wait()
	}
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
