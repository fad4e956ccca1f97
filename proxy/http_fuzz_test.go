package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// fuzzDeadline bounds one fuzz iteration's connection: every timeout of
// the fuzz proxy is a fraction of it, so a connection still open after it
// is a proxy that neither answered nor closed in time.
const fuzzDeadline = 5 * time.Second

// startFuzzProxy runs one proxy for a whole fuzz target (each fuzz worker
// process calls the target's setup once), with short timeouts so that a
// stuck connection shows up fast, and one set over rep.
func startFuzzProxy(f *testing.F, rep *testReplica) string {
	f.Helper()
	_, addr := startProxyOpts(f, Options{Logger: zap.NewNop()}, func(c *Config) {
		c.Server.ReadTimeout = 300 * time.Millisecond
		c.Server.WriteTimeout = 300 * time.Millisecond
		c.Server.IdleTimeout = 300 * time.Millisecond
		c.ReplicaSets[0].Timeouts.Connect = 300 * time.Millisecond
		c.ReplicaSets[0].Timeouts.Request = 500 * time.Millisecond
		c.ReplicaSets[0].Retries.Attempts = 1
	}, rep)
	return addr
}

// fuzzExchange writes raw to a new connection to addr, closes the writing
// side and reads until the proxy closes the connection. It fails the test
// when that takes longer than fuzzDeadline.
func fuzzExchange(t *testing.T, addr string, raw []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(fuzzDeadline))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The proxy may close before reading everything: a write error
		// is its right.
		if _, err := c.Write(raw); err == nil {
			_ = c.(*net.TCPConn).CloseWrite()
		}
	}()
	out, err := io.ReadAll(c)
	<-done
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the proxy neither answered nor closed within %v; got %q for %q", fuzzDeadline, out, raw)
	}
	return out
}

// wellFormedRequests counts the requests fasthttp reads off raw, one
// after the other, before the first it cannot read.
func wellFormedRequests(raw []byte) int {
	br := bufio.NewReader(bytes.NewReader(raw))
	n := 0
	for {
		var req fasthttp.Request
		req.Header.DisableNormalizing()
		if err := req.Read(br); err != nil {
			return n
		}
		n++
		if req.Header.ConnectionClose() {
			return n
		}
	}
}

// FuzzFrontEnd sends arbitrary bytes to a real proxy's front end, as a
// client connection, over a replica that records what it parses. The
// proxy never panics (a panic fails the worker), answers or closes within
// its deadlines, and a replica never receives more requests than the
// client sent well-formed ones: nothing the client sends is split into
// extra requests (request smuggling).
func FuzzFrontEnd(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\nX-Key: k\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /ingest HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 30\r\n\r\nabcGET / HTTP/1.1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
		"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\nHost: a\n\n",
		"POST / HTTP/1.1\nHost: a\nContent-Length: 6\n\nab\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc",
		"GET / HTTP/1.1\r\nHost: a\r\n X-Folded: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
		"GET /%2e%2e/ HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http://other/x HTTP/1.1\r\nHost: a\r\n\r\n",
		"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/9.9\r\n\r\n", "\x16\x03\x01\x00\x05hello", "", "\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	rep := startRawReplica(f, "r0", func(req *fasthttp.Request, c net.Conn) bool {
		msg := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		if req.Header.IsHead() {
			msg = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, err := io.WriteString(c, msg)
		return err == nil
	})
	addr := startFuzzProxy(f, rep)
	f.Fuzz(func(t *testing.T, raw []byte) {
		before := rep.count.Load()
		fuzzExchange(t, addr, raw)
		// The proxy closed the connection: every request it forwarded
		// for it has been answered, and so counted.
		if got, max := rep.count.Load()-before, int64(wellFormedRequests(raw)); got > max {
			t.Fatalf("the replica received %d requests for %d well-formed ones in %q", got, max, raw)
		}
	})
}

// FuzzReplicaResponse has a replica answer with arbitrary bytes, then
// close. The client gets either a well-formed response or keyway's 502
// (or 504, when the bytes frame no end before the request timeout), and
// nothing after it: never a half-framed response.
func FuzzReplicaResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk",
		"HTTP/1.1 200 OK\r\n\r\nread until close",
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 999 Weird\r\nX: \x00\r\n\r\n", "HTTP/1.1 200", "garbage\r\n\r\n", "",
	} {
		f.Add([]byte(s))
	}
	var answer atomic.Pointer[[]byte]
	rep := startRawReplica(f, "r0", func(_ *fasthttp.Request, c net.Conn) bool {
		if b := answer.Load(); b != nil {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(*b)
		}
		return false // close: the bytes end where the connection does
	})
	addr := startFuzzProxy(f, rep)
	f.Fuzz(func(t *testing.T, raw []byte) {
		answer.Store(&raw)
		out := fuzzExchange(t, addr, []byte("GET /x HTTP/1.1\r\nHost: a\r\nX-Key: k\r\nConnection: close\r\n\r\n"))
		br := bufio.NewReader(bytes.NewReader(out))
		var resp fasthttp.Response
		resp.Header.DisableNormalizing()
		if err := resp.Read(br); err != nil {
			t.Fatalf("the client got no well-formed response (%v): %q for replica bytes %q", err, out, raw)
		}
		if rest, _ := io.ReadAll(br); len(rest) > 0 {
			t.Fatalf("bytes after the response: %q (all %q) for replica bytes %q", rest, out, raw)
		}
		st := resp.StatusCode()
		if st == fasthttp.StatusBadGateway || st == fasthttp.StatusGatewayTimeout {
			return
		}
		// Not keyway's error: it must be what the replica said.
		var want fasthttp.Response
		if err := want.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
			t.Fatalf("status %d from replica bytes fasthttp cannot read (%v): %q", st, err, raw)
		}
		if st != want.StatusCode() {
			t.Fatalf("status %d, replica said %d in %q", st, want.StatusCode(), raw)
		}
	})
}
