package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/internal/testcerts"
	"keyway/proxy/internal/wire"
)

// TestTransferCodingAnswer: the answer to each Transfer-Encoding fasthttp
// refuses, by the RFC 9112 rule that decides it.
func TestTransferCodingAnswer(t *testing.T) {
	cases := []struct {
		te   string
		want int
	}{
		{"gzip", 400},             // section 6.3: chunked not final
		{"chunked, gzip", 400},    // section 6.3
		{"", 400},                 // section 6.3: no coding at all
		{" , ,", 400},             // section 6.3: empty list
		{"identity", 400},         // section 6.3
		{"chunked, chunked", 400}, // section 6.1: chunked twice
		{"gzip,chunked,chunked", 400},
		{"gzip, chunked", 501}, // section 6.1: a coding keyway does not implement
		{"GZIP , Chunked", 501},
		{"x-a;b=c;d = e, chunked", 501},
		{"chunked;x=1", 501},
		{"gzip;x, chunked", 400}, // a parameter without value: not a transfer-coding
		{"gzip;x=\"1\", chunked", 400},
		{"gz ip, chunked", 400},
		{"gzip, chunked;", 400},
	}
	scan := func(head string) *wire.HeadScan {
		var s wire.HeadScan
		s.Scan([]byte(head))
		return &s
	}
	for _, c := range cases {
		s := scan("POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:" + c.te + "\r\n\r\n")
		if got, msg := transferCodingAnswer(s); got != c.want {
			t.Errorf("%q: %d (%s), want %d", c.te, got, msg, c.want)
		}
	}
	for name, head := range map[string]string{
		"HTTP/1.0":       "POST /a HTTP/1.0\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"Content-Length": "POST /a HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n",
		"folded":         "POST /a HTTP/1.1\r\nTransfer-Encoding: gzip,\r\n chunked\r\n\r\n",
		// The head's end not seen yet, or no byte of it seen at all (a
		// pipelined head the scan could not follow).
		"head incomplete": "POST /a HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n",
		"not scanned":     "",
	} {
		if got, msg := transferCodingAnswer(scan(head)); got != 400 {
			t.Errorf("gzip, chunked, %s: %d (%s), want 400", name, got, msg)
		}
	}
	if got, _ := transferCodingAnswer(nil); got != 400 {
		t.Errorf("no scan: %d, want 400", got)
	}
}

// TestHeadScanReads serves one connection whose reads end where the test
// says (net.Pipe delivers each write as it is): the answer must not depend
// on them, and a head that began in an earlier read than its own
// (pipelined) is not scanned, so its body is never taken for a head.
func TestHeadScanReads(t *testing.T) {
	var p *Proxy
	rep := startByteReplica(t)
	p, _ = startProxy(t, func(c *Config) {
		c.Server.ReadTimeout = 30 * time.Second
		sc := &c.ReplicaSets[0]
		sc.Static = []StaticReplica{{Name: "r", Addr: rep.addr(), Weight: 1}}
		sc.Replicas = 1
	})
	h := "Host: orders.example\r\nX-Key: k1\r\n"
	cases := []struct {
		name   string
		writes []string
		want   []int
	}{
		{"CRLF CRLF split", []string{"GET /a HTTP/1.1\r\n" + h + "\r", "\n"}, []int{200}},
		{"CRLF CRLF split 2", []string{"GET /a HTTP/1.1\r\n" + h, "\r\n"}, []int{200}},
		{"bare LF split", []string{"GET /a HTTP/1.1\nHost: orders.example\n", "X-Key: k1\n", "\n"}, []int{400}},
		{"bare LF after CRLF split", []string{"GET /a HTTP/1.1\r\n" + h, "\n"}, []int{400}},
		{"body with bare LFs, slow", []string{"POST /a HTTP/1.1\r\n" + h + "Content-Length: 7\r\n\r\nab", "x\n\n", "cd"}, []int{200}},
		{"body with bare LFs, head split", []string{"POST /a HTTP/1.1\r\n" + h + "Content-Length: 7\r\n", "\r\nab", "x\n\n", "cd"}, []int{200}},
		{"keep-alive, bare LF second", []string{"GET /a HTTP/1.1\r\n" + h + "\r\n", "GET /b HTTP/1.1\nHost: orders.example\n\n"}, []int{200, 400}},
		{"keep-alive, body with bare LFs second", []string{"GET /a HTTP/1.1\r\n" + h + "\r\n", "POST /b HTTP/1.1\r\n" + h + "Content-Length: 7\r\n\r\nab", "x\n\n", "cd"}, []int{200, 200}},
		// The second head and the body's start come with the first
		// request: a scan starting at the next read would take "x" for
		// a request line and the LFs for its bare-LF end.
		{"pipelined, body with bare LFs, slow", []string{"GET /a HTTP/1.1\r\n" + h + "\r\nPOST /b HTTP/1.1\r\n" + h + "Content-Length: 7\r\n\r\nab", "x\n\n", "cd"}, []int{200, 200}},
		{"pipelined, head split", []string{"GET /a HTTP/1.1\r\n" + h + "\r\nPOST /b HTTP/1.1\r\n", h + "Content-Length: 4\r\n\r\n\n\n", "xy"}, []int{200, 200}},
		{"request line split, too long", []string{"GET /" + strings.Repeat("a", 10000), strings.Repeat("a", 10000)}, []int{414}},
		{"TE split", []string{"POST /a HTTP/1.1\r\n" + h + "Transfer-Enc", "oding: gzip, chu", "nked\r\n\r\n"}, []int{501}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = p.server.ServeConn(wire.NewClientConn(server, &wire.Front{}, true))
			}()
			_ = client.SetDeadline(time.Now().Add(5 * time.Second))
			statuses := make(chan []int, 1)
			go func() {
				var got []int
				br := bufio.NewReader(client)
				for range c.want {
					var resp fasthttp.Response
					if err := resp.Read(br); err != nil {
						break
					}
					got = append(got, resp.StatusCode())
				}
				statuses <- got
			}()
			for _, w := range c.writes {
				if _, err := io.WriteString(client, w); err != nil {
					break // the proxy answered and closed
				}
			}
			got := <-statuses
			if !slices.Equal(got, c.want) {
				t.Fatalf("statuses %v, want %v", got, c.want)
			}
			if last := c.want[len(c.want)-1]; last >= 400 {
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("the connection was not closed after a refused request")
				}
			}
		})
	}
}

// TestTLSHeadScan: over TLS the heads are followed above TLS, and the
// connection is still TLS to fasthttp (X-Forwarded-Proto: https).
func TestTLSHeadScan(t *testing.T) {
	ca := testcerts.New(t)
	r := startReplica(t, "r0")
	_, addr := startProxy(t, func(c *Config) {
		withTLS(t, ca)(c)
		c.Server.ReadTimeout = 30 * time.Second
	}, r)
	h := "Host: orders.example\r\nX-Key: k1\r\n"
	for _, c := range []struct {
		raw  string
		want int
	}{
		{"GET /a HTTP/1.1\r\n" + h + "\r\n", 200},
		{"GET /a HTTP/1.1\nHost: orders.example\nX-Key: k1\n\n", 400},
		{"POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
		{"GET /" + strings.Repeat("a", 20<<10) + " HTTP/1.1\r\n" + h + "\r\n", 414},
	} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "orders.example"})
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, c.raw); err != nil {
			t.Fatal(err)
		}
		var resp fasthttp.Response
		err = resp.Read(bufio.NewReader(conn))
		conn.Close()
		if err != nil || resp.StatusCode() != c.want {
			t.Fatalf("%.60q: %d %v, want %d", c.raw, resp.StatusCode(), err, c.want)
		}
		if c.want == 200 {
			if got := string(r.last.Load().Header.Peek("X-Forwarded-Proto")); got != "https" {
				t.Fatalf("X-Forwarded-Proto %q, want https", got)
			}
		}
	}
}
