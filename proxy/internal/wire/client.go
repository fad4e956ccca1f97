package wire

import (
	"cmp"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Front is the client side's shared state: what its listener, its
// connections and its parker use. The zero value lingers for
// DefaultLingerTime and parks nothing; set the fields before Listen.
type Front struct {
	// LingerTime bounds one connection's lingering close; 0 is
	// DefaultLingerTime.
	LingerTime time.Duration
	// Full is the whole answer (status line, head and body) to a
	// connection that would take the open ones, served and parked, beyond
	// the server's connection limit. fasthttp counts only the connections
	// it serves, so the listener refuses beyond the sum itself.
	Full []byte
	// Parker parks idle keep-alive connections; nil: none park.
	Parker *Parker

	lingering lingerTracker
	open      connSet // the connections Listen accepted, until closed
}

// Listen returns ln's connections as ClientConns. scan says whether they
// carry plain HTTP, whose request heads are followed (HeadScan) and which
// may park; beneath TLS they linger only, and TLSListener follows the
// heads above TLS.
func (f *Front) Listen(ln net.Listener, scan bool) *Listener {
	return &Listener{Listener: ln, front: f, scan: scan, accepting: make(chan struct{}), closed: make(chan struct{})}
}

// StopLingering ends every lingering close (within lingerPoll) and waits
// for them; connections closed afterwards close at once.
func (f *Front) StopLingering() { f.lingering.stopAndWait() }

// CloseWaiting closes the connections no request is arriving on: opened
// or answered, and not a byte read since, nor any waiting to be read. A
// stopping server calls it once its grace for such connections is over:
// fasthttp's Shutdown closes a keep-alive connection idle after an
// answer, but one that never carried a request only 5 seconds after it
// opened. A connection with input that its goroutine has not read yet
// (a request that arrived at the last moment, a parked connection the
// parker just woke) is left to be served: fasthttp answers it with close.
// It returns how many it closed. Parked connections are the Parker's to
// close.
func (f *Front) CloseWaiting() int {
	n := 0
	for _, c := range f.open.list() {
		if c.waiting.Load() && !c.hasInput() {
			_ = c.Conn.Close()
			n++
		}
	}
	return n
}

// PendingInput is the number of waiting connections (as CloseWaiting
// sees them) with input that their goroutine has not read yet: a stopping
// server lets them read it before its shutdown closes idle connections.
func (f *Front) PendingInput() int {
	n := 0
	for _, c := range f.open.list() {
		if c.waiting.Load() && c.hasInput() {
			n++
		}
	}
	return n
}

// FreshWaiting is the number of connections no byte has arrived on since
// they opened, and none waits unread: their clients have just dialed, and
// their first request is on its way. A stopping server that no longer
// accepts waits a moment for them before CloseWaiting closes the rest.
func (f *Front) FreshWaiting() int {
	n := 0
	for _, c := range f.open.list() {
		if c.fresh.Load() && c.waiting.Load() && !c.hasInput() {
			n++
		}
	}
	return n
}

// Open is the number of connections the front end's listeners accepted
// that are not closed yet: served, parked, woken from parking or waiting
// for their first request. A draining server waits for it to reach zero.
func (f *Front) Open() int { return f.open.count() }

// hasInput reports whether bytes wait on c's socket, unread.
func (c *ClientConn) hasInput() bool {
	if c.tcp == nil {
		return false
	}
	rc, err := c.tcp.SyscallConn()
	if err != nil {
		return false
	}
	in := false
	_ = rc.Control(func(fd uintptr) { in = inputFD(fd) })
	return in
}

// connSet is a set of connections, safe for concurrent use.
type connSet struct {
	mu sync.Mutex
	m  map[*ClientConn]struct{}
}

func (s *connSet) add(c *ClientConn) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*ClientConn]struct{}{}
	}
	s.m[c] = struct{}{}
	c.tracked = true
	s.mu.Unlock()
}

// remove forgets c; a connection that was never added costs nothing.
func (s *connSet) remove(c *ClientConn) {
	if !c.tracked {
		return
	}
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

func (s *connSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

func (s *connSet) list() []*ClientConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*ClientConn, 0, len(s.m))
	for c := range s.m {
		out = append(out, c)
	}
	return out
}

// Listener is the front end's listener: it accepts ClientConns, and it
// tells when the server first accepts.
type Listener struct {
	net.Listener
	front     *Front
	scan      bool
	once      sync.Once
	accepting chan struct{} // closed when the server first calls Accept

	stopOnce  sync.Once
	stopping  atomic.Bool
	closeOnce sync.Once
	closed    chan struct{} // closed by Close
	closeErr  error
}

// Accepting is closed once the server called Accept. fasthttp's Shutdown
// only sees listeners Serve has registered, which it does just before its
// first Accept: a Shutdown must wait for it.
func (l *Listener) Accepting() <-chan struct{} { return l.accepting }

func (l *Listener) Accept() (net.Conn, error) {
	l.once.Do(func() { close(l.accepting) })
	c, err := l.Listener.Accept()
	for err == nil && l.front.Parker != nil && l.front.Parker.full() {
		refuse(c, l.front.Full)
		c, err = l.Listener.Accept()
	}
	if err != nil {
		if l.stopping.Load() {
			// StopAccepting closed the socket: the server keeps running,
			// counting its connections as usual, until Close.
			<-l.closed
			return nil, net.ErrClosed
		}
		return nil, err
	}
	cc := NewClientConn(c, l.front, l.scan)
	l.front.open.add(cc)
	return cc, nil
}

// StopAccepting closes the listening socket while the server keeps
// serving the connections it has: its Accept waits for Close instead of
// failing, so that the server does not stop, and its count of open
// connections (fasthttp's, which counts a running Serve as one) stays
// true. New connections are refused by the kernel, or, when another
// process holds a copy of the socket (an upgrade's new process), accepted
// there.
func (l *Listener) StopAccepting() {
	l.stopOnce.Do(func() {
		l.stopping.Store(true)
		l.closeErr = l.Listener.Close()
	})
}

// Close closes the listener; closing it again, or after StopAccepting,
// returns the first close's result (fasthttp's Shutdown closes the
// listeners it serves whatever their state).
func (l *Listener) Close() error {
	l.StopAccepting()
	l.closeOnce.Do(func() { close(l.closed) })
	return l.closeErr
}

// refuse answers a connection beyond the connection limit and closes it,
// as fasthttp does with one over its Concurrency.
func refuse(c net.Conn, answer []byte) {
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(answer)
	_ = c.Close()
}

// ClientConn is a client connection keyway accepted: the one connection
// type of the client side. It
//
//   - follows each request head it reads (HeadScan) when it carries plain
//     HTTP (beneath TLS, TLSClientConn follows them above it);
//   - parks while idle (Parker), if it is a plain TCP connection and a
//     parker runs;
//   - closes lingering once asked to (MarkLinger), if it is TCP.
//
// Why lingering: when keyway answers a request it could not read (headers
// over max_header_bytes, a body over the limit) the client is usually
// still sending. Closing a socket with unread input makes the kernel send
// RST at once, and the client loses the 431/413 it has not read yet
// (fasthttp#1348; nginx's lingering_close exists for the same reason). A
// marked connection instead half-closes (FIN after the answer) and reads
// and discards what the client still sends, for a bounded time and size,
// before it really closes.
//
// fasthttp reads and writes it, and calls ConnState, from the connection's
// serving goroutine only. It must not be copied.
type ClientConn struct {
	net.Conn
	tcp    *net.TCPConn // the socket, for lingering and parking; nil: not TCP
	front  *Front
	scan   bool // follow request heads (plain HTTP); only these park
	linger atomic.Bool
	head   HeadScan
	ps     parkState
	// waiting: no byte of a request has arrived since the connection
	// opened or its last answer (CloseWaiting closes such connections).
	waiting atomic.Bool
	// fresh: no byte has arrived since the connection opened. Its client
	// dialed to send a request: a stopping server waits a moment for it
	// (FreshWaiting) rather than closing the connection under it.
	fresh   atomic.Bool
	tracked bool // in front.open
}

// NewClientConn wraps c, accepted by f's listener; scan as for Listen.
func NewClientConn(c net.Conn, f *Front, scan bool) *ClientConn {
	tc, _ := c.(*net.TCPConn)
	cc := &ClientConn{Conn: c, tcp: tc, front: f, scan: scan}
	cc.waiting.Store(true)
	cc.fresh.Store(true)
	return cc
}

func (c *ClientConn) Read(b []byte) (int, error) {
	if !c.scan {
		n, err := c.Conn.Read(b)
		if n > 0 && c.waiting.Load() {
			c.waiting.Store(false)
			c.fresh.Store(false)
		}
		return n, err
	}
	if c.head.st == hsBare {
		return 0, ErrBareLF
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.ps.parkAt = false
		if c.waiting.Load() {
			c.waiting.Store(false)
			c.fresh.Store(false)
		}
	} else if err != nil && c.parkDue(err) {
		c.ps.parking.Store(true)
		return 0, ErrParked
	}
	c.head.Scan(b[:n])
	return n, err
}

// SetReadDeadline is the connection's, but the wait for a keep-alive
// request ends at the parker's park deadline instead (see Parker).
func (c *ClientConn) SetReadDeadline(t time.Time) error {
	if pk := c.front.Parker; pk != nil && c.scan && c.tcp != nil {
		return c.parkingSetReadDeadline(pk, t)
	}
	return c.Conn.SetReadDeadline(t)
}

// Close parks the connection if its idle wait ran out (Read reported
// ErrParked), closes it lingering if it was marked (MarkLinger), and
// closes it otherwise.
func (c *ClientConn) Close() error {
	if c.ps.parking.CompareAndSwap(true, false) && c.front.Parker.park(c) {
		return nil
	}
	c.front.open.remove(c)
	if c.tcp == nil || !c.linger.Load() || !c.front.lingering.start() {
		return c.Conn.Close()
	}
	if err := c.tcp.CloseWrite(); err != nil {
		c.front.lingering.done()
		return c.tcp.Close()
	}
	go func() {
		defer c.front.lingering.done()
		drain(c.tcp, cmp.Or(c.front.LingerTime, DefaultLingerTime), &c.front.lingering.stopping)
	}()
	return nil
}

// ReadFrom copies a body stream fasthttp writes to the client (a streamed
// reply) in pieces of up to 64 KiB rather than its 4 KiB write buffer's
// (see headWriter.ReadFrom), without the 32 KiB buffer io.Copy would
// allocate for each.
func (c *ClientConn) ReadFrom(r io.Reader) (int64, error) { return copyBuffered(c.Conn, r) }

// TLSListener follows the request heads of the TLS connections ln
// accepts, whose plaintext only the TLS connection sees. ln is a TLS
// listener over a Front's Listener (scan off): the TCP connections
// beneath TLS linger, and a lingering close drains the socket after TLS's
// close_notify.
func TLSListener(ln net.Listener) net.Listener { return tlsListener{ln} }

type tlsListener struct{ net.Listener }

func (l tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(tlsConn); ok {
		return &TLSClientConn{tlsConn: tc}, nil
	}
	return NewClientConn(c, &scanOnly, true), nil
}

// scanOnly is the Front of connections that are only scanned.
var scanOnly Front

// tlsConn is what a TLS server connection offers: fasthttp takes a
// connection with Handshake and ConnectionState for TLS (RequestCtx.IsTLS),
// and NetConn leads MarkLinger to the ClientConn beneath.
type tlsConn interface {
	net.Conn
	Handshake() error
	ConnectionState() tls.ConnectionState
	NetConn() net.Conn
}

// TLSClientConn is a TLS client connection whose request heads are
// followed above TLS. It is ClientConn's counterpart above TLS, with the
// TLS connection's methods, so that fasthttp still takes it for TLS: a
// ClientConn cannot have them, or fasthttp would take every connection
// for TLS. It must not be copied.
type TLSClientConn struct {
	tlsConn
	head HeadScan
}

func (c *TLSClientConn) Read(b []byte) (int, error) {
	if c.head.st == hsBare {
		return 0, ErrBareLF
	}
	n, err := c.tlsConn.Read(b)
	c.head.Scan(b[:n])
	return n, err
}

// MarkLinger asks for a lingering close of c (under TLS, of the TCP
// connection beneath it), if it is a ClientConn.
func MarkLinger(c net.Conn) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	if cc, ok := c.(*ClientConn); ok {
		cc.linger.Store(true)
	}
}

// HeadOf returns the scan of the request head c is reading, or nil where
// none is followed (ciphertext beneath TLS, a connection keyway did not
// accept itself: tests that drive the handler directly).
func HeadOf(c net.Conn) *HeadScan {
	switch c := c.(type) {
	case *ClientConn:
		if c.scan {
			return &c.head
		}
	case *TLSClientConn:
		return &c.head
	}
	return nil
}

// ConnState is fasthttp's ConnState hook for the front end: it starts a
// new scan for each request on a connection (see HeadScan), and tells a
// ClientConn that the next read deadline fasthttp sets is the wait for a
// keep-alive request's first byte (see Parker).
func ConnState(c net.Conn, state fasthttp.ConnState) {
	if state == fasthttp.StateIdle {
		if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
			c = tc.NetConn() // the TCP connection beneath TLS
			if cc, ok := c.(*ClientConn); ok {
				cc.waiting.Store(true)
			}
		} else if cc, ok := c.(*ClientConn); ok {
			cc.ps.idleNext = true
			cc.waiting.Store(true)
		}
	}
	s := HeadOf(c)
	if s == nil {
		return
	}
	switch state {
	case fasthttp.StateIdle:
		// The request was answered: what the connection reads next
		// belongs to the next request's head.
		s.Reset()
	case fasthttp.StateActive:
		// fasthttp has the head's first byte. If the scan did not see
		// it, the head came with the request before it (pipelined) and
		// began before the scan, which cannot follow it.
		if !s.seen {
			s.st = hsOff
		}
	}
}

const (
	// DefaultLingerTime is the longest a closed connection is drained.
	DefaultLingerTime = 2 * time.Second
	lingerMaxBytes    = 64 << 20 // most bytes drained from one connection
	lingerPoll        = 100 * time.Millisecond
)

// lingerTracker counts draining connections so that the server can stop
// and wait for them. A WaitGroup does not fit: fasthttp closes a
// connection after it stopped counting it as open, so a Close may come
// after Shutdown returned, and WaitGroup forbids an Add from zero
// concurrent with Wait. The zero value is ready to use.
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
