package proxy

import (
	"bufio"
	"cmp"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/internal/poll"
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

// dialLog is an Options.dial that records the proxy's connections to
// replicas (the raw TCP connections under the stale-check wrapper).
type dialLog struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *dialLog) dial(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *dialLog) all() []net.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.conns)
}

// The bug this wrapper once had: a proxy idle for longer than
// timeouts.request, whose replica restarted meanwhile, sent its next
// request into the dead pooled connection and answered 502 (kind reset,
// counted against the replica). The stale check must catch it and send
// the request on a fresh connection.
func TestStalePooledConnectionAfterIdleLongerThanRequestTimeout(t *testing.T) {
	skipWithoutPeek(t)
	var mu sync.Mutex
	var served []net.Conn
	r0 := startRawReplica(t, "r0", func(_ *fasthttp.Request, c net.Conn) bool {
		mu.Lock()
		served = append(served, c)
		mu.Unlock()
		_, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nr0"))
		return err == nil
	})
	dl := &dialLog{}
	obs := &recordingObserver{}
	p, addr := startProxyOpts(t, Options{dial: dl.dial, Observer: obs}, nil, r0)
	cl := newClient(addr)
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 {
		t.Fatalf("first POST: %s", r)
	}
	// Idle for longer than timeouts.request: the pooled connection's read
	// deadline lies in the past. Then the replica restarts.
	for _, c := range dl.all() {
		if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	for _, c := range served {
		c.Close()
	}
	mu.Unlock()
	poll.Until(t, 5*time.Second, "the replica's FIN to reach the proxy", func() bool {
		for _, c := range dl.all() {
			if !peerClosed(c) {
				return false
			}
		}
		return true
	})
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 || r.body != "r0" {
		t.Fatalf("POST after the replica closed an idle pooled connection: %s, want 200 from r0", r)
	}
	b := p.Router("orders").Table().Backend(0)
	if got := b.ctr.upErrs[errStale].Load(); got != 1 {
		t.Errorf("stale_conn = %d, want 1", got)
	}
	if got := b.ctr.upErrs[errReset].Load(); got != 0 {
		t.Errorf("reset = %d, want 0", got)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, o := range obs.obs {
		if o.err != nil {
			t.Errorf("the observer was told of a failure: %v", o.err)
		}
	}
}

// A replica that closes or resets a kept-alive connection after reading
// the next request on it (a restart racing the request): not evidence
// against it; a replayable request is sent once more to the same replica
// on a fresh connection, a non-replayable one gets 502. On a fresh
// connection the same failure stays a reset and counts.
func TestReusedConnectionClosedByReplica(t *testing.T) {
	cases := map[string]struct {
		rst      bool     // reset rather than close
		fresh    bool     // fail the first request of every connection instead of the second
		method   string   // default POST
		hdrs     []string // besides X-Key
		status   int      // the client's answer
		kind     errKind  // the failure counted
		observed bool     // the Observer heard of it
		requests int64    // requests r0 received, the failed one included
	}{
		"close, POST":                   {status: 502, kind: errReusedClosed, requests: 2},
		"reset, POST":                   {rst: true, status: 502, kind: errReusedClosed, requests: 2},
		"close, PUT":                    {method: "PUT", status: 200, kind: errReusedClosed, requests: 3},
		"reset, POST with idempotency":  {rst: true, hdrs: []string{"Idempotency-Key", "i-1"}, status: 200, kind: errReusedClosed, requests: 3},
		"fresh connection, close, POST": {fresh: true, status: 502, kind: errReset, observed: true, requests: 1},
		"fresh connection, reset, POST": {fresh: true, rst: true, status: 502, kind: errReset, observed: true, requests: 1},
		"fresh connection, close, PUT":  {fresh: true, method: "PUT", status: 200, kind: errReset, observed: true, requests: 1},
		"close, POST, retries disabled": {status: 502, kind: errReusedClosed, requests: 2},
		"close, PUT, retries disabled":  {method: "PUT", status: 200, kind: errReusedClosed, requests: 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			perConn := map[net.Conn]int{}
			failAt := 2
			if tc.fresh {
				failAt = 1
			}
			r0 := startRawReplica(t, "r0", func(_ *fasthttp.Request, c net.Conn) bool {
				mu.Lock()
				perConn[c]++
				n := perConn[c]
				mu.Unlock()
				if n == failAt {
					if tc.rst {
						_ = c.(*net.TCPConn).SetLinger(0)
					}
					return false // closed (or reset) without a response byte
				}
				_, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nr0"))
				return err == nil
			})
			r1 := startReplica(t, "r1")
			obs := &recordingObserver{}
			reg := newRegistry()
			p, addr := startProxyOpts(t, Options{Observer: obs, Registerer: reg}, func(c *Config) {
				if strings.HasSuffix(name, "retries disabled") {
					c.ReplicaSets[0].Retries.Attempts = 1
				}
			}, r0, r1)
			key := keyOwnedBy(t, p, "r0")
			if !strings.HasSuffix(name, "retries disabled") {
				key = keyWithCandidates(t, p, "r0", "r1")
			}
			cl := newClient(addr)
			if !tc.fresh {
				if r := cl.do(t, "POST", "/ingest", "x", "X-Key", key); r.status != 200 || r.body != "r0" {
					t.Fatalf("first POST: %s", r)
				}
			}
			method := cmp.Or(tc.method, "POST")
			r := cl.do(t, method, "/ingest", "x", append([]string{"X-Key", key}, tc.hdrs...)...)
			if r.status != tc.status {
				t.Fatalf("%s on a connection r0 then lost: %s, want %d", method, r, tc.status)
			}
			if want := "r0"; tc.status == 200 && !tc.fresh && r.body != want {
				t.Fatalf("answered by %q, want %s (the same replica, on a fresh connection)", r.body, want)
			}
			if want := "r1"; tc.status == 200 && tc.fresh && r.body != want {
				t.Fatalf("answered by %q, want %s (the next candidate)", r.body, want)
			}
			if tc.status == 502 && !strings.Contains(r.body, tc.kind.String()) {
				t.Errorf("502 body %q does not name %s", r.body, tc.kind)
			}
			b := p.Router("orders").Table().Backend(0)
			if b.Name() != "r0" {
				t.Fatalf("slot 0 is %s", b.Name())
			}
			for k := errKind(0); k < errKinds; k++ {
				want := uint64(0)
				if k == tc.kind {
					want = 1
				}
				if got := b.ctr.upErrs[k].Load(); got != want {
					t.Errorf("%s errors = %d, want %d", k, got, want)
				}
			}
			if got := r0.count.Load(); got != tc.requests {
				t.Errorf("r0 received %d requests, want %d", got, tc.requests)
			}
			wantR1 := int64(0)
			if tc.fresh && tc.status == 200 {
				wantR1 = 1 // a reset on a fresh connection retries on the next candidate
			}
			if got := r1.count.Load(); got != wantR1 {
				t.Errorf("r1 received %d requests, want %d", got, wantR1)
			}
			obs.mu.Lock()
			observed := false
			for _, o := range obs.obs {
				if o.err != nil {
					observed = true
				}
			}
			obs.mu.Unlock()
			if observed != tc.observed {
				t.Errorf("the observer heard of the failure: %v, want %v", observed, tc.observed)
			}
			retries, _ := sample(t, reg, "keyway_retries_total", map[string]string{"set": "orders"})
			if want := float64(wantR1); retries != want {
				t.Errorf("keyway_retries_total = %v, want %v (a try again on the same replica is not a retry on another candidate)", retries, want)
			}
		})
	}
}
