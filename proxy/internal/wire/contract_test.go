package wire

// Contract tests: one per assumption keyway makes about fasthttp or Go
// that their documentation does not promise. Each fails loudly, naming
// what breaks in keyway, when an upgrade changes the behaviour. Operators
// read the same list, with what breaks without each, in docs/proxy.md:
// a new test here needs its line there.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/internal/poll"
)

// TestContractPeek: a non-blocking MSG_PEEK through RawConn.Control tells
// an idle pooled connection that is open and quiet from one the peer
// closed, reset or sent bytes on, consumes nothing, and runs although the
// connection's read deadline has passed (fasthttp leaves the last reply's
// deadline on a pooled connection). Without it: a request sent into a
// connection the replica closed gets 502 instead of going out on a fresh
// one (the stale check, ReplicaConn).
func TestContractPeek(t *testing.T) {
	if !peekSupported {
		t.Skip("no peek on this OS: the stale check is off")
	}
	pair := func(t *testing.T) (c, s net.Conn) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		acc := make(chan net.Conn, 1)
		go func() { s, _ := ln.Accept(); acc <- s }()
		if c, err = net.Dial("tcp", ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
		s = <-acc
		t.Cleanup(func() { c.Close(); s.Close() })
		if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	peekOf := func(t *testing.T, c net.Conn) (bool, error) {
		raw, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var closed bool
		err = raw.Control(func(fd uintptr) { closed = peekFD(fd) })
		return closed, err
	}
	// until peeks until the peer's signal has arrived (loopback: at once).
	until := func(t *testing.T, c net.Conn) {
		var err error
		poll.Until(t, 5*time.Second, "the peek to see the peer's close, reset or bytes", func() bool {
			var closed bool
			closed, err = peekOf(t, c)
			return err != nil || closed
		})
		if err != nil {
			t.Fatalf("RawConn.Control with a passed read deadline: %v", err)
		}
	}
	t.Run("open and quiet", func(t *testing.T) {
		c, _ := pair(t)
		if closed, err := peekOf(t, c); err != nil || closed {
			t.Fatalf("peek on an open, quiet connection: closed %v, %v", closed, err)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		c, s := pair(t)
		s.Write([]byte("x"))
		until(t, c)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		if n, err := c.Read(b[:]); n != 1 || err != nil || b[0] != 'x' {
			t.Fatalf("the peek consumed the byte: read %d %q %v", n, b[:n], err)
		}
	})
	t.Run("FIN", func(t *testing.T) {
		c, s := pair(t)
		s.Close()
		until(t, c)
	})
	t.Run("RST", func(t *testing.T) {
		c, s := pair(t)
		s.(*net.TCPConn).SetLinger(0)
		s.Close()
		until(t, c)
	})
}

// TestContractPooledConnIsTheDialersConn: HostClient.AcquireConn hands out
// the very connection its Dial returned, and the one released last first
// (LIFO). Without it: RoundTrip cannot read what the ReplicaConn saw of an
// exchange, and every failed exchange loses its classification (a stale
// connection would count against the replica).
func TestContractPooledConnIsTheDialersConn(t *testing.T) {
	var mu sync.Mutex
	var dialed []net.Conn
	hc := &fasthttp.HostClient{
		Addr:             "replica:80",
		ConnPoolStrategy: fasthttp.LIFO,
		Dial: func(string) (net.Conn, error) {
			c, _ := net.Pipe()
			mu.Lock()
			dialed = append(dialed, c)
			mu.Unlock()
			return c, nil
		},
	}
	a, err := hc.AcquireConn(time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := hc.AcquireConn(time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	if a.Conn() != dialed[0] || b.Conn() != dialed[1] {
		t.Fatal("AcquireConn's connection is not the one Dial returned")
	}
	ca, cb := a.Conn(), b.Conn()
	hc.ReleaseConn(a)
	hc.ReleaseConn(b)
	c, err := hc.AcquireConn(time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Conn() != cb {
		t.Fatal("the pool did not hand out the connection released last (LIFO)")
	}
	d, err := hc.AcquireConn(time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	if d.Conn() != ca {
		t.Fatal("the pool did not reuse the connection released first")
	}
}

// recorder is a writer that keeps each write apart.
type recorder struct{ writes [][]byte }

func (r *recorder) Write(p []byte) (int, error) {
	r.writes = append(r.writes, bytes.Clone(p))
	return len(p), nil
}

// TestContractHeadFirst: Request.Write hands a request's head to the
// writer beneath a 4 KiB bufio.Writer within its first write, whole (a
// small head with its body, and a head larger than the buffer alike).
// Without it: the forwarding headers cannot be spliced after the head
// (headWriter) and every request keyway writes that way fails as
// ErrNoHeadEnd (503).
func TestContractHeadFirst(t *testing.T) {
	for name, head := range map[string]string{
		"small head": "X-Key: k\r\n",
		"large head": "X-Big: " + strings.Repeat("v", 6<<10) + "\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			var req fasthttp.Request
			raw := "POST /ingest HTTP/1.1\r\nHost: h\r\n" + head + "Content-Length: 4\r\n\r\nbody"
			if err := req.Read(bufio.NewReaderSize(strings.NewReader(raw), 16<<10)); err != nil {
				t.Fatal(err)
			}
			var rec recorder
			bw := bufio.NewWriterSize(&rec, headWriterBuf)
			if err := req.Write(bw); err != nil {
				t.Fatal(err)
			}
			bw.Flush()
			if len(rec.writes) == 0 || headEnd(rec.writes[0], len(req.Body())) < 0 {
				t.Fatalf("the first write holds no whole head: %d writes, first %q", len(rec.writes), rec.writes[0][:min(80, len(rec.writes[0]))])
			}
		})
	}
}

// serverConn is the server's side of a net.Pipe that records, in order,
// the read deadlines fasthttp sets and the ConnState hooks it calls, and
// fails a read with readErr once armed.
type serverConn struct {
	net.Conn
	mu      sync.Mutex
	events  []string
	readErr error
	closed  chan struct{}
	once    sync.Once
}

func (c *serverConn) note(e string) {
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
}

func (c *serverConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	err := c.readErr
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.note("read " + string(b[:n]))
	}
	return n, err
}

func (c *serverConn) SetReadDeadline(t time.Time) error {
	if !t.IsZero() {
		c.note("deadline " + time.Until(t).Round(time.Second).String())
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *serverConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// serve serves c with s on a goroutine; the returned channel is closed
// when ServeConn returns.
func serve(s *fasthttp.Server, c net.Conn) <-chan struct{} {
	done := make(chan struct{})
	go func() { _ = s.ServeConn(c); close(done) }()
	return done
}

// exchangeOn sends one request on the client side and reads its answer.
func exchangeOn(t *testing.T, client net.Conn, br *bufio.Reader, req string) {
	t.Helper()
	client.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(br); err != nil {
		t.Fatal(err)
	}
}

func newServer(sc *serverConn) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:     func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") },
		ReadTimeout: 3 * time.Second,
		IdleTimeout: 30 * time.Second,
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			sc.note("state " + st.String())
		},
	}
}

// TestContractIdleReadDeadline: once fasthttp has answered a request on a
// keep-alive connection (ConnState StateIdle), the first read deadline it
// sets is the wait for the next request's first byte, now + IdleTimeout.
// Without it: parking (park.go) takes some other deadline for the idle
// one, and parks connections in the middle of a request or never.
func TestContractIdleReadDeadline(t *testing.T) {
	client, server := net.Pipe()
	sc := &serverConn{Conn: server, closed: make(chan struct{})}
	defer client.Close()
	done := serve(newServer(sc), sc)
	br := bufio.NewReader(client)
	exchangeOn(t, client, br, "GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
	exchangeOn(t, client, br, "GET /b HTTP/1.1\r\nHost: h\r\n\r\n")
	client.Close()
	<-done
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i, e := range sc.events {
		if e != "state idle" {
			continue
		}
		for _, next := range sc.events[i+1:] {
			if strings.HasPrefix(next, "deadline ") {
				if next != "deadline 30s" {
					t.Fatalf("the first read deadline after StateIdle is %q, want the idle wait (30s); events %q", next, sc.events)
				}
				return
			}
		}
	}
	t.Fatalf("no read deadline after StateIdle; events %q", sc.events)
}

// errQuiet stands for keyway's errParked.
var errQuiet = errors.New("contract: connection parked")

// TestContractErrorBeforeFirstByte: an error from Read while fasthttp
// waits for a keep-alive connection's next request, before its first
// byte, ends the connection quietly: no answer, no ErrorHandler, the
// connection closed. Without it: a parked connection (errParked) gets an
// error answer written into it, and the client reads it as the answer to
// its next request.
func TestContractErrorBeforeFirstByte(t *testing.T) {
	client, server := net.Pipe()
	sc := &serverConn{Conn: server, closed: make(chan struct{})}
	defer client.Close()
	s := newServer(sc)
	var handlerErrs []error
	s.ErrorHandler = func(_ *fasthttp.RequestCtx, err error) { handlerErrs = append(handlerErrs, err) }
	s.ConnState = func(_ net.Conn, st fasthttp.ConnState) {
		if st == fasthttp.StateIdle {
			sc.mu.Lock()
			sc.readErr = errQuiet
			sc.mu.Unlock()
		}
	}
	done := serve(s, sc)
	br := bufio.NewReader(client)
	exchangeOn(t, client, br, "GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ServeConn did not return after the read error")
	}
	select {
	case <-sc.closed:
	default:
		t.Fatal("the connection was not closed")
	}
	client.SetReadDeadline(time.Now().Add(time.Second))
	if b, _ := io.ReadAll(br); len(b) > 0 {
		t.Fatalf("fasthttp wrote %q after the read error", b)
	}
	if len(handlerErrs) > 0 {
		t.Fatalf("ErrorHandler called with %v", handlerErrs)
	}
}

// TestContractStateActiveAfterFirstByte: fasthttp calls ConnState
// StateActive once a request's first byte has been read, and before it
// reads the rest of the head: for a request that was not pipelined, a read
// that returned its first bytes comes between StateIdle and StateActive.
// Without it: the head scan (headscan.go) takes every head for a
// pipelined one and is off, and heads ending in a bare LF wait for
// server.read_timeout again.
func TestContractStateActiveAfterFirstByte(t *testing.T) {
	client, server := net.Pipe()
	sc := &serverConn{Conn: server, closed: make(chan struct{})}
	defer client.Close()
	done := serve(newServer(sc), sc)
	br := bufio.NewReader(client)
	exchangeOn(t, client, br, "GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
	exchangeOn(t, client, br, "GET /b HTTP/1.1\r\nHost: h\r\n\r\n")
	client.Close()
	<-done
	sc.mu.Lock()
	defer sc.mu.Unlock()
	idle, read := -1, -1
	for i, e := range sc.events {
		switch {
		case e == "state idle":
			idle, read = i, -1
		case idle >= 0 && read < 0 && strings.HasPrefix(e, "read GET /b"):
			read = i
		case e == "state active" && idle >= 0:
			if read < 0 {
				t.Fatalf("StateActive before the request's first bytes were read; events %q", sc.events)
			}
			return
		}
	}
	t.Fatalf("no StateActive after StateIdle; events %q", sc.events)
}

// TestContractHeaderReceived: fasthttp calls HeaderReceived with the
// request's header before it reads any body, and a Content-Length of 0
// set there makes it read none: the handler runs at once. Without it: a
// request keyway refuses in the hook (a chunked request with a
// Content-Length) waits for a body the client may never end, and its 400
// comes only at server.read_timeout.
func TestContractHeaderReceived(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	handled := make(chan int, 1)
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			handled <- len(ctx.Request.Body())
			ctx.SetConnectionClose()
		},
		ReadTimeout: 10 * time.Second,
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			h.SetContentLength(0)
			h.Del("Transfer-Encoding")
			return fasthttp.RequestConfig{}
		},
	}
	done := serve(s, server)
	client.SetDeadline(time.Now().Add(5 * time.Second))
	// A chunked head with no chunk after it: fasthttp would wait for one.
	go client.Write([]byte("POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"))
	select {
	case n := <-handled:
		if n != 0 {
			t.Fatalf("the handler got a body of %d bytes", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not run at once: fasthttp waited for a body after HeaderReceived set Content-Length 0")
	}
	go io.Copy(io.Discard, client)
	<-done
}

// TestContractReadErrorReachesErrorHandler: an error a connection's Read
// returns while fasthttp reads a request's head reaches ErrorHandler
// wrapped so that errors.Is finds it. Without it: a head ending in a bare
// LF (errBareLF) gets fasthttp's generic 400 instead of keyway's answer.
func TestContractReadErrorReachesErrorHandler(t *testing.T) {
	errBare := errors.New("contract: bare LF")
	wrap := func(c net.Conn) net.Conn { return &failAfter{Conn: c, n: len("GET / HTTP/1.1\r\n"), err: errBare} }
	err := errorHandlerGets(t, &fasthttp.Server{}, wrap, "GET / HTTP/1.1\r\nHost: h\r\n")
	if !errors.Is(err, errBare) {
		t.Fatalf("ErrorHandler got %v, which does not wrap the connection's read error", err)
	}
}

// errorHandlerGets serves, with s, the server's side of a pipe (wrapped
// by wrap) to which the client writes req, and returns the error
// s.ErrorHandler got.
func errorHandlerGets(t *testing.T, s *fasthttp.Server, wrap func(net.Conn) net.Conn, req string) error {
	t.Helper()
	client, server := net.Pipe()
	defer client.Close()
	got := make(chan error, 1)
	s.Handler = func(*fasthttp.RequestCtx) {}
	s.ErrorHandler = func(_ *fasthttp.RequestCtx, err error) { got <- err }
	s.ReadTimeout = 10 * time.Second
	done := serve(s, wrap(server))
	client.SetDeadline(time.Now().Add(5 * time.Second))
	go client.Write([]byte(req))
	go io.Copy(io.Discard, client)
	var err error
	select {
	case err = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("ErrorHandler was not called")
	}
	client.Close()
	<-done
	return err
}

// failAfter is a connection whose reads fail with err once n bytes were
// read.
type failAfter struct {
	net.Conn
	n   int
	err error
}

func (c *failAfter) Read(b []byte) (int, error) {
	if c.n <= 0 {
		return 0, c.err
	}
	n, err := c.Conn.Read(b[:min(len(b), c.n)])
	c.n -= n
	return n, err
}

// TestContractSmallBuffer: a head longer than the server's ReadBufferSize
// is refused with an *ErrSmallBuffer. Without it: keyway answers 400
// instead of 431 (or 414 for a long request line).
func TestContractSmallBuffer(t *testing.T) {
	same := func(c net.Conn) net.Conn { return c }
	err := errorHandlerGets(t, &fasthttp.Server{ReadBufferSize: 1024}, same,
		"GET / HTTP/1.1\r\nHost: h\r\nX-Big: "+strings.Repeat("v", 4096)+"\r\n\r\n")
	var small *fasthttp.ErrSmallBuffer
	if !errors.As(err, &small) {
		t.Fatalf("a head over ReadBufferSize: %v, want an *ErrSmallBuffer", err)
	}
}
