package proxy

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// headerMap returns a request's headers by lower-case name.
func headerMap(req *fasthttp.Request) map[string]string {
	m := map[string]string{}
	for k, v := range req.Header.All() {
		m[strings.ToLower(string(k))] = string(v)
	}
	return m
}

func lower(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	return out
}

var hopByHop = []string{"connection", "keep-alive", "te", "trailer", "upgrade", "proxy-authorization", "proxy-authenticate", "proxy-connection", "transfer-encoding"}

// TestRequestHeaders: hop-by-hop headers and the ones Connection lists are
// not forwarded, but Connection cannot remove the forwarding headers or
// Host; X-Forwarded-* and X-Request-Id are set; no User-Agent is injected.
func TestRequestHeaders(t *testing.T) {
	rep := startReplica(t, "r0")
	_, addr := startProxy(t, nil, rep)

	t.Run("hop-by-hop and Connection-listed headers are stripped", func(t *testing.T) {
		rc := dialRaw(t, addr)
		rc.send(t, "POST /ingest HTTP/1.1\r\n"+
			"Host: orders.example\r\n"+
			"X-Key: k1\r\n"+
			"Connection: keep-alive, X-Custom-Hop, x-other-hop, X-Forwarded-For, Host, X-Request-Id, X-Forwarded-Host\r\n"+
			"Keep-Alive: timeout=5\r\n"+
			"TE: trailers\r\n"+
			"Trailer: X-Checksum\r\n"+
			"Upgrade: websocket\r\n"+
			"Proxy-Authorization: Basic c2VjcmV0\r\n"+
			"Proxy-Connection: keep-alive\r\n"+
			"X-Custom-Hop: secret\r\n"+
			"X-Other-Hop: secret\r\n"+
			"X-Forwarded-For: 203.0.113.9\r\n"+
			"X-Request-Id: req-123\r\n"+
			"X-Keep: yes\r\n"+
			"Content-Length: 2\r\n\r\nhi")
		r := rc.read(t)
		if r.status != 200 {
			t.Fatalf("got %v", r)
		}
		got := headerMap(rep.last.Load())
		for _, h := range append(hopByHop, "x-custom-hop", "x-other-hop") {
			if v, ok := got[h]; ok {
				t.Errorf("%s: %q reached the replica", h, v)
			}
		}
		want := map[string]string{
			"host":              "orders.example",
			"x-keep":            "yes",
			"x-key":             "k1",
			"x-forwarded-for":   "203.0.113.9, 127.0.0.1",
			"x-forwarded-proto": "http",
			"x-forwarded-host":  "orders.example",
			"x-request-id":      "req-123",
		}
		for h, v := range want {
			if got[h] != v {
				t.Errorf("%s = %q, want %q", h, got[h], v)
			}
		}
		if ua, ok := got["user-agent"]; ok {
			t.Errorf("User-Agent %q injected upstream", ua)
		}
		if b := string(rep.last.Load().Body()); b != "hi" {
			t.Errorf("body %q", b)
		}
	})

	t.Run("forwarding headers set, request id generated", func(t *testing.T) {
		rc := dialRaw(t, addr)
		ids := map[string]bool{}
		for i := 0; i < 2; i++ {
			rc.send(t, "GET /x HTTP/1.1\r\nHost: Orders.Example:8443\r\nX-Key: k\r\n"+
				"X-Forwarded-Host: evil\r\nX-Forwarded-Proto: https\r\n\r\n")
			if r := rc.read(t); r.status != 200 {
				t.Fatalf("got %v", r)
			}
			got := headerMap(rep.last.Load())
			want := map[string]string{
				"x-forwarded-for":   "127.0.0.1",
				"x-forwarded-proto": "http",
				"x-forwarded-host":  "Orders.Example:8443",
				// fasthttp writes the Host of the parsed URI, lower-cased;
				// host names are case-insensitive (RFC 9110 §4.2.3).
				"host": "orders.example:8443",
			}
			for h, v := range want {
				if got[h] != v {
					t.Errorf("%s = %q, want %q", h, got[h], v)
				}
			}
			if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(got["x-request-id"]) {
				t.Errorf("generated X-Request-Id %q, want 32 hex digits", got["x-request-id"])
			}
			ids[got["x-request-id"]] = true
		}
		if len(ids) != 2 {
			t.Errorf("two requests got the same X-Request-Id")
		}
	})

	t.Run("Expect is answered by keyway, not forwarded", func(t *testing.T) {
		rc := dialRaw(t, addr)
		rc.send(t, "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi")
		if r := rc.read(t); r.status != 200 {
			t.Fatalf("got %v", r)
		}
		if v, ok := headerMap(rep.last.Load())["expect"]; ok {
			t.Errorf("Expect %q forwarded", v)
		}
	})
}

// TestRawPathIsForwardedByteExact: no normalisation of the path or query.
func TestRawPathIsForwardedByteExact(t *testing.T) {
	rep := startReplica(t, "r0")
	_, addr := startProxy(t, nil, rep)
	for _, uri := range []string{
		"/a/../b//c/%2e%2e/d%2Fe?x=1%20",
		"/ingest/%61bc?b=2&a=1&a=3&empty=&flag",
		"/x;param=1/./y?q=a+b%2B",
	} {
		t.Run(uri, func(t *testing.T) {
			rc := dialRaw(t, addr)
			rc.send(t, "GET "+uri+" HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n\r\n")
			if r := rc.read(t); r.status != 200 {
				t.Fatalf("got %v", r)
			}
			if got := string(rep.last.Load().Header.RequestURI()); got != uri {
				t.Fatalf("replica saw %q, client sent %q", got, uri)
			}
		})
	}
}

// TestResponseHeaders: hop-by-hop response headers and the ones the
// replica's Connection lists are stripped; keyway adds no Server or
// Content-Type; a replica closing its connection does not close the
// client's; a client's Connection: close is honoured.
func TestResponseHeaders(t *testing.T) {
	rep := startRawReplica(t, "raw", func(req *fasthttp.Request, c net.Conn) bool {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\n"+
			"Content-Length: 2\r\n"+
			"Connection: close, X-Resp-Hop\r\n"+
			"X-Resp-Hop: secret\r\n"+
			"Keep-Alive: timeout=5\r\n"+
			"Proxy-Authenticate: Basic\r\n"+
			"Proxy-Connection: close\r\n"+
			"Upgrade: h2c\r\n"+
			"X-Keep: yes\r\n\r\nok")
		return false // and close, as announced
	})
	_, addr := startProxy(t, nil, rep)

	t.Run("stripped, nothing injected, client connection kept", func(t *testing.T) {
		rc := dialRaw(t, addr)
		for i := 0; i < 3; i++ { // three requests on one client connection
			rc.send(t, "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\nContent-Length: 1\r\n\r\nx")
			r := rc.read(t)
			if r.status != 200 || r.body != "ok" {
				t.Fatalf("request %d: %v", i, r)
			}
			h := lower(r.header)
			for _, name := range append(hopByHop, "x-resp-hop") {
				if v, ok := h[name]; ok {
					t.Errorf("request %d: %s: %q reached the client", i, name, v)
				}
			}
			if r.close {
				t.Fatalf("request %d: the replica's Connection: close was relayed to the client", i)
			}
			if h["x-keep"] != "yes" {
				t.Errorf("X-Keep = %q", h["x-keep"])
			}
			for _, name := range []string{"server", "content-type"} {
				if v, ok := h[name]; ok {
					t.Errorf("%s: %q injected downstream", name, v)
				}
			}
		}
		if n := rep.count.Load(); n != 3 {
			t.Fatalf("replica saw %d requests, want 3", n)
		}
	})

	t.Run("client Connection: close is honoured and not forwarded", func(t *testing.T) {
		rc := dialRaw(t, addr)
		rc.send(t, "GET /x HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\nConnection: close\r\n\r\n")
		r := rc.read(t)
		if r.status != 200 || !r.close {
			t.Fatalf("got %v close=%v, want 200 with Connection: close", r, r.close)
		}
		if !rc.closedByPeer(5 * time.Second) {
			t.Fatalf("keyway kept the connection open after Connection: close")
		}
		if v, ok := headerMap(rep.last.Load())["connection"]; ok {
			t.Errorf("Connection %q forwarded to the replica", v)
		}
	})

	t.Run("HTTP/1.0 client without keep-alive is closed", func(t *testing.T) {
		rc := dialRaw(t, addr)
		rc.send(t, "GET /x HTTP/1.0\r\nHost: orders.example\r\nX-Key: k\r\n\r\n")
		if r := rc.read(t); r.status != 200 {
			t.Fatalf("got %v", r)
		}
		if !rc.closedByPeer(5 * time.Second) {
			t.Fatalf("keyway kept an HTTP/1.0 connection open")
		}
	})
}

// TestSmuggling: a request with both Content-Length and Transfer-Encoding
// and a second request hidden in its body must never turn into two
// requests at a replica.
func TestSmuggling(t *testing.T) {
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n\r\n"
	chunk := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(smuggled), smuggled)
	cases := map[string]string{
		"CL.TE": "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n", len("0\r\n\r\n")+len(smuggled)) +
			"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE.CL": "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n" +
			"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunk,
		"duplicate CL": "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n" +
			"Content-Length: 0\r\n" + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(smuggled)) + smuggled,
		"TE obfuscated": "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n", len("0\r\n\r\n")+len(smuggled)) +
			"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + smuggled,
		"Connection lists Content-Length": "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n" +
			"Connection: Content-Length, Transfer-Encoding\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n\r\n", len(smuggled)) + smuggled,
	}
	// A sentinel request follows on the same connection: once its answer
	// (or the end of the connection) is read, the proxy has dealt with
	// everything sent before it.
	sentinel := "GET /sentinel HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n\r\n"
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			rep := startReplica(t, "r0")
			rep.setHandler(func(ctx *fasthttp.RequestCtx) { ctx.SetBody(ctx.Request.Header.RequestURI()) })
			_, addr := startProxy(t, nil, rep)
			rc := dialRaw(t, addr)
			rc.send(t, raw+sentinel)
			var answers []string
			for i := 0; i < 4; i++ {
				r, err := rc.tryRead()
				if err != nil {
					var ne net.Error
					if errorsAs(err, &ne) && ne.Timeout() {
						t.Fatalf("no answer and no close within the deadline; answers so far %v", answers)
					}
					break // the proxy closed the connection
				}
				answers = append(answers, fmt.Sprintf("%d %s", r.status, r.body))
				if r.body == "/sentinel" {
					break
				}
			}
			forwarded := 0
			rep.mu.Lock()
			for _, u := range rep.uris {
				if u != "/sentinel" {
					forwarded++
				}
			}
			uris := append([]string(nil), rep.uris...)
			rep.mu.Unlock()
			t.Logf("answers %q; replica saw %q", answers, uris)
			if rep.seen("/smuggled") {
				t.Fatalf("the smuggled request reached the replica")
			}
			if forwarded > 1 {
				t.Fatalf("one request became %d at the replica: %q", forwarded, uris)
			}
			for _, a := range answers {
				if strings.Contains(a, "smuggled") {
					t.Fatalf("the client got an answer to the smuggled request: %q", answers)
				}
			}
		})
	}
}

// TestHTTP10Client: keyway speaks HTTP/1.1 to replicas whatever the client
// speaks (RFC 9110 §2.5), so an HTTP/1.0 client does not close pooled
// replica connections; the client still gets HTTP/1.0 keep-alive semantics.
func TestHTTP10Client(t *testing.T) {
	rep := startReplica(t, "r0")
	_, addr := startProxy(t, nil, rep)
	rc := dialRaw(t, addr)
	for i := 0; i < 2; i++ {
		rc.send(t, "GET /x HTTP/1.0\r\nHost: orders.example\r\nX-Key: k\r\nConnection: keep-alive\r\n\r\n")
		r := rc.read(t)
		if r.status != 200 || r.close || !strings.EqualFold(r.header["Connection"], "keep-alive") {
			t.Fatalf("request %d: got %v; want 200 with Connection: keep-alive for an HTTP/1.0 keep-alive client", i, r)
		}
		last := rep.last.Load()
		if p := string(last.Header.Protocol()); p != "HTTP/1.1" {
			t.Errorf("replica got %s, want HTTP/1.1", p)
		}
		if v, ok := headerMap(last)["connection"]; ok {
			t.Errorf("replica got Connection: %s; the pooled connection would close", v)
		}
	}
	if got := rep.srv.GetOpenConnectionsCount(); got != 1 {
		t.Errorf("replica has %d open connections after two requests, want 1 (reused)", got)
	}
}

// TestHex8 holds hex8 to fmt's %08x, at the edges of each digit's range
// and on random values.
func TestHex8(t *testing.T) {
	vals := []uint32{0, 9, 10, 15, 16, 0x99999999, 0xaaaaaaaa, 0xffffffff, 0x01234567, 0x89abcdef, 0xfedcba98, 0x9a9a9a9a}
	for range 10000 {
		vals = append(vals, rand.Uint32())
	}
	for _, v := range vals {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], hex8(v))
		if want := fmt.Sprintf("%08x", v); string(b[:]) != want {
			t.Fatalf("hex8(%#x) = %q, want %q", v, b[:], want)
		}
	}
	id := appendRequestID([]byte("id="))
	if len(id) != 3+32 || strings.Trim(string(id[3:]), "0123456789abcdef") != "" {
		t.Fatalf("appendRequestID = %q, want id= and 32 lower-case hex digits", id)
	}
}
