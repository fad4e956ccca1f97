package proxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

// A replica that closed a pooled connection (idle timeout, restart) must
// not cost a POST its answer: keyway notices the dead connection before
// writing and sends the request on a fresh one.
func TestStalePooledConnectionIsNotA502(t *testing.T) {
	// A raw replica: answers one request per connection with keep-alive
	// headers, then closes the connection and says so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	closed := make(chan struct{}, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				var req fasthttp.Request
				if req.Read(br) == nil {
					c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nr0"))
				}
				c.Close()
				closed <- struct{}{}
			}()
		}
	}()
	r0 := &testReplica{name: "r0", ln: ln}
	p, addr := startProxy(t, nil, r0)
	cl := newClient(addr)
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 {
		t.Fatalf("first POST: %s", r)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the replica did not close the connection")
	}
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 || r.body != "r0" {
		t.Fatalf("POST on a connection the replica closed: %s, want 200 from r0", r)
	}
	b := p.Router("orders").Table().Backend(0)
	if got := testutil.ToFloat64(b.upErrs[errStale]); got != 1 {
		t.Fatalf("stale_conn errors = %v, want 1", got)
	}
	if got := testutil.ToFloat64(b.upErrs[errReset]); got != 0 {
		t.Fatalf("reset errors = %v, want 0", got)
	}
}
