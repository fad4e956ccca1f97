package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/internal/poll"
)

// byteReplica is a raw-TCP replica that records exactly the bytes it
// receives and answers every request it can parse with 200 "ok".
type byteReplica struct {
	ln   net.Listener
	mu   sync.Mutex
	raw  bytes.Buffer
	reqs []string // request URIs it parsed
}

func startByteReplica(t testing.TB) *byteReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &byteReplica{ln: ln}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(io.TeeReader(c, r))
				for {
					var req fasthttp.Request
					req.Header.DisableNormalizing()
					if err := req.Read(br); err != nil {
						return
					}
					r.mu.Lock()
					r.reqs = append(r.reqs, string(req.Header.RequestURI()))
					r.mu.Unlock()
					if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return r
}

func (r *byteReplica) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.raw.Write(b)
}

func (r *byteReplica) addr() string { return r.ln.Addr().String() }

// take returns and forgets what the replica received so far.
func (r *byteReplica) take() (raw string, reqs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	raw, reqs = r.raw.String(), r.reqs
	r.raw.Reset()
	r.reqs = nil
	return raw, reqs
}

// startFramingProxy runs a proxy over a byteReplica with a long read
// timeout: an answer that comes at once did not wait for it.
func startFramingProxy(t testing.TB, modify func(*Config)) (*byteReplica, string) {
	rep := startByteReplica(t)
	_, addr := startProxy(t, func(c *Config) {
		c.Server.ReadTimeout = 30 * time.Second
		c.Server.IdleTimeout = 30 * time.Second
		sc := &c.ReplicaSets[0]
		sc.Static = []StaticReplica{{Name: "r", Addr: rep.addr(), Weight: 1}}
		sc.Replicas = 1
		sc.MaxBodyBytes = 1 << 10
		if modify != nil {
			modify(c)
		}
	})
	return rep, addr
}

// rawExchange sends raw on a new connection and reads n responses, then
// reports whether the proxy closed the connection (within d).
func rawExchange(t testing.TB, addr, raw string, n int, d time.Duration) (statuses []int, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for len(statuses) < n {
		var resp fasthttp.Response
		if err := resp.Read(br); err != nil {
			return statuses, false
		}
		statuses = append(statuses, resp.StatusCode())
	}
	_, err = br.ReadByte()
	var ne net.Error
	return statuses, err != nil && !(errorsAs(err, &ne) && ne.Timeout())
}

// TestRequestFraming sends malformed and borderline requests as raw bytes
// and checks keyway's answer, that a refused request's connection is
// closed at once (far below server.read_timeout), and what the replica
// received: nothing for a refused request, and never a second request
// hidden in a first one's body.
func TestRequestFraming(t *testing.T) {
	rep, addr := startFramingProxy(t, nil)
	h := "Host: orders.example\r\nX-Key: k1\r\n"
	cases := []struct {
		name      string
		raw       string
		want      []int
		forwarded bool // the replica sees a request
	}{
		{"valid", "GET /a HTTP/1.1\r\n" + h + "\r\n", []int{200}, true},
		{"garbage request line", "GARBAGE\r\n\r\n", []int{400}, false},
		{"request line two spaces", "GET  /a HTTP/1.1\r\n" + h + "\r\n", []int{400}, false},
		{"lowercase method", "get /a HTTP/1.1\r\n" + h + "\r\n", []int{200}, true},
		{"bare CR in line end", "GET /a HTTP/1.1\r" + h + "\r\n", []int{400}, false},
		{"CL twice differ", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", []int{400}, false},
		{"CL twice same", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", []int{400}, false},
		{"CL list", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 3, 3\r\n\r\nabc", []int{400}, false},
		{"CL plus", "POST /a HTTP/1.1\r\n" + h + "Content-Length: +3\r\n\r\nabc", []int{400}, false},
		{"CL negative", "POST /a HTTP/1.1\r\n" + h + "Content-Length: -1\r\n\r\nabc", []int{400}, false},
		{"CL huge", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 99999999999999999999999\r\n\r\nabc", []int{400}, false},
		{"CL and TE smuggle", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", []int{400}, false},
		{"TE and CL smuggle", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n0\r\n\r\n", []int{400}, false},
		{"chunked ok", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{200}, true},
		{"chunked bad size", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"chunked size overflow", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"chunked no CRLF after data", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n", []int{400}, false},
		{"chunked LF only", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n", []int{400}, false},
		{"chunked ext", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\n\r\n", []int{200}, true},
		{"chunked trailer", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", []int{200}, true},
		// RFC 9112 section 6.3: chunked not the final coding (or no
		// chunked at all) in a request: 400.
		{"TE gzip", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\n\r\nabc", []int{400}, false},
		{"TE chunked gzip", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE empty", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: \r\n\r\nabc", []int{400}, false},
		// Section 6.1: chunked final after a coding keyway does not
		// implement: 501.
		{"TE gzip chunked", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{501}, false},
		{"TE deflate chunked no space", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: deflate,chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{501}, false},
		{"TE custom chunked", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: x-custom;level=9 , CHUNKED\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{501}, false},
		{"TE empty elements", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: , gzip,, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{501}, false},
		{"TE gzip then chunked fields", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{501}, false},
		{"TE identity chunked", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: identity, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{501}, false},
		{"TE chunked with parameter", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked;x=1\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{501}, false},
		// A coding keyway cannot even read, or framing it must refuse
		// whatever the codings: 400.
		{"TE bad token", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gz@ip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE quoted parameter", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip;q=\"1\", chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE gzip chunked and CL", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 3\r\nTransfer-Encoding: gzip, chunked\r\n\r\nabc", []int{400}, false},
		{"TE gzip chunked then CL", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\nabc", []int{400}, false},
		{"TE gzip chunked in HTTP/1.0", "POST /a HTTP/1.0\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE gzip chunked folded", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip,\r\n chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE chunked chunked", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE gzip chunked chunked", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE twice", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE Chunked case", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{200}, true},
		// fasthttp reads identity as no coding; RFC 9112 has none such.
		{"TE identity and CL", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc", []int{400}, false},
		{"TE identity", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: Identity\r\n\r\nabc", []int{400}, false},
		{"TE in HTTP/1.0", "POST /a HTTP/1.0\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		// A known gap: fasthttp reads Transfer-Encoding in HTTP/1.1 only.
		{"TE in HTTP/1.2", "POST /a HTTP/1.2\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", []int{400}, false},
		{"TE space before colon", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding : chunked\r\nContent-Length: 3\r\n\r\nabc", []int{400}, false},
		{"obs-fold", "GET /a HTTP/1.1\r\n" + h + "X-A: b\r\n c\r\n\r\n", []int{200}, true},
		{"space before colon", "GET /a HTTP/1.1\r\n" + h + "X-A : b\r\n\r\n", []int{400}, false},
		{"space in name", "GET /a HTTP/1.1\r\n" + h + "X A: b\r\n\r\n", []int{400}, false},
		{"no colon", "GET /a HTTP/1.1\r\n" + h + "XA\r\n\r\n", []int{400}, false},
		{"empty name", "GET /a HTTP/1.1\r\n" + h + ": b\r\n\r\n", []int{400}, false},
		{"bad char in name", "GET /a HTTP/1.1\r\n" + h + "X\"A: b\r\n\r\n", []int{400}, false},
		{"NUL in value", "GET /a HTTP/1.1\r\n" + h + "X-A: b\x00c\r\n\r\n", []int{400}, false},
		{"NUL in name", "GET /a HTTP/1.1\r\n" + h + "X-\x00A: b\r\n\r\n", []int{400}, false},
		{"bare CR in value", "GET /a HTTP/1.1\r\n" + h + "X-A: b\rc\r\n\r\n", []int{400}, false},
		{"ctl in value", "GET /a HTTP/1.1\r\n" + h + "X-A: b\x01c\r\n\r\n", []int{400}, false},
		{"high byte in value", "GET /a HTTP/1.1\r\n" + h + "X-A: b\xffc\r\n\r\n", []int{200}, true},
		{"NUL in path", "GET /a\x00b HTTP/1.1\r\n" + h + "\r\n", []int{400}, false},
		{"space first header", "GET /a HTTP/1.1\r\n X-A: b\r\n" + h + "\r\n", []int{400}, false},
		// RFC 9112 section 3: a request-target too long to parse is 414.
		{"long request line", "GET /" + strings.Repeat("a", 20000) + " HTTP/1.1\r\n" + h + "\r\n", []int{414}, false},
		{"long request line after empty lines", "\r\n\n\r\nGET /" + strings.Repeat("a", 20000) + " HTTP/1.1\r\n" + h + "\r\n", []int{414}, false},
		{"long request line no end", "GET /" + strings.Repeat("a", 20000), []int{414}, false},
		{"long headers", "GET /a HTTP/1.1\r\n" + h + "X-A: " + strings.Repeat("a", 20000) + "\r\n\r\n", []int{431}, false},
		{"long request line then headers", "GET /" + strings.Repeat("a", 16000) + " HTTP/1.1\r\n" + h + "X-A: " + strings.Repeat("a", 1000) + "\r\n\r\n", []int{431}, false},
		{"many headers", "GET /a HTTP/1.1\r\n" + h + strings.Repeat("X-A: b\r\n", 3000) + "\r\n", []int{431}, false},
		// RFC 9112 section 2.2 lets a recipient take a bare LF as a line
		// end; fasthttp does, but ends a head at a bare-LF empty line
		// only once a CRLF CRLF follows it somewhere. keyway refuses such
		// a head at once, whatever follows it.
		{"bare LF head", "GET /a HTTP/1.1\nHost: orders.example\nX-Key: k1\n\n", []int{400}, false},
		{"bare LF head no fields", "GET /a HTTP/1.1\n\n", []int{400}, false},
		{"bare LF request line, CRLF empty line", "GET http://orders.example/a HTTP/1.0\n\r\n", []int{400}, false},
		{"bare LF empty line after CRLF lines", "GET /a HTTP/1.1\r\n" + h + "\n", []int{400}, false},
		{"CRLF empty line after a bare LF line", "GET /a HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\n\r\n", []int{400}, false},
		{"bare LF head with body", "POST /a HTTP/1.1\nHost: orders.example\nX-Key: k1\nContent-Length: 5\n\nab", []int{400}, false},
		{"bare LF head, CRLF CRLF in body", "POST /a HTTP/1.1\nHost: orders.example\nX-Key: k1\nContent-Length: 6\n\nab\r\n\r\n", []int{400}, false},
		{"bare LF head, then a request", "GET /a HTTP/1.1\nHost: orders.example\nX-Key: k1\n\nGET /b HTTP/1.1\r\n" + h + "\r\n", []int{400}, false},
		{"bare LF lines, CRLF end", "GET /a HTTP/1.1\nHost: orders.example\nX-Key: k1\r\n\r\n", []int{200}, true},
		{"leading bare LF", "\nGET /a HTTP/1.1\r\n" + h + "\r\n", []int{200}, true},
		{"body with bare LFs", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 4\r\n\r\n\n\n\n\n", []int{200}, true},
		{"pipelined body with bare LFs", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 4\r\n\r\n\n\n\n\nPOST /b HTTP/1.1\r\n" + h + "Content-Length: 2\r\n\r\n\n\n", []int{200, 200}, true},
		{"big body", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 2000\r\n\r\n" + strings.Repeat("a", 2000), []int{413}, false},
		{"big chunked body", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n7d0\r\n" + strings.Repeat("a", 2000) + "\r\n0\r\n\r\n", []int{413}, false},
		{"no host 1.1", "GET /a HTTP/1.1\r\nX-Key: k1\r\n\r\n", []int{400}, false},
		{"two hosts", "GET /a HTTP/1.1\r\n" + h + "Host: other.example\r\n\r\n", []int{400}, false},
		{"empty host", "GET /a HTTP/1.1\r\nHost:\r\nX-Key: k1\r\n\r\n", []int{400}, false},
		{"bad host", "GET /a HTTP/1.1\r\nHost: a b\r\nX-Key: k1\r\n\r\n", []int{400}, false},
		{"absolute form", "GET http://orders.example/abs HTTP/1.1\r\nHost: other.example\r\nX-Key: k1\r\n\r\n", []int{200}, true},
		{"asterisk form", "OPTIONS * HTTP/1.1\r\n" + h + "\r\n", []int{404}, false},
		{"authority form", "CONNECT orders.example:443 HTTP/1.1\r\n" + h + "\r\n", []int{501}, false},
		{"http/1.0", "GET /a HTTP/1.0\r\n" + h + "\r\n", []int{200}, true},
		{"http/1.0 no host", "GET /a HTTP/1.0\r\nX-Key: k1\r\n\r\n", []int{400}, false},
		{"http/0.9", "GET /a\r\n\r\n", []int{400}, false},
		{"http/1.2", "GET /a HTTP/1.2\r\n" + h + "\r\n", []int{200}, true},
		{"http/2.0", "GET /a HTTP/2.0\r\n" + h + "\r\n", []int{505}, false},
		{"http/3.0", "GET /a HTTP/3.0\r\n" + h + "\r\n", []int{505}, false},
		{"version garbage", "GET /a HTTP/x.y\r\n" + h + "\r\n", []int{400}, false},
		{"version lower", "GET /a http/1.1\r\n" + h + "\r\n", []int{400}, false},
		{"h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", []int{400}, false},
		{"pipelined garbage", "GET /a HTTP/1.1\r\n" + h + "\r\nGARBAGE\r\n\r\n", []int{200, 400}, true},
		{"pipelined two", "GET /a HTTP/1.1\r\n" + h + "\r\nGET /b HTTP/1.1\r\n" + h + "\r\n", []int{200, 200}, true},
		{"get with body", "GET /a HTTP/1.1\r\n" + h + "Content-Length: 3\r\n\r\nabc", []int{200}, true},
		{"leading CRLF", "\r\nGET /a HTTP/1.1\r\n" + h + "\r\n", []int{200}, true},
		{"expect 100", "POST /a HTTP/1.1\r\n" + h + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc", []int{200}, true},
		{"expect other", "POST /a HTTP/1.1\r\n" + h + "Expect: foo\r\nContent-Length: 3\r\n\r\nabc", []int{200}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// 404 (no set matches) is an answer, not a refusal: the
			// connection stays open.
			last := c.want[len(c.want)-1]
			refused := last >= 400 && last != 404
			// A refused request's connection must close within a second;
			// one that was served stays open (keep-alive): wait less.
			d := time.Second
			if !refused {
				d = 200 * time.Millisecond
			}
			start := time.Now()
			st, closed := rawExchange(t, addr, c.raw, len(c.want), d)
			took := time.Since(start)
			raw, reqs := rep.take()
			if !slices.Equal(st, c.want) {
				t.Errorf("statuses %v, want %v (replica got %q)", st, c.want, raw)
			}
			if refused && !closed {
				t.Errorf("connection not closed %v after a refused request (server.read_timeout is 30s)", took)
			}
			if got := len(reqs) > 0; got != c.forwarded {
				t.Errorf("replica received %q, want forwarded=%v", raw, c.forwarded)
			}
			if strings.Contains(raw, "smuggled") {
				t.Errorf("a smuggled request reached the replica: %q", raw)
			}
			if refused && len(reqs) > len(c.want)-1 {
				t.Errorf("replica parsed %d requests %q, want %d", len(reqs), reqs, len(c.want)-1)
			}
		})
	}
}

// TestReplyFraming has a raw replica write malformed or cut-short replies:
// each becomes keyway's 502, a whole response, never a half-framed relay.
func TestReplyFraming(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want int
	}{
		{"valid", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200},
		{"garbage status line", "garbage\r\n\r\n", 502},
		{"bad status code", "HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\nok", 502},
		{"status code 2 digits", "HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok", 502},
		{"status code 1000", "HTTP/1.1 1000 OK\r\nContent-Length: 2\r\n\r\nok", 502},
		{"version 2", "HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 502},
		// Interim replies are read past; the final one is relayed.
		{"103 then 200", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200},
		{"101 unasked", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 502},
		{"status 600", "HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok", 502},
		{"status 999", "HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nok", 502},
		{"status 599", "HTTP/1.1 599 Odd\r\nContent-Length: 2\r\n\r\nok", 599},
		{"CL twice differ", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!", 502},
		{"CL negative", "HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", 502},
		// RFC 9112 §6.3: Transfer-Encoding overrides; the relay has one
		// Content-Length of the decoded body.
		{"CL and TE", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", 200},
		{"TE gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok", 502},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n", 502},
		{"chunk cut short", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok", 502},
		{"body cut short", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok", 502},
		{"head cut short", "HTTP/1.1 200 OK\r\nContent-Len", 502},
		{"NUL in value", "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok", 502},
		{"bare CR in value", "HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\nok", 502},
		{"space in name", "HTTP/1.1 200 OK\r\nX A: b\r\nContent-Length: 2\r\n\r\nok", 502},
		// RFC 9112 §5.1: a proxy removes the space before relaying.
		{"space before colon", "HTTP/1.1 200 OK\r\nX-A : b\r\nContent-Length: 2\r\n\r\nok", 200},
		{"headers too large", "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", 20<<10) + "\r\nContent-Length: 2\r\n\r\nok", 502},
		{"obs-fold", "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok", 200},
		// max_response_body_bytes is 1KiB here.
		{"body at max_response_body_bytes", "HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\n" + strings.Repeat("a", 1024), 200},
		{"body over max_response_body_bytes", "HTTP/1.1 200 OK\r\nContent-Length: 1025\r\n\r\n" + strings.Repeat("a", 1025), 502},
		{"chunked body over max_response_body_bytes", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n200\r\n" + strings.Repeat("a", 512) + "\r\n201\r\n" + strings.Repeat("a", 513) + "\r\n0\r\n\r\n", 502},
		{"body to close over max_response_body_bytes", "HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat("a", 2000), 502},
		{"error reply over max_response_body_bytes", "HTTP/1.1 500 Oops\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("a", 2000), 502},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := startRawReplica(t, "r", func(req *fasthttp.Request, conn net.Conn) bool {
				_, _ = io.WriteString(conn, c.raw)
				return false
			})
			_, addr := startProxy(t, func(cfg *Config) { cfg.ReplicaSets[0].MaxResponseBodyBytes = 1 << 10 }, rep)
			rc := dialRaw(t, addr)
			rc.send(t, "GET /a HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\r\n\r\n")
			r := rc.read(t)
			if r.status != c.want {
				t.Fatalf("status %d, want %d (%v)", r.status, c.want, r)
			}
			if c.want == 502 {
				r.errorJSON(t)
			}
		})
	}
}

// TestReplyExtraBytes: a replica that writes more than its reply's length
// must not answer the next request on the same pooled connection with the
// surplus (response splitting).
func TestReplyExtraBytes(t *testing.T) {
	rep := startRawReplica(t, "r", func(req *fasthttp.Request, conn net.Conn) bool {
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"+
			"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled")
		return true
	})
	_, addr := startProxy(t, nil, rep)
	c := newClient(addr)
	for i := range 3 {
		r := c.do(t, "GET", "/a", "", "X-Key", "k1")
		if r.body == "smuggled" {
			t.Fatalf("request %d got the replica's surplus bytes as its reply", i)
		}
		if r.status != 200 && r.status != 502 {
			t.Fatalf("request %d: %v", i, r)
		}
	}
}

// TestReplyTooLarge: a reply whose body exceeds the set's
// max_response_body_bytes is never relayed, not even its head: keyway
// answers 502 naming the key, closes the connection the reply came on,
// tries no other replica (another would answer alike), counts the failure
// as kind reply_too_large and none of it against the replica. Reloading
// the key renews the replicas' pools, and the new bound applies.
func TestReplyTooLarge(t *testing.T) {
	big := strings.Repeat("b", 2000)
	respond := func(req *fasthttp.Request, c net.Conn) bool {
		var err error
		switch string(req.URI().Path()) {
		case "/cl":
			_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Replica: yes\r\nContent-Length: 2000\r\n\r\n"+big)
		case "/chunked":
			_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Replica: yes\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n"+big+"\r\n0\r\n\r\n")
		default:
			_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		return err == nil
	}
	r0, r1 := startRawReplica(t, "r0", respond), startRawReplica(t, "r1", respond)
	obs := &recordingObserver{}
	bound := func(n ByteSize) func(*Config) {
		return func(c *Config) { c.ReplicaSets[0].MaxResponseBodyBytes = n }
	}
	p, addr := startProxyOpts(t, Options{Observer: obs}, bound(1<<10), r0, r1)
	backend := func(name string) *Backend {
		tbl := p.Router("orders").Table()
		for i := 0; i < tbl.Len(); i++ {
			if b := tbl.Backend(i); b.Name() == name {
				return b
			}
		}
		t.Fatalf("no backend %s", name)
		return nil
	}
	c := newClient(addr)
	for _, path := range []string{"/cl", "/chunked"} {
		owner := ownerOf(p, "orders", "k1")
		b := backend(owner)
		c.do(t, "GET", "/warm", "", "X-Key", "k1") // a pooled connection to the owner
		if n := b.hc.ConnsCount(); n != 1 {
			t.Fatalf("%d connections to %s, want 1", n, owner)
		}
		before := r0.count.Load() + r1.count.Load()
		// GET is replayable: a failure of another kind would be tried on
		// the next candidate.
		r := c.do(t, "GET", path, "", "X-Key", "k1")
		if r.status != 502 || r.header["X-Replica"] != "" {
			t.Fatalf("%s: %v, want keyway's 502", path, r)
		}
		if e := r.errorJSON(t)["error"]; !strings.Contains(e, "max_response_body_bytes (1KiB)") {
			t.Fatalf("%s: error %q does not name max_response_body_bytes", path, e)
		}
		if n := r0.count.Load() + r1.count.Load() - before; n != 1 {
			t.Fatalf("%s: the replicas got %d requests, want 1 (no retry)", path, n)
		}
		if n := b.ctr.upErrs[errReplyTooLarge].Load(); n < 1 {
			t.Fatalf("%s: %d reply_too_large errors counted", path, n)
		}
		poll.Until(t, 5*time.Second, "the connection the reply came on to close", func() bool { return b.hc.ConnsCount() == 0 })
	}
	obs.mu.Lock()
	for _, o := range obs.obs {
		if o.err != nil {
			t.Errorf("passive health saw %v from %s: a reply over keyway's bound is no evidence against the replica", o.err, o.replica)
		}
	}
	obs.mu.Unlock()

	cfg := testConfig(r0, r1)
	bound(4 << 10)(&cfg)
	mustReload(t, p, cfg)
	for _, path := range []string{"/cl", "/chunked"} {
		if r := c.do(t, "GET", path, "", "X-Key", "k1"); r.status != 200 || r.body != big {
			t.Fatalf("%s after raising max_response_body_bytes: %d, %d bytes", path, r.status, len(r.body))
		}
	}
	bound(1 << 10)(&cfg)
	mustReload(t, p, cfg)
	if r := c.do(t, "GET", "/cl", "", "X-Key", "k1"); r.status != 502 {
		t.Fatalf("after lowering max_response_body_bytes again: %v", r)
	}
}

// TestReplySwitchedProtocols: a replica that answers 101 unasked has left
// its connection in another protocol. The request gets a 502 and the
// next one goes over a new connection, not into the switched one (here
// the switched connection would answer "smuggled").
func TestReplySwitchedProtocols(t *testing.T) {
	var n atomic.Int32
	rep := startRawReplica(t, "r", func(req *fasthttp.Request, conn net.Conn) bool {
		if n.Add(1) == 1 {
			_, _ = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			// What the connection reads next is no longer HTTP to it.
			_, _ = io.Copy(io.Discard, io.LimitReader(conn, 1))
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled")
			return false
		}
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	_, addr := startProxy(t, nil, rep)
	c := newClient(addr)
	if r := c.do(t, "GET", "/a", "", "X-Key", "k1"); r.status != 502 {
		t.Fatalf("101 relayed as %v, want 502", r)
	}
	for i := range 3 {
		r := c.do(t, "GET", "/a", "", "X-Key", "k1")
		if r.status != 200 || r.body != "ok" {
			t.Fatalf("request %d after the 101: %v, want 200 ok over a new connection", i, r)
		}
	}
}

// drops, and chunked with a Content-Length are still refused.
// TestEmptyChunkedBody: an empty chunked body (fasthttp then gives the
// request a Content-Length of 0 and drops Transfer-Encoding) is
// forwarded, trailer fields or not; "identity", which fasthttp also
// drops, and chunked with a Content-Length are still refused.
func TestEmptyChunkedBody(t *testing.T) {
	rep := startReplica(t, "r0")
	_, addr := startProxy(t, nil, rep)
	for _, c := range []struct {
		raw    string
		status int
	}{
		{"POST /ingest HTTP/1.1\r\nHost: orders.example\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 200},
		{"POST /ingest HTTP/1.1\r\nHost: orders.example\r\ntransfer-encoding: Chunked \r\n\r\n0\r\nX-T: 1\r\n\r\n", 200},
		{"POST /ingest HTTP/1.1\r\nHost: orders.example\r\nTransfer-Encoding: identity\r\n\r\n", 400},
		{"POST /ingest HTTP/1.1\r\nHost: orders.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n", 400},
	} {
		rc := dialRaw(t, addr)
		rc.send(t, c.raw)
		if r := rc.read(t); r.status != c.status {
			t.Errorf("%q: %v, want %d", c.raw, r, c.status)
		}
	}
	if n := rep.count.Load(); n != 2 {
		t.Errorf("the replica got %d requests, want the 2 empty chunked ones", n)
	}
	if b := rep.last.Load().Body(); len(b) != 0 {
		t.Errorf("the replica got body %q, want none", b)
	}
}
