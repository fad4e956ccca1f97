package proxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/internal/poll"
)

// bodyOf returns n bytes that differ along their length, so that a byte
// out of place shows.
func bodyOf(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26 + i/4096%3)
	}
	return b
}

// digestReplica answers each request with the length and SHA-256 of the
// body it received, read from its stream.
func digestReplica(t *testing.T, name string) *testReplica {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return digestReplicaOn(t, name, ln)
}

// digestReplicaOn is digestReplica serving ln.
func digestReplicaOn(t *testing.T, name string, ln net.Listener) *testReplica {
	r := &testReplica{name: name, ln: ln, keys: map[string]int{}}
	r.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			r.count.Add(1)
			h := sha256.New()
			n, err := io.Copy(h, ctx.RequestBodyStream())
			if err != nil {
				ctx.SetStatusCode(599)
				return
			}
			ctx.SetBodyString(fmt.Sprintf("%d %x", n, h.Sum(nil)))
		},
		StreamRequestBody:     true,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		NoDefaultDate:         true,
	}
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		_ = r.srv.Shutdown()
	})
	return r
}

func digest(b []byte) string { return fmt.Sprintf("%d %x", len(b), sha256.Sum256(b)) }

// TestBodiesArriveByteExact: bodies below, at and past the body buffer,
// framed by Content-Length or chunked, arrive at the replica byte for
// byte.
func TestBodiesArriveByteExact(t *testing.T) {
	rep := digestReplica(t, "r0")
	_, addr := startProxy(t, nil, rep)
	for _, n := range []int{0, 1, 8 << 10, 16<<10 + 1, 64 << 10, 64<<10 + 1, 1 << 20, 7 << 20} {
		body := bodyOf(n)
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d bytes chunked %v", n, chunked), func(t *testing.T) {
				rc := dialRaw(t, addr)
				_ = rc.c.SetDeadline(time.Now().Add(20 * time.Second))
				head := "POST /ingest HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\n"
				go func() {
					w := bufio.NewWriterSize(rc.c, 64<<10)
					if chunked {
						fmt.Fprintf(w, "%sTransfer-Encoding: chunked\r\n\r\n", head)
						for off := 0; off < n; off += 10000 {
							c := body[off:min(n, off+10000)]
							fmt.Fprintf(w, "%x\r\n%s\r\n", len(c), c)
						}
						io.WriteString(w, "0\r\n\r\n")
					} else {
						fmt.Fprintf(w, "%sContent-Length: %d\r\n\r\n", head, n)
						w.Write(body)
					}
					w.Flush()
				}()
				r := rc.read(t)
				if r.status != 200 || r.body != digest(body) {
					t.Fatalf("got %v, want 200 %q", r, digest(body))
				}
			})
		}
	}
}

// TestStreamedBodyNotReplayed: a body streamed past its buffer is sent
// once: a replica that fails while it is streamed gets no second try on
// another replica, even for an idempotent method; a body within the
// buffer is replayed.
func TestStreamedBodyNotReplayed(t *testing.T) {
	var broken atomic.Int64
	bad := startRawReplica(t, "bad", func(req *fasthttp.Request, c net.Conn) bool {
		broken.Add(1)
		return false // close without an answer, the body read
	})
	good := digestReplica(t, "good")
	p, addr := startProxy(t, nil, bad, good)
	key := keyOwnedBy(t, p, "bad")
	for _, c := range []struct {
		n        int
		replayed bool
	}{{32 << 10, true}, {1 << 20, false}} {
		body := bodyOf(c.n)
		before := good.count.Load()
		r := newClient(addr).do(t, "PUT", "/ingest", string(body), "X-Key", key)
		switch {
		case c.replayed && (r.status != 200 || r.body != digest(body)):
			t.Fatalf("%d bytes, buffered: got %v, want the replay's 200 %q", c.n, r, digest(body))
		case !c.replayed && r.status != 502:
			t.Fatalf("%d bytes, streamed: got %v, want 502", c.n, r)
		case !c.replayed && good.count.Load() != before:
			t.Fatalf("%d bytes, streamed: sent again to another replica", c.n)
		}
	}
	if broken.Load() < 2 {
		t.Fatalf("the failing replica saw %d requests, want both", broken.Load())
	}
}

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestSlowBodyHoldsNoReplicaConnection: a request whose body has not
// arrived up to its buffer holds no replica connection; once it has, it
// is forwarded.
func TestSlowBodyHoldsNoReplicaConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	rep := digestReplicaOn(t, "r0", cl)
	_, addr := startProxy(t, nil, rep)

	const n = 40 << 10
	body := bodyOf(n)
	rc := dialRaw(t, addr)
	rc.send(t, "POST /ingest HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n")
	rc.send(t, string(body[:20<<10])) // past fasthttp's 8 KiB, short of the body
	// Another request is served meanwhile, on its own replica connection.
	if r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k2"); r.status != 200 {
		t.Fatalf("another request: %v", r)
	}
	if got := cl.n.Load(); got != 1 {
		t.Fatalf("the replica accepted %d connections, want 1: the slow body's request took one", got)
	}
	rc.send(t, string(body[20<<10:]))
	if r := rc.read(t); r.status != 200 || r.body != digest(body) {
		t.Fatalf("the slow body: %v", r)
	}
}

// TestClientBodyFailureNotBlamed: a client that stops in the middle of a
// streamed body fails its own request: the replica is not blamed (no
// upstream error counted, not ejected) and serves the next request.
func TestClientBodyFailureNotBlamed(t *testing.T) {
	rep := digestReplica(t, "r0")
	p, addr := startProxy(t, func(c *Config) { c.Server.ReadTimeout = 500 * time.Millisecond }, rep)
	rc := dialRaw(t, addr)
	rc.send(t, "POST /ingest HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\nContent-Length: 1048576\r\n\r\n")
	rc.send(t, strings.Repeat("x", 300<<10)) // past the buffer: streaming
	r := rc.read(t)                          // server.read_timeout runs out
	if r.status != 408 {
		t.Fatalf("a body that stalled while streamed: %v, want 408", r)
	}
	b := backendNamed(t, p, "r0")
	for k := range b.ctr.upErrs {
		if n := b.ctr.upErrs[k].Load(); n != 0 {
			t.Fatalf("upstream errors of kind %v: %d, want none: the client failed", errKind(k), n)
		}
	}
	poll.Until(t, 5*time.Second, "the next request", func() bool {
		return newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k1").status == 200
	})
}

// TestBodyLimitFromContentLength: a Content-Length over max_body_bytes is
// refused before its body is read, and a chunked body past it once it
// passes it.
func TestBodyLimitFromContentLength(t *testing.T) {
	rep := digestReplica(t, "r0")
	_, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].MaxBodyBytes = 100 << 10 }, rep)
	rc := dialRaw(t, addr)
	rc.send(t, "POST /ingest HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\nContent-Length: 104857600\r\n\r\nabc")
	if r := rc.read(t); r.status != 413 {
		t.Fatalf("Content-Length 100 MiB: %v, want 413", r)
	}
	rc = dialRaw(t, addr)
	var buf bytes.Buffer
	buf.WriteString("POST /ingest HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\nTransfer-Encoding: chunked\r\n\r\n")
	for range 30 {
		fmt.Fprintf(&buf, "%x\r\n%s\r\n", 10000, bytes.Repeat([]byte("y"), 10000))
	}
	buf.WriteString("0\r\n\r\n")
	go func() { _, _ = rc.c.Write(buf.Bytes()) }()
	if r := rc.read(t); r.status != 413 {
		t.Fatalf("chunked 300 KB past 100 KiB: %v, want 413", r)
	}
	if n := rep.count.Load(); n > 1 {
		t.Fatalf("the replica saw %d requests", n)
	}
}

// TestLargeRepliesStreamed: replies past the buffer, framed by
// Content-Length or chunked, reach the client byte for byte (a chunked
// one chunked, a Content-Length one with it), and the replica's
// connection is reused after a reply streamed whole; an HTTP/1.0 client
// gets a chunked reply read whole, with a Content-Length.
func TestLargeRepliesStreamed(t *testing.T) {
	body := bodyOf(3 << 20)
	var conns atomic.Int64
	rep := startReplica(t, "r0")
	countNew := func(_ net.Conn, s fasthttp.ConnState) {
		if s == fasthttp.StateNew {
			conns.Add(1)
		}
	}
	rep.connState.Store(&countNew)
	rep.setHandler(func(ctx *fasthttp.RequestCtx) {
		if string(ctx.QueryArgs().Peek("chunked")) == "1" {
			ctx.SetBodyStream(bytes.NewReader(body), -1)
			return
		}
		ctx.SetBody(body)
	})
	_, addr := startProxy(t, nil, rep)
	rc := dialRaw(t, addr)
	for _, q := range []string{"", "?chunked=1", "", "?chunked=1"} {
		rc.send(t, "GET /big"+q+" HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\n\r\n")
		r := rc.read(t)
		if r.status != 200 || r.body != string(body) {
			t.Fatalf("%s: status %d, %d bytes, want 200 and %d bytes", q, r.status, len(r.body), len(body))
		}
		if cl := r.header["Content-Length"]; q != "" && cl != "" || q == "" && cl != strconv.Itoa(len(body)) {
			t.Fatalf("%q: Content-Length %q: a chunked reply is relayed chunked, one with a length with it", q, cl)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("the replica saw %d connections for 4 requests in a row, want 1: the streamed replies' connection was not reused", n)
	}
	c10 := dialRaw(t, addr)
	c10.send(t, "GET /big?chunked=1 HTTP/1.0\r\nHost: a\r\nX-Key: k1\r\n\r\n")
	r := c10.read(t)
	if r.status != 200 || r.body != string(body) || r.header["Content-Length"] != strconv.Itoa(len(body)) {
		t.Fatalf("HTTP/1.0: status %d, %d bytes, Content-Length %q", r.status, len(r.body), r.header["Content-Length"])
	}
}

// TestStreamedReplyCutAtLimit: a reply of unknown length that passes
// max_response_body_bytes within the buffer gets 502; one that passes it
// after the buffer, while streamed, is cut there: the client's
// connection closes mid-body and it never reads a whole 200.
func TestStreamedReplyCutAtLimit(t *testing.T) {
	rep := startReplica(t, "r0")
	rep.setHandler(func(ctx *fasthttp.RequestCtx) {
		n, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("n")))
		ctx.SetBodyStream(bytes.NewReader(bodyOf(n)), -1) // chunked
	})
	_, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].MaxResponseBodyBytes = 200 << 10 }, rep)
	rc := dialRaw(t, addr)
	rc.send(t, "GET /a?n=150000 HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\n\r\n")
	if r := rc.read(t); r.status != 200 || len(r.body) != 150000 {
		t.Fatalf("a streamed reply within the limit: %d, %d bytes", r.status, len(r.body))
	}
	rc.send(t, "GET /a?n=1000000 HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\n\r\n")
	r, err := rc.tryRead()
	if err == nil {
		t.Fatalf("a reply past the limit while streamed was read whole: %d, %d bytes", r.status, len(r.body))
	}
	if !rc.closedByPeer(5 * time.Second) {
		t.Fatal("the client's connection stayed open after a cut reply")
	}
}
