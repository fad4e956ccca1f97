package proxy

import (
	"bufio"
	"net"
	"regexp"
	"strings"
	"testing"

	"keyway/proxy/internal/field"

	"github.com/valyala/fasthttp"
)

// The rewriting looks up and deletes only the fields requestFields and
// scanReply say are present. These tests hold it to the rewriting that
// looks up and deletes every field (field.All): the same request and the
// same reply must come out.

var generatedID = regexp.MustCompile(`(?m)^X-Request-Id: [0-9a-f]{32}\r\n`)

// rewriteBothWays parses raw as a client's request and rewrites it twice,
// with the fields found in it and with field.All, and returns both heads
// as they would be sent to a replica, with a generated request ID
// replaced by a placeholder (it is random), and the fields found.
func rewriteBothWays(t *testing.T, raw string) (fast, full string, f fields) {
	t.Helper()
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("parse %q: %v", raw, err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5000}
	var a, b fasthttp.RequestCtx
	a.Init(&req, addr, nil)
	b.Init(&req, addr, nil)
	f = requestFields(&a.Request.Header)
	c1, h1 := rewriteRequest(&a, f)
	c2, h2 := rewriteRequest(&b, field.All)
	if c1 != c2 || h1 != h2 {
		t.Errorf("%q: close/http10 %v/%v with the fields found, %v/%v with all", raw, c1, h1, c2, h2)
	}
	strip := func(h *fasthttp.RequestHeader) string {
		return generatedID.ReplaceAllString(string(h.Header()), "X-Request-Id: (generated)\r\n")
	}
	return strip(&a.Request.Header), strip(&b.Request.Header), f
}

func TestRequestFieldsRewriteAsAll(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want fields // fields requestFields finds
	}{
		{"plain keyed GET", "GET /x HTTP/1.1\r\nHost: a\r\nUser-Agent: vegeta\r\nX-Key: k1\r\nAccept-Encoding: gzip\r\n\r\n", 0},
		{"no fields at all besides Host", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 0},
		{"HTTP/1.0 without Host", "GET / HTTP/1.0\r\n\r\n", field.All},
		{"HTTP/1.0 keep-alive", "GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n", field.Connection},
		{"Connection close", "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", field.Connection},
		{"Connection lists fields, some protected", "POST / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Hop, x-other, Host, X-Forwarded-For, X-Request-Id\r\nX-Hop: 1\r\nX-Other: 2\r\nX-Forwarded-For: 198.51.100.1\r\nX-Request-Id: mine\r\nContent-Length: 2\r\n\r\nhi",
			field.Connection | field.XFF | field.RequestID | field.ContentLength},
		{"every hop-by-hop field, odd case", "POST / HTTP/1.1\r\nhost: a\r\nkeep-alive: timeout=5\r\nPROXY-CONNECTION: keep-alive\r\nproxy-authorization: Basic eA==\r\nProxy-Authenticate: Basic\r\nte: trailers\r\ntrailer: X-Sum\r\nupgrade: websocket\r\nexpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
			field.KeepAlive | field.ProxyConnection | field.ProxyAuthorization | field.ProxyAuthenticate | field.TE | field.Trailer | field.Upgrade | field.Expect | field.ContentLength},
		{"forwarding fields of the client's", "GET / HTTP/1.1\r\nHost: a\r\nx-forwarded-for: 203.0.113.9, 198.51.100.2\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: other\r\nx-request-id: abc\r\n\r\n",
			field.XFF | field.RequestID | field.XFProto | field.XFHost},
		{"empty request ID", "GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: \r\n\r\n", field.RequestID},
		{"names that only look alike", "GET / HTTP/1.1\r\nHost: a\r\nConnections: x\r\nX-Forwarded-Fore: y\r\nTEe: z\r\nUpgrade-Insecure-Requests: 1\r\nX-Connection: close\r\n\r\n", 0},
		{"bare LF line ends", "GET / HTTP/1.1\r\nHost: a\nUpgrade: h2c\nX-Key: k\r\n\r\n", field.Upgrade},
		{"chunked: trailer fields are outside the block", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: X-Sum\r\nTrailer: X-Sum\r\n\r\n2\r\nhi\r\n0\r\nX-Sum: 1\r\n\r\n", field.All},
		{"cookies", "GET / HTTP/1.1\r\nHost: a\r\nCookie: a=1; b=2\r\nCookie: c=3\r\n\r\n", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fast, full, f := rewriteBothWays(t, c.raw)
			if f != c.want {
				t.Errorf("requestFields = %#x, want %#x", f, c.want)
			}
			if fast != full {
				t.Errorf("rewritten with the fields found:\n%s\nwith all fields:\n%s", fast, full)
			}
		})
	}
}

// rewriteReplyBothWays parses raw as a replica's reply and prepares it
// for the client twice, with the fields scanReply finds and with
// field.All, and returns both heads and the fields found.
func rewriteReplyBothWays(t *testing.T, raw string, pressure []byte) (fast, full string, f fields, valid bool) {
	t.Helper()
	var a, b fasthttp.RequestCtx
	br := bufio.NewReader(strings.NewReader(raw))
	if err := a.Response.Read(br); err != nil {
		t.Fatalf("parse %q: %v", raw, err)
	}
	a.Response.CopyTo(&b.Response)
	valid, f = scanReply(&a.Response.Header, pressure)
	prepareResponse(&a, false, f)
	prepareResponse(&b, false, field.All)
	return a.Response.Header.String(), b.Response.Header.String(), f, valid
}

func TestReplyFieldsRewriteAsAll(t *testing.T) {
	pressure := []byte("X-Keyway-Pressure")
	cases := []struct {
		name  string
		raw   string
		want  fields
		valid bool
	}{
		{"plain", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok", field.ContentLength, true},
		{"Connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", field.Connection | field.ContentLength, true},
		{"Connection lists fields", "HTTP/1.1 200 OK\r\nConnection: X-Hop, Content-Length\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok", field.Connection | field.KeepAlive | field.ContentLength, true},
		{"hop-by-hop in odd case", "HTTP/1.1 200 OK\r\nproxy-connection: x\r\nUPGRADE: h2c\r\nProxy-Authenticate: Basic\r\nContent-Length: 2\r\n\r\nok", field.ProxyConnection | field.Upgrade | field.ProxyAuthenticate | field.ContentLength, true},
		{"pressure header", "HTTP/1.1 503 Service Unavailable\r\nx-keyway-pressure: saturated\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n", field.Pressure | field.ContentLength, true},
		{"set-cookie and server", "HTTP/1.1 200 OK\r\nServer: r\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n", field.ContentLength, true},
		{"chunked with a trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: X-Sum\r\nTrailer: X-Sum\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 1\r\n\r\n", field.All, true},
		{"HTTP/2.0 version", "HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fast, full, f, valid := rewriteReplyBothWays(t, c.raw, pressure)
			if valid != c.valid {
				t.Fatalf("valid = %v, want %v", valid, c.valid)
			}
			if !valid {
				return
			}
			if f != c.want {
				t.Errorf("scanReply = %#x, want %#x", f, c.want)
			}
			if fast != full {
				t.Errorf("prepared with the fields found:\n%s\nwith all fields:\n%s", fast, full)
			}
		})
	}
}

// FuzzRequestFields: for any request fasthttp parses, the rewriting with
// the fields requestFields finds sends what the rewriting of every field
// sends.
func FuzzRequestFields(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\nX-Key: k\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade, x-a\r\nUpgrade: ws\r\nX-A: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Folded: a\r\n b\r\nTE: x\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
		"GET / HTTP/1.1\r\nHost: a\r\nx-forwarded-for: 1.2.3.4\r\nX-REQUEST-ID: q\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var req fasthttp.Request
		if req.Read(bufio.NewReader(strings.NewReader(raw))) != nil {
			return
		}
		fast, full, _ := rewriteBothWays(t, raw)
		if fast != full {
			t.Errorf("%q rewritten with the fields found:\n%s\nwith all fields:\n%s", raw, fast, full)
		}
	})
}

// BenchmarkRewriteHeaders: a keyed GET as vegeta sends it and a small
// reply, rewritten for the replica and the client, with the fields found
// ("found", from the raw block: keyway takes them from the head scan,
// which costs no pass here, and falls back to the raw block) and with every lookup and deletion ("all",
// as keyway did before it looked for the fields first). The copies from
// parsed templates are in both.
func BenchmarkRewriteHeaders(b *testing.B) {
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader("GET /ingest HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\nX-Key: key-00042\r\nAccept-Encoding: gzip\r\n\r\n"))); err != nil {
		b.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"))); err != nil {
		b.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}
	pressure := []byte("X-Keyway-Pressure")
	for _, mode := range []string{"found", "all"} {
		b.Run(mode, func(b *testing.B) {
			var ctx fasthttp.RequestCtx
			ctx.Init(&req, addr, nil)
			b.ReportAllocs()
			for b.Loop() {
				req.CopyTo(&ctx.Request)
				resp.CopyTo(&ctx.Response)
				f := field.All
				if mode == "found" {
					f = requestFields(&ctx.Request.Header)
				}
				close, http10 := rewriteRequest(&ctx, f)
				_, reply := scanReply(&ctx.Response.Header, pressure)
				if mode == "all" {
					reply = field.All
				}
				prepareResponse(&ctx, close, reply)
				restoreRequest(&request{ctx: &ctx, http10: http10})
			}
		})
	}
}

// framingBothWays returns checkFraming's verdict on a request head, and
// the verdict from the fields as fasthttp parsed them (fieldsVerdict),
// with the same checks before it; ok is false where fasthttp refuses the
// head itself.
func framingBothWays(raw string) (fast, full verdict, ok bool) {
	var h fasthttp.RequestHeader
	if h.Read(bufio.NewReader(strings.NewReader(raw))) != nil {
		return 0, 0, false
	}
	fast = checkFraming(&h)
	if _, known := field.InBlock(h.RawHeaders()); !known || fast == vBareLF || fast == vVersion || fast == vConnect {
		return fast, fast, true // the same code decided
	}
	return fast, fieldsVerdict(&h), true
}

func TestFramingFromRawFields(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want verdict
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\nX-Key: k\r\n\r\n", vOK},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi", vOK},
		{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n", vLengthConflict},
		{"POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n", vLengthConflict},
		{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", vOK},
		{"GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n", vHeaderName},
	} {
		fast, full, ok := framingBothWays(c.raw)
		if !ok {
			continue // fasthttp refused it: no verdict of keyway's
		}
		if fast != c.want || full != c.want {
			t.Errorf("%q: checkFraming %v, from the parsed fields %v; want %v", c.raw, fast, full, c.want)
		}
	}
}

// FuzzFramingFromRawFields: checkFraming from the raw names decides as
// the check of the parsed fields does.
func FuzzFramingFromRawFields(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\nhi",
		"GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\nX-F: a\r\n b\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if fast, full, ok := framingBothWays(raw); ok && fast != full {
			t.Errorf("%q: checkFraming %v, from the parsed fields %v", raw, fast, full)
		}
	})
}
