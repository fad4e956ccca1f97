package proxy

import (
	"bufio"
	"net"
	"sync"
	"testing"
	"time"

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
	if got := b.ctr.upErrs[errStale].Load(); got != 1 {
		t.Fatalf("stale_conn errors = %v, want 1", got)
	}
	if got := b.ctr.upErrs[errReset].Load(); got != 0 {
		t.Fatalf("reset errors = %v, want 0", got)
	}
}

// Several pooled connections to a replica that closed them all (a restart
// on the same address, or its idle timeout firing for all of them): the
// request must still reach that replica, on a fresh connection, rather
// than move to the stand-in because the next pooled connection was dead
// too.
func TestAllPooledConnectionsStaleKeepsTheOwner(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var conns []net.Conn
	got := make(chan struct{}, 16)
	gate := make(chan struct{})
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
				br := bufio.NewReader(c)
				for {
					var req fasthttp.Request
					if req.Read(br) != nil {
						return
					}
					got <- struct{}{}
					<-gate
					c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nr0"))
				}
			}()
		}
	}()
	r0 := &testReplica{name: "r0", ln: ln, keys: map[string]int{}}
	r1 := startReplica(t, "r1")
	p, addr := startProxy(t, nil, r0, r1)
	key := keyOwnedBy(t, p, "r0")
	// Three concurrent requests, held by r0 until all three arrived: three
	// pooled connections.
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key) }()
	}
	for i := 0; i < 3; i++ {
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("r0 did not receive three concurrent requests")
		}
	}
	close(gate)
	wg.Wait()
	mu.Lock()
	if len(conns) < 2 {
		t.Fatalf("only %d pooled connection(s) to r0; the test needs several", len(conns))
	}
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	if r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 200 || r.body != "r0" {
		t.Fatalf("POST for r0's key after r0 closed every pooled connection: %s, want 200 from r0", r)
	}
}
