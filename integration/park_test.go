package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"keyway/internal/poll"
)

// Idle keep-alive connections park (server.park_idle_after) in the real
// binary: the proxy's goroutines go back down, every parked connection
// still carries its next request, and a client that resets its parked
// connection leaves nothing behind.
func TestIdleConnectionsPark(t *testing.T) {
	skipShort(t)
	const n = 40
	_, raddr := StartReplicaProcess(t, "orders-0")
	cfg := WriteFile(t, t.TempDir(), "park.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
server: {park_idle_after: 200ms}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: %q}]
`, raddr))
	p := Start(t, "keyway", "proxy", "-c", cfg)
	addr := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	admin := p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	metric := func(name string) float64 { return Metric(admin, name, nil) }

	type conn struct {
		c  net.Conn
		br *bufio.Reader
	}
	send := func(c conn, i int) {
		t.Helper()
		_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c.c, "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: k-%d\r\nContent-Length: 2\r\n\r\nhi", i); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("connection %d: %s", i, resp.Status)
		}
	}
	before := replicaRequests(t, raddr)
	goBefore := metric("go_goroutines")
	cs := make([]conn, n)
	for i := range cs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = conn{c, bufio.NewReader(c)}
		send(cs[i], i)
	}
	poll.Until(t, 10*time.Second, "every connection to park", func() bool { return metric("keyway_parked_connections") == n })
	poll.Until(t, 10*time.Second, "their goroutines to end", func() bool { return metric("go_goroutines") < goBefore+n/4 })
	for i, c := range cs {
		send(c, i)
	}
	if got := metric("keyway_connection_unparks_total"); got != n {
		t.Fatalf("keyway_connection_unparks_total = %v, want %d", got, n)
	}
	if got := replicaRequests(t, raddr) - before; got != 2*n {
		t.Fatalf("the replica received %d requests, want %d", got, 2*n)
	}
	poll.Until(t, 10*time.Second, "them to park again", func() bool { return metric("keyway_parked_connections") == n })
	// Half the clients reset their connection (no FIN, an RST).
	for _, c := range cs[:n/2] {
		_ = c.c.(*net.TCPConn).SetLinger(0)
		c.c.Close()
	}
	poll.Until(t, 10*time.Second, "the reset connections to leave", func() bool {
		return metric("keyway_parked_connections") == n/2 && metric("keyway_connection_unparks_total") == n+n/2
	})
	for i, c := range cs[n/2:] {
		send(c, n/2+i)
	}
}
