package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowStack is a proxy (read_timeout 1s, max_conns 8) in front of one
// demo replica.
func slowStack(t *testing.T) (proxyAddr, adminAddr, replicaAddr string) {
	t.Helper()
	_, raddr := StartReplicaProcess(t, "orders-0")
	cfg := WriteFile(t, t.TempDir(), "slow.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
server: {read_timeout: 1s, max_conns: 8}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: %q}]
`, raddr))
	p := Start(t, "keyway", "proxy", "-c", cfg)
	return p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1],
		p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1], raddr
}

// closedWithin reads from c until it is closed or d passes, and returns
// what it read and whether it was closed in time.
func closedWithin(c net.Conn, d time.Duration) (string, bool) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return string(b), false
	}
	return string(b), true
}

func replicaRequests(t *testing.T, replicaAddr string) int64 {
	t.Helper()
	var n int64
	for _, c := range Stats(t, replicaAddr) {
		n += c
	}
	return n
}

// Slow-header and slow-body clients are closed at the read deadline
// (server.read_timeout), nothing of theirs reaches the replica, and the
// requests of other clients are answered meanwhile.
func TestSlowClientsClosedAtTheirDeadline(t *testing.T) {
	skipShort(t)
	px, _, raddr := slowStack(t)
	before := replicaRequests(t, raddr)

	// Other clients keep being served while the slow ones hang on.
	var stop atomic.Bool
	var served, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		c := NewClient()
		for !stop.Load() {
			if code, _, err := c.Send(px, "k"); err != nil || code != 200 {
				failed.Add(1)
			} else {
				served.Add(1)
			}
		}
	})

	for name, send := range map[string]string{
		"slow headers": "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: k",
		"slow body":    "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nContent-Length: 100\r\n\r\n0123456789",
	} {
		c, err := net.Dial("tcp", px)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := io.WriteString(c, send); err != nil {
			t.Fatal(err)
		}
		got, closed := closedWithin(c, 5*time.Second)
		c.Close()
		if !closed {
			t.Fatalf("%s: still open 5s after the last byte (read_timeout is 1s)", name)
		}
		t.Logf("%s: closed after %s with %q", name, time.Since(start).Round(time.Millisecond), firstLine(got))
		if got != "" && !strings.HasPrefix(got, "HTTP/1.1 408") {
			t.Fatalf("%s: answered %q, want nothing or 408", name, firstLine(got))
		}
	}
	stop.Store(true)
	wg.Wait()
	if failed.Load() > 0 || served.Load() == 0 {
		t.Fatalf("other clients meanwhile: %d served, %d failed", served.Load(), failed.Load())
	}
	if got := replicaRequests(t, raddr) - before; got != served.Load() {
		t.Fatalf("the replica received %d requests, the well-behaved client sent %d: a slow client's request reached it", got, served.Load())
	}
}

// Connections beyond server.max_conns are refused at once (503, closed)
// while the ones admitted keep working, and the admin listener (its own
// listener) stays responsive.
func TestMaxConnsRefusesBeyondAndAdminStaysUp(t *testing.T) {
	skipShort(t)
	px, adminAddr, _ := slowStack(t)
	var conns []*bufio.ReadWriter
	var raw []net.Conn
	t.Cleanup(func() {
		for _, c := range raw {
			c.Close()
		}
	})
	req := "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nContent-Length: 1\r\n\r\nx"
	for range 8 {
		c, err := net.Dial("tcp", px)
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, c)
		rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		conns = append(conns, rw)
		if _, err := rw.WriteString(req); err != nil {
			t.Fatal(err)
		}
		rw.Flush()
		resp, err := http.ReadResponse(rw.Reader, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("admitted connection: %v %v", resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// The ninth is refused at once.
	c, err := net.Dial("tcp", px)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, req)
	got, closed := closedWithin(c, 5*time.Second)
	c.Close()
	if !closed || !strings.HasPrefix(got, "HTTP/1.1 503") {
		t.Fatalf("a connection beyond max_conns: closed %v, answered %q; want 503 and closed", closed, firstLine(got))
	}
	// The admin listener answers meanwhile.
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, path := range []string{"/healthz", "/v1/replica_sets", "/metrics"} {
		resp, err := hc.Get("http://" + adminAddr + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("admin %s with the proxy full: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	// And the admitted connections still work.
	for _, rw := range conns {
		_, _ = rw.WriteString(req)
		rw.Flush()
		resp, err := http.ReadResponse(rw.Reader, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("an admitted connection after the refusal: %v %v", resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	return l
}
