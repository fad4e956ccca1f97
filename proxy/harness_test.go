package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap/zaptest"

	"keyway/balancer"
	"keyway/internal/poll"
)

// testReplica is a real fasthttp server on 127.0.0.1:0 (or, with
// startRawReplica, a raw TCP server) that records what it received. Its
// handler may be replaced per test; by default it answers 200 with its name.
type testReplica struct {
	name    string
	ln      net.Listener
	srv     *fasthttp.Server
	count   atomic.Int64
	mu      sync.Mutex
	keys    map[string]int
	uris    []string
	handler atomic.Pointer[fasthttp.RequestHandler]
	last    atomic.Pointer[fasthttp.Request]
	// connState, when set, hears the server's connection states (the
	// server's ConnState field must not change once it serves).
	connState atomic.Pointer[func(net.Conn, fasthttp.ConnState)]
}

func startReplica(t testing.TB, name string) *testReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &testReplica{name: name, ln: ln, keys: map[string]int{}}
	r.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			r.record(&ctx.Request)
			if h := r.handler.Load(); h != nil {
				(*h)(ctx)
				return
			}
			ctx.SetStatusCode(200)
			ctx.SetBodyString(name)
		},
		ConnState: func(c net.Conn, s fasthttp.ConnState) {
			if f := r.connState.Load(); f != nil {
				(*f)(c, s)
			}
		},
		DisableHeaderNamesNormalizing: true,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		NoDefaultDate:                 true,
	}
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(func() {
		// Shutdown alone misses a listener Serve has not registered yet.
		ln.Close()
		_ = r.srv.Shutdown()
	})
	return r
}

// startRawReplica accepts TCP connections on 127.0.0.1:0 and reads HTTP/1.1
// requests off them; respond decides, per request, what to write back on
// the raw connection (nothing and false closes it).
func startRawReplica(t testing.TB, name string, respond func(req *fasthttp.Request, c net.Conn) (keepAlive bool)) *testReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &testReplica{name: name, ln: ln, keys: map[string]int{}}
	var wg sync.WaitGroup
	var connsMu sync.Mutex
	conns := map[net.Conn]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns[c] = true
			connsMu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					var req fasthttp.Request
					req.Header.DisableNormalizing()
					if err := req.Read(br); err != nil {
						return
					}
					r.record(&req)
					if !respond(&req, c) {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		connsMu.Lock()
		for c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		wg.Wait()
	})
	return r
}

func (r *testReplica) record(req *fasthttp.Request) {
	r.count.Add(1)
	var cp fasthttp.Request
	req.CopyTo(&cp)
	r.last.Store(&cp)
	r.mu.Lock()
	r.keys[string(req.Header.Peek("X-Key"))]++
	r.uris = append(r.uris, string(req.Header.RequestURI()))
	r.mu.Unlock()
}

func (r *testReplica) addr() string { return r.ln.Addr().String() }

func (r *testReplica) setHandler(h fasthttp.RequestHandler) { r.handler.Store(&h) }

// stop closes the replica's listener and connections: dialing it is
// refused from then on.
func (r *testReplica) stop(t testing.TB) {
	t.Helper()
	r.ln.Close() // before Shutdown: Serve may not have registered it yet
	if r.srv != nil {
		_ = r.srv.Shutdown() // it may report the listener closed just above
	}
}

func (r *testReplica) seen(uri string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range r.uris {
		if u == uri {
			return true
		}
	}
	return false
}

// startProxy runs a proxy with one set "orders" over the replicas.
func startProxy(t testing.TB, modify func(*Config), reps ...*testReplica) (*Proxy, string) {
	t.Helper()
	return startProxyOpts(t, Options{}, modify, reps...)
}

// testConfig is the configuration startProxy uses: one set "orders" (path
// prefix "/", key header X-Key, request timeout 2s) over the replicas.
func testConfig(reps ...*testReplica) Config {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	// A test's stop closes idle connections at once; the drain's grace
	// has its own tests (drain_test.go).
	cfg.Server.DrainIdle = 0
	sc := DefaultSetConfig()
	sc.Name = "orders"
	sc.Replicas = len(reps)
	sc.Timeouts.Request = 2 * time.Second
	for _, r := range reps {
		sc.Static = append(sc.Static, StaticReplica{Name: r.name, Addr: r.addr(), Weight: 1})
	}
	cfg.ReplicaSets = []SetConfig{sc}
	return cfg
}

// startProxyOpts is startProxy with options (Registerer, Observer).
// Logger defaults to zaptest and Coalesce to synchronous rebuilds.
func startProxyOpts(t testing.TB, opts Options, modify func(*Config), reps ...*testReplica) (*Proxy, string) {
	t.Helper()
	cfg := testConfig(reps...)
	if modify != nil {
		modify(&cfg)
	}
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	if opts.Coalesce == 0 {
		opts.Coalesce = -1
	}
	p, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("proxy Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("proxy Run did not return 10s after cancel")
		}
	})
	return p, p.Addr().String()
}

// runProxy builds a proxy from cfg, lets prepare adjust it before it
// listens (nil: nothing), and runs it until the test calls stop; Run's
// result arrives on runErr. For tests of the shutdown itself: startProxy
// stops its proxy only at cleanup.
func runProxy(t testing.TB, cfg Config, prepare func(*Proxy)) (p *Proxy, stop context.CancelFunc, runErr <-chan error) {
	t.Helper()
	return runProxyOpts(t, cfg, Options{}, prepare)
}

// runProxyOpts is runProxy with options (its logger and coalescing are
// the test's).
func runProxyOpts(t testing.TB, cfg Config, opts Options, prepare func(*Proxy)) (p *Proxy, stop context.CancelFunc, runErr <-chan error) {
	t.Helper()
	opts.Logger, opts.Coalesce = zaptest.NewLogger(t), -1
	p, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(p)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	poll.Until(t, 5*time.Second, "the proxy to be ready", p.Ready)
	return p, cancel, errc
}

// newRegistry returns a pedantic registry for Options.Registerer.
func newRegistry() *prometheus.Registry { return prometheus.NewPedanticRegistry() }

// reply is a response as the test client saw it.
type reply struct {
	status int
	body   string
	header map[string]string // canonical names as received
	close  bool
}

func (r reply) String() string { return fmt.Sprintf("%d %q %v", r.status, r.body, r.header) }

// errorJSON decodes keyway's JSON error body, failing the test if the body
// or its Content-Type is not keyway's error shape.
func (r reply) errorJSON(t testing.TB) map[string]string {
	t.Helper()
	if ct := r.header["Content-Type"]; ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json (reply %v)", ct, r)
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		t.Fatalf("error body %q is not a JSON object of strings: %v", r.body, err)
	}
	for _, k := range []string{"error", "replica_set", "replica"} {
		if _, ok := m[k]; !ok {
			t.Errorf("error body %q lacks field %q", r.body, k)
		}
	}
	if _, shed := m["reason"]; len(m) != 3 && !(shed && len(m) == 4) {
		t.Errorf("error body %q has fields beyond error, replica_set, replica (and reason when shed)", r.body)
	}
	if m["error"] == "" {
		t.Errorf("error body %q has an empty error message", r.body)
	}
	return m
}

// client sends requests to one proxy address; it does not normalise header
// names and sends no User-Agent.
type client struct {
	hc *fasthttp.HostClient
}

func newClient(addr string) *client {
	return &client{hc: &fasthttp.HostClient{
		Addr:                          addr,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		MaxIdemponentCallAttempts:     1,
		ReadBufferSize:                64 << 10,
		MaxConns:                      64,
	}}
}

// do sends a request; hdrs are name, value pairs. It fails the test on a
// transport error.
func (c *client) do(t testing.TB, method, uri string, body string, hdrs ...string) reply {
	t.Helper()
	r, err := c.try(method, uri, body, hdrs...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, uri, err)
	}
	return r
}

func (c *client) try(method, uri string, body string, hdrs ...string) (reply, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.DisableNormalizing()
	resp.Header.SetNoDefaultContentType(true) // see what keyway sent, not a default
	req.SetRequestURI(uri)
	req.Header.SetHost("orders.example")
	req.Header.SetMethod(method)
	for i := 0; i+1 < len(hdrs); i += 2 {
		if strings.EqualFold(hdrs[i], "Host") {
			req.Header.SetHost(hdrs[i+1])
			continue
		}
		req.Header.Add(hdrs[i], hdrs[i+1])
	}
	if body != "" {
		req.SetBodyString(body)
	}
	if err := c.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		return reply{}, err
	}
	return toReply(resp), nil
}

func toReply(resp *fasthttp.Response) reply {
	r := reply{status: resp.StatusCode(), body: string(resp.Body()), header: map[string]string{}, close: resp.ConnectionClose()}
	for k, v := range resp.Header.All() {
		r.header[string(k)] = string(v)
	}
	return r
}

// rawConn is a client TCP connection for exact bytes.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(t testing.TB, raw string) {
	t.Helper()
	if err := rc.c.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(rc.c, raw); err != nil {
		t.Fatal(err)
	}
}

// read reads one response; it fails the test on error.
func (rc *rawConn) read(t testing.TB) reply {
	t.Helper()
	r, err := rc.tryRead()
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return r
}

func (rc *rawConn) tryRead() (reply, error) { return rc.tryReadResponse(false) }

// readHead reads the response to a HEAD request: headers only.
func (rc *rawConn) readHead(t testing.TB) reply {
	t.Helper()
	r, err := rc.tryReadResponse(true)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return r
}

func (rc *rawConn) tryReadResponse(head bool) (reply, error) {
	if err := rc.c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return reply{}, err
	}
	var resp fasthttp.Response
	resp.SkipBody = head
	resp.Header.DisableNormalizing()
	resp.Header.SetNoDefaultContentType(true)
	if err := resp.Read(rc.br); err != nil {
		return reply{}, err
	}
	return toReply(&resp), nil
}

// closedByPeer reports whether the server closed the connection: a read
// returns EOF (or a reset) within the deadline.
func (rc *rawConn) closedByPeer(d time.Duration) bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	_, err := rc.br.ReadByte()
	if err == nil {
		return false
	}
	var ne net.Error
	if errorsAs(err, &ne) && ne.Timeout() {
		return false
	}
	return true
}

// ownerOf returns the name of the replica a key is routed to now, or "".
func ownerOf(p *Proxy, set, key string) string {
	t := p.Router(set).Table()
	c := t.Candidates(balancer.HashString(key))
	if len(c) == 0 {
		return ""
	}
	return t.Backend(int(c[0])).Name()
}

// keyOwnedBy returns a key whose current owner is the named replica.
func keyOwnedBy(t testing.TB, p *Proxy, replica string) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		k := fmt.Sprintf("key-%s-%d", replica, i)
		if ownerOf(p, "orders", k) == replica {
			return k
		}
	}
	t.Fatalf("no key owned by %s in 10000 tries", replica)
	return ""
}

func TestSmoke(t *testing.T) {
	a, b, c := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")
	p, addr := startProxy(t, nil, a, b, c)
	cl := newClient(addr)
	for i := 0; i < 200; i++ {
		key := fmt.Sprintf("k%d", i)
		r := cl.do(t, "POST", "/ingest", "x", "X-Key", key)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if want := ownerOf(p, "orders", key); r.body != want {
			t.Fatalf("key %s answered by %s, table owner is %s", key, r.body, want)
		}
	}
	if a.count.Load() == 0 || b.count.Load() == 0 || c.count.Load() == 0 {
		t.Fatalf("a replica got nothing: %d %d %d", a.count.Load(), b.count.Load(), c.count.Load())
	}
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// within waits for ch to deliver, at most d.
func within[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
	var zero T
	return zero
}
