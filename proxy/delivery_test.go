package proxy

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

// resetReplica reads each request and then drops the connection without
// answering: with rst it aborts it (RST), otherwise it closes it (FIN).
func resetReplica(t testing.TB, name string, rst bool) *testReplica {
	return startRawReplica(t, name, func(_ *fasthttp.Request, c net.Conn) bool {
		if tc, ok := c.(*net.TCPConn); ok && rst {
			_ = tc.SetLinger(0)
		}
		return false
	})
}

// slowReplica answers only once released; release runs before the proxy
// stops when registered after startProxy.
func slowReplica(t testing.TB, name string) (r *testReplica, release func()) {
	r = startReplica(t, name)
	ch := make(chan struct{})
	r.setHandler(func(ctx *fasthttp.RequestCtx) {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
		}
		ctx.SetBodyString(name)
	})
	done := false
	return r, func() {
		if !done {
			done = true
			close(ch)
		}
	}
}

// TestDialFailureIsRetried: a replica whose listener is closed never got
// the request, so even a POST goes to the next candidate.
func TestDialFailureIsRetried(t *testing.T) {
	cases := map[string]struct {
		attempts  int
		stopBoth  bool
		status    int
		wantBody  string
		wantRetry bool
	}{
		"POST goes to the next candidate":  {attempts: 2, status: 200, wantBody: "live"},
		"no attempts left: 503":            {attempts: 1, status: 503},
		"every candidate refuses: 503":     {attempts: 2, stopBoth: true, status: 503},
		"more attempts than replicas: 200": {attempts: 5, status: 200, wantBody: "live"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dead, live := startReplica(t, "dead"), startReplica(t, "live")
			p, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].Retries.Attempts = tc.attempts }, dead, live)
			key := keyOwnedBy(t, p, "dead")
			dead.stop(t)
			if tc.stopBoth {
				live.stop(t)
			}
			r := newClient(addr).do(t, "POST", "/ingest", "payload", "X-Key", key)
			if r.status != tc.status {
				t.Fatalf("got %v, want %d", r, tc.status)
			}
			if tc.status == 200 {
				if r.body != tc.wantBody {
					t.Fatalf("answered by %q, want %q", r.body, tc.wantBody)
				}
				// The retried answer is relayed as it is: the replica sent no
				// Content-Type or Server, and keyway adds none.
				for _, h := range []string{"Content-Type", "Server"} {
					if v, ok := r.header[h]; ok {
						t.Errorf("%s %q injected into a retried answer", h, v)
					}
				}
				return
			}
			if r.header["Retry-After"] == "" {
				t.Fatalf("503 without Retry-After: %v", r)
			}
			m := r.errorJSON(t)
			if m["replica_set"] != "orders" || m["replica"] == "" {
				t.Fatalf("error body %v: want set orders and the replica tried last", m)
			}
		})
	}
}

// TestFateUnknown: once a request may have reached a replica (timeout,
// reset after sending) it is retried only when replayable: an idempotent
// method or the idempotency header.
func TestFateUnknown(t *testing.T) {
	type tc struct {
		failure  string // "timeout", "close" (FIN after reading) or "rst"
		method   string
		hdrs     []string
		idemHdr  *string
		status   int
		retried  bool
		attempts int
	}
	custom := "X-Idem"
	none := ""
	reqID := "X-Request-Id"
	cases := map[string]tc{
		"POST timeout: 504, not retried": {failure: "timeout", method: "POST", status: 504},
		// timeouts.request bounds the whole exchange, retries included, and
		// the replica's read timeout is the same budget: a timed-out attempt
		// leaves no time, so even a GET gets 504 without a retry.
		"GET timeout: 504, no time left to retry":    {failure: "timeout", method: "GET", status: 504},
		"POST with Idempotency-Key timeout: 504":     {failure: "timeout", method: "POST", hdrs: []string{"Idempotency-Key", "i1"}, status: 504},
		"POST reset (FIN): 502, not retried":         {failure: "close", method: "POST", status: 502},
		"POST reset (RST): 502, not retried":         {failure: "rst", method: "POST", status: 502},
		"POST reset with Idempotency-Key: retried":   {failure: "close", method: "POST", hdrs: []string{"Idempotency-Key", "i1"}, status: 200, retried: true},
		"POST RST with Idempotency-Key: retried":     {failure: "rst", method: "POST", hdrs: []string{"idempotency-key", "i1"}, status: 200, retried: true},
		"PUT reset: retried":                         {failure: "close", method: "PUT", status: 200, retried: true},
		"GET reset: retried":                         {failure: "close", method: "GET", status: 200, retried: true},
		"DELETE reset: retried":                      {failure: "close", method: "DELETE", status: 200, retried: true},
		"PATCH reset: 502":                           {failure: "close", method: "PATCH", status: 502},
		"custom idempotency header: retried":         {failure: "close", method: "POST", hdrs: []string{"X-Idem", "1"}, idemHdr: &custom, status: 200, retried: true},
		"custom header set, Idempotency-Key ignored": {failure: "close", method: "POST", hdrs: []string{"Idempotency-Key", "1"}, idemHdr: &custom, status: 502},
		"idempotency header disabled: 502":           {failure: "close", method: "POST", hdrs: []string{"Idempotency-Key", "1"}, idemHdr: &none, status: 502},
		"GET reset with attempts 1: 502":             {failure: "close", method: "GET", status: 502, attempts: 1},
		// keyway's own request ID, which every attempt carries, counts as
		// the idempotency header X-Request-Id, written by the replica
		// transport or, with the client's X-Forwarded-For, set in the
		// header.
		"X-Request-Id as the idempotency header, keyway's: retried": {failure: "close", method: "POST", idemHdr: &reqID, status: 200, retried: true},
		"the same, with the client's X-Forwarded-For: retried":      {failure: "close", method: "POST", hdrs: []string{"X-Forwarded-For", "192.0.2.1"}, idemHdr: &reqID, status: 200, retried: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var bad *testReplica
			release := func() {}
			switch tc.failure {
			case "timeout":
				bad, release = slowReplica(t, "bad")
			default:
				bad = resetReplica(t, "bad", tc.failure == "rst")
			}
			other := startReplica(t, "other")
			p, addr := startProxy(t, func(c *Config) {
				sc := &c.ReplicaSets[0]
				sc.Timeouts.Request = 300 * time.Millisecond
				sc.Timeouts.Connect = 100 * time.Millisecond
				if tc.idemHdr != nil {
					sc.Retries.IdempotencyHeader = *tc.idemHdr
				}
				if tc.attempts > 0 {
					sc.Retries.Attempts = tc.attempts
				}
			}, bad, other)
			t.Cleanup(release)
			key := keyOwnedBy(t, p, "bad")
			body := ""
			if tc.method != "GET" && tc.method != "DELETE" {
				body = "payload"
			}
			r := newClient(addr).do(t, tc.method, "/ingest", body, append([]string{"X-Key", key}, tc.hdrs...)...)
			if r.status != tc.status {
				t.Fatalf("got %v, want %d", r, tc.status)
			}
			if got := bad.count.Load(); got != 1 {
				t.Fatalf("the failing replica saw %d requests, want 1", got)
			}
			if tc.retried {
				if r.body != "other" || other.count.Load() != 1 {
					t.Fatalf("want the retry answered by other: %v, other saw %d", r, other.count.Load())
				}
				if v, ok := r.header["Content-Type"]; ok {
					t.Errorf("Content-Type %q injected into a retried answer", v)
				}
				return
			}
			if n := other.count.Load(); n != 0 {
				t.Fatalf("a request whose fate was unknown was sent again: other saw %d", n)
			}
			m := r.errorJSON(t)
			if m["replica"] != "bad" || m["replica_set"] != "orders" {
				t.Fatalf("error body %v: want replica bad of orders", m)
			}
			if r.header["Retry-After"] != "" {
				t.Fatalf("%d with Retry-After: a retry may duplicate the request", r.status)
			}
		})
	}
}

// TestErrorStatuses checks every status keyway answers itself, and the
// shape of its body: {"error","replica_set","replica"} as application/json.
func TestErrorStatuses(t *testing.T) {
	type tc struct {
		setup       func(t *testing.T) (addr string, send func(t *testing.T, addr string) reply)
		status      int
		set         string
		replica     string
		retryAfter  bool
		errContains string
	}
	post := func(uri, body string, hdrs ...string) func(t *testing.T, addr string) reply {
		return func(t *testing.T, addr string) reply { return newClient(addr).do(t, "POST", uri, body, hdrs...) }
	}
	simple := func(modify func(*Config), send func(t *testing.T, addr string) reply) func(t *testing.T) (string, func(*testing.T, string) reply) {
		return func(t *testing.T) (string, func(*testing.T, string) reply) {
			_, addr := startProxy(t, modify, startReplica(t, "r0"), startReplica(t, "r1"))
			return addr, send
		}
	}
	twoSets := func(c *Config) {
		small := c.ReplicaSets[0]
		small.Name, small.Match.PathPrefix, small.MaxBodyBytes = "small", "/small", 1<<10
		big := c.ReplicaSets[0]
		big.Name, big.Match.PathPrefix, big.MaxBodyBytes = "big", "/big", 64<<10
		c.ReplicaSets = []SetConfig{small, big}
	}
	cases := map[string]tc{
		"400 bad key": {
			setup: simple(func(c *Config) {
				c.ReplicaSets[0].Key = []balancer.KeySource{{PathSegment: 2}}
			}, post("/ingest/a%2Fb", "x")),
			status: 400, set: "orders", errContains: "canonical",
		},
		"400 no key with reject": {
			setup: simple(func(c *Config) {
				c.ReplicaSets[0].Fallback = balancer.FallbackReject
			}, post("/ingest", "x")),
			status: 400, set: "orders", errContains: "header X-Key",
		},
		"404 no set matches": {
			setup: simple(func(c *Config) {
				c.ReplicaSets[0].Match.PathPrefix = "/ingest"
			}, post("/elsewhere", "x", "X-Key", "k")),
			status: 404, errContains: "/elsewhere",
		},
		"413 over the set's max_body_bytes": {
			setup:  simple(twoSets, post("/small", strings.Repeat("x", 2<<10), "X-Key", "k")),
			status: 413, set: "small", errContains: "max_body_bytes",
		},
		"413 over the server-wide limit": {
			setup:  simple(twoSets, post("/big", strings.Repeat("x", 100<<10), "X-Key", "k")),
			status: 413, set: "big", errContains: "max_body_bytes",
		},
		// The client is still sending when keyway answers: without a
		// lingering close the kernel's RST would destroy the answer.
		"413 over the server-wide limit, 8MiB body": {
			setup:  simple(twoSets, post("/big", strings.Repeat("x", 8<<20), "X-Key", "k")),
			status: 413, set: "big", errContains: "max_body_bytes",
		},
		"431 headers over max_header_bytes": {
			setup: simple(func(c *Config) {
				c.Server.MaxHeaderBytes = 4 << 10
			}, post("/ingest", "x", "X-Key", "k", "X-Big", strings.Repeat("b", 8<<10))),
			status: 431, errContains: "max_header_bytes",
		},
		"502 upstream reset": {
			setup: func(t *testing.T) (string, func(*testing.T, string) reply) {
				_, addr := startProxy(t, nil, resetReplica(t, "r0", false))
				return addr, post("/ingest", "x", "X-Key", "k")
			},
			status: 502, set: "orders", replica: "r0",
		},
		"504 upstream timeout": {
			setup: func(t *testing.T) (string, func(*testing.T, string) reply) {
				slow, release := slowReplica(t, "r0")
				_, addr := startProxy(t, func(c *Config) {
					c.ReplicaSets[0].Timeouts.Request = 200 * time.Millisecond
					c.ReplicaSets[0].Timeouts.Connect = 100 * time.Millisecond
				}, slow)
				t.Cleanup(release)
				return addr, post("/ingest", "x", "X-Key", "k")
			},
			status: 504, set: "orders", replica: "r0",
		},
		"503 none in rotation (keyed)": {
			setup: func(t *testing.T) (string, func(*testing.T, string) reply) {
				p, addr := startProxy(t, nil, startReplica(t, "r0"), startReplica(t, "r1"))
				p.Router("orders").SetHealthy("r0", false)
				p.Router("orders").SetHealthy("r1", false)
				return addr, post("/ingest", "x", "X-Key", "k")
			},
			status: 503, set: "orders", retryAfter: true, errContains: "rotation",
		},
		"503 none in rotation (keyless)": {
			setup: func(t *testing.T) (string, func(*testing.T, string) reply) {
				p, addr := startProxy(t, nil, startReplica(t, "r0"))
				p.Router("orders").SetHealthy("r0", false)
				return addr, post("/ingest", "x")
			},
			status: 503, set: "orders", retryAfter: true, errContains: "rotation",
		},
		"503 no replica configured": {
			setup: func(t *testing.T) (string, func(*testing.T, string) reply) {
				_, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].Replicas = 1 })
				return addr, post("/ingest", "x", "X-Key", "k")
			},
			status: 503, set: "orders", retryAfter: true, errContains: "rotation",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr, send := tc.setup(t)
			r := send(t, addr)
			if r.status != tc.status {
				t.Fatalf("got %v, want %d", r, tc.status)
			}
			m := r.errorJSON(t)
			if m["replica_set"] != tc.set {
				t.Errorf("replica_set = %q, want %q", m["replica_set"], tc.set)
			}
			if tc.replica != "" && m["replica"] != tc.replica {
				t.Errorf("replica = %q, want %q", m["replica"], tc.replica)
			}
			if got := r.header["Retry-After"] != ""; got != tc.retryAfter {
				t.Errorf("Retry-After present = %v, want %v", got, tc.retryAfter)
			}
			if !strings.Contains(m["error"], tc.errContains) {
				t.Errorf("error %q does not mention %q", m["error"], tc.errContains)
			}
		})
	}
}

// TestRelay: keyway relays the replica's answer as it is — status, body
// bytes and end-to-end headers — for any method, HEAD included.
func TestRelay(t *testing.T) {
	rep := startReplica(t, "r0")
	rep.setHandler(func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set("X-Echo-Method", string(ctx.Method()))
		ctx.Response.Header.Set("Content-Type", "application/octet-stream")
		ctx.SetStatusCode(201)
		ctx.SetBody(ctx.Request.Body())
		if ctx.IsHead() {
			ctx.Response.Header.SetContentLength(5)
		}
	})
	_, addr := startProxy(t, nil, rep)
	cl := newClient(addr)
	body := string([]byte{0, 1, 2, 0xff, '\r', '\n', 'x'})
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		r := cl.do(t, m, "/ingest", body, "X-Key", "k")
		if r.status != 201 || r.body != body || r.header["X-Echo-Method"] != m || r.header["Content-Type"] != "application/octet-stream" {
			t.Errorf("%s: got %v", m, r)
		}
	}
	rc := dialRaw(t, addr)
	rc.send(t, "HEAD /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n\r\n")
	r := rc.readHead(t)
	if r.status != 201 || r.header["X-Echo-Method"] != "HEAD" || r.header["Content-Length"] != "5" {
		t.Fatalf("HEAD: got %v", r)
	}
	// The connection is still usable: HEAD did not leave a body to read.
	rc.send(t, "GET /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\n\r\n")
	if r := rc.read(t); r.status != 201 || r.header["X-Echo-Method"] != "GET" {
		t.Fatalf("GET after HEAD: got %v", r)
	}
}

// TestFullPoolShedsKeyedRetriesKeyless: a request that found the
// replica's pool full (max_conns_per_replica, which bounds its requests in
// flight by default) was never sent. A keyed one is shed (overload never
// moves keys); a keyless one, even a POST, goes to the next candidate.
func TestFullPoolShedsKeyedRetriesKeyless(t *testing.T) {
	busy, other := startReplica(t, "busy"), startReplica(t, "other")
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	busy.setHandler(func(ctx *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		<-release
		ctx.SetBodyString("busy")
	})
	p, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].MaxConnsPerReplica = 1 }, busy, other)
	key := keyOwnedBy(t, p, "busy")
	first := make(chan reply, 1)
	go func() {
		r, err := newClient(addr).try("POST", "/ingest", "x", "X-Key", key)
		if err != nil {
			r = reply{status: -1, body: err.Error()}
		}
		first <- r
	}()
	t.Cleanup(func() { close(release); <-first })
	within(t, arrived, 5*time.Second, "the first request at busy") // busy's only connection is taken

	r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key)
	if r.status != 503 || r.errorJSON(t)["reason"] != "overloaded" {
		t.Fatalf("keyed: got %v, want 503 overloaded", r)
	}
	for range 2 { // round robin: whichever comes first, other answers
		r = newClient(addr).do(t, "POST", "/ingest", "x")
		if r.status != 200 || r.body != "other" {
			t.Fatalf("keyless: got %v, want 200 from other", r)
		}
	}
	if n := busy.count.Load(); n != 1 {
		t.Fatalf("busy saw %d requests, want 1", n)
	}
}
