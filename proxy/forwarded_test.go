package proxy

import (
	"bufio"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// rawBytesReplica is a replica that keeps the exact bytes of each request it
// reads (head and Content-Length body) and answers 200 "ok".
type rawBytesReplica struct {
	ln  net.Listener
	got chan string
}

func startBytesReplica(t *testing.T) *rawBytesReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rawBytesReplica{ln: ln, got: make(chan string, 16)}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					var head strings.Builder
					n, chunked := 0, false
					for {
						line, err := br.ReadString('\n')
						if err != nil {
							return
						}
						head.WriteString(line)
						name, v, _ := strings.Cut(line, ":")
						switch {
						case strings.EqualFold(name, "Content-Length"):
							n, _ = strconv.Atoi(strings.TrimSpace(v))
						case strings.EqualFold(name, "Transfer-Encoding"):
							chunked = true
						}
						if line == "\r\n" {
							break
						}
					}
					if chunked {
						// Chunks, then trailer lines to an empty one.
						for {
							line, err := br.ReadString('\n')
							if err != nil {
								return
							}
							head.WriteString(line)
							size, err := strconv.ParseInt(strings.TrimSpace(line), 16, 32)
							if err != nil {
								return
							}
							if size == 0 {
								break
							}
							chunk := make([]byte, size+2)
							if _, err := io.ReadFull(br, chunk); err != nil {
								return
							}
							head.Write(chunk)
						}
						for {
							line, err := br.ReadString('\n')
							if err != nil {
								return
							}
							head.WriteString(line)
							if line == "\r\n" {
								break
							}
						}
					}
					body := make([]byte, n)
					if _, err := io.ReadFull(br, body); err != nil {
						return
					}
					r.got <- head.String() + string(body)
					if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return r
}

func (r *rawBytesReplica) next(t *testing.T) string {
	t.Helper()
	return within(t, r.got, 5*time.Second, "the replica to receive a request")
}

var anyRequestID = regexp.MustCompile(`(?m)^X-Request-Id: [0-9a-f]{32}\r\n`)

// TestForwardedBytesAsHeaderAPI: a request whose forwarding headers the
// replica transport writes (forwarded.go) reaches the replica in the bytes
// fasthttp's header API would have sent, for requests of every shape: with
// a body beyond the transport's write buffer, a head beyond it, the
// client's own request ID (kept) or an empty one (replaced), HTTP/1.0,
// the client's forwarding headers, chunked bodies with trailer fields (the
// last two the header API's way: a chunked request may be written with
// trailers after its body), cookies. For an
// empty request ID the lines are the same but for their order: the header
// API sets the ID in the empty one's place, the transport writes it last,
// which also tells that the transport wrote it.
func TestForwardedBytesAsHeaderAPI(t *testing.T) {
	rep := startBytesReplica(t)
	one := func(c *Config) {
		c.ReplicaSets[0].Replicas = 1
		c.ReplicaSets[0].Static = []StaticReplica{{Name: "bytes", Addr: rep.ln.Addr().String(), Weight: 1}}
	}
	_, spliced := startProxyOpts(t, Options{}, one)
	_, viaAPI := startProxyOpts(t, Options{headerAPIForwarding: true}, one)

	big := strings.Repeat("b", 10<<10)
	cases := []struct {
		name, raw string
		sorted    bool // compare the head's lines as sets
	}{
		{"keyed POST", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}", false},
		{"GET, no body", "GET /x?y=1 HTTP/1.1\r\nHost: orders.example\r\nX-Key: k2\r\nAccept-Encoding: gzip\r\n\r\n", false},
		{"body beyond the write buffer", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k3\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big, false},
		{"head beyond the write buffer", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k4\r\nX-Big: " + strings.Repeat("h", 5000) + "\r\nContent-Length: 2\r\n\r\nhi", false},
		{"client's request ID", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Request-Id: mine-1\r\nContent-Length: 2\r\n\r\nhi", false},
		{"empty request ID", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Request-Id: \r\nContent-Length: 2\r\n\r\nhi", true},
		{"HTTP/1.0", "POST /ingest HTTP/1.0\r\nHost: orders.example\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi", false},
		{"client's forwarding headers", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nContent-Length: 2\r\n\r\nhi", false},
		{"chunked, trailer fields", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-T: 1\r\n\r\n", false},
		{"chunked, empty body, trailer fields", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n\r\n", false},
		{"announced trailer", "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n\r\n", false},
		{"cookies", "GET /c HTTP/1.1\r\nHost: orders.example\r\nCookie: a=1; b=2\r\nX-Key: k5\r\n\r\n", false},
	}
	send := func(addr, raw string) string {
		t.Helper()
		rc := dialRaw(t, addr)
		rc.send(t, raw)
		if r := rc.read(t); r.status != 200 {
			t.Fatalf("answer %v", r)
		}
		return anyRequestID.ReplaceAllString(rep.next(t), "X-Request-Id: (generated)\r\n")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := send(spliced, c.raw), send(viaAPI, c.raw)
			if !strings.Contains(a, "\r\nX-Forwarded-For: ") || !strings.Contains(a, "\r\nX-Request-Id: ") {
				t.Fatalf("no forwarding headers:\n%s", a)
			}
			if c.sorted {
				ha, bodyA, _ := strings.Cut(a, "\r\n\r\n")
				hb, bodyB, _ := strings.Cut(b, "\r\n\r\n")
				la, lb := strings.Split(ha, "\r\n"), strings.Split(hb, "\r\n")
				if !strings.HasPrefix(la[len(la)-1], "X-Request-Id: ") || strings.HasPrefix(lb[len(lb)-1], "X-Request-Id: ") {
					t.Errorf("want the forwarding lines last only where the transport wrote them:\n%s\n--\n%s", ha, hb)
				}
				slices.Sort(la)
				slices.Sort(lb)
				if !slices.Equal(la, lb) || bodyA != bodyB {
					t.Errorf("transport:\n%s\nheader API:\n%s", a, b)
				}
				return
			}
			if a != b {
				t.Errorf("transport:\n%.600s\nheader API:\n%.600s", a, b)
			}
		})
	}
	if got := send(spliced, cases[4].raw); !strings.Contains(got, "\r\nX-Request-Id: mine-1\r\n") || strings.Count(got, "X-Request-Id") != 1 {
		t.Errorf("the client's request ID: want it once, kept:\n%s", got)
	}
	if got := send(spliced, cases[5].raw); strings.Count(got, "X-Request-Id") != 1 || !strings.Contains(got, "X-Request-Id: (generated)") {
		t.Errorf("an empty request ID: want one generated in its place:\n%s", got)
	}
}

// TestForwardedTransportDeadline: a replica that does not answer gets the
// request's deadline from the transport: a 504 within timeouts.request.
func TestForwardedTransportDeadline(t *testing.T) {
	mute, release := slowReplica(t, "mute")
	t.Cleanup(release)
	_, addr := startProxy(t, func(c *Config) {
		c.ReplicaSets[0].Timeouts.Request = 300 * time.Millisecond
		c.ReplicaSets[0].Timeouts.Connect = 100 * time.Millisecond
	}, mute)
	rc := dialRaw(t, addr)
	start := time.Now()
	rc.send(t, "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\nContent-Length: 2\r\n\r\nhi")
	r := rc.read(t)
	if r.status != fasthttp.StatusGatewayTimeout {
		t.Fatalf("answer %v, want 504", r)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("answered after %v, before timeouts.request (300ms)", d)
	}
}
