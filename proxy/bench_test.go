package proxy

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"keyway/balancer"
	"keyway/logging"
)

// memRig is a proxy with one replica set "orders" whose replicas, and the
// proxy's own front end, listen on in-memory listeners: the whole request
// path without the kernel's loopback, for benchmarks and allocation guards.
type memRig struct {
	p        *Proxy
	front    *fasthttputil.InmemoryListener
	replicas map[string]*fasthttputil.InmemoryListener
	client   *fasthttp.HostClient
}

// startMemRig starts n in-memory replicas answering 200 "ok" and a proxy in
// front of them. modify may change the configuration before New.
func startMemRig(tb testing.TB, n int, modify func(*Config)) *memRig {
	tb.Helper()
	return startMemRigOpts(tb, n, modify, Options{})
}

// startMemRigOpts is startMemRig with options; Coalesce and the dial hook
// are set here.
func startMemRigOpts(tb testing.TB, n int, modify func(*Config), opts Options) *memRig {
	tb.Helper()
	rig := &memRig{replicas: map[string]*fasthttputil.InmemoryListener{}}
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0" // never opened: the in-memory listener is used
	sc := DefaultSetConfig()
	sc.Name = "orders"
	sc.Replicas = n
	sc.Timeouts.Request = 5 * time.Second
	ok := []byte("ok")
	for i := 0; i < n; i++ {
		name := "m" + string(rune('0'+i))
		addr := "10.0.0." + string(rune('1'+i)) + ":9000"
		ln := fasthttputil.NewInmemoryListener()
		rig.replicas[addr] = ln
		srv := &fasthttp.Server{
			Handler:               func(ctx *fasthttp.RequestCtx) { ctx.SetBody(ok) },
			NoDefaultServerHeader: true,
			NoDefaultDate:         true,
			NoDefaultContentType:  true,
		}
		go func() { _ = srv.Serve(ln) }()
		tb.Cleanup(func() { _ = srv.Shutdown() })
		sc.Static = append(sc.Static, StaticReplica{Name: name, Addr: addr, Weight: 1})
	}
	cfg.ReplicaSets = []SetConfig{sc}
	if modify != nil {
		modify(&cfg)
	}
	opts.Coalesce = -1
	opts.dial = func(addr string, _ time.Duration) (net.Conn, error) {
		ln := rig.replicas[addr]
		if ln == nil {
			return nil, &net.OpError{Op: "dial", Net: "memory", Err: errRefused}
		}
		return ln.Dial()
	}
	p, err := New(cfg, opts)
	if err != nil {
		tb.Fatal(err)
	}
	rig.p = p
	rig.front = fasthttputil.NewInmemoryListener()
	p.mu.Lock()
	p.ln = rig.front
	p.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("proxy Run: %v", err)
		}
	})
	rig.client = &fasthttp.HostClient{
		Addr:                          "keyway",
		Dial:                          func(string) (net.Conn, error) { return rig.front.Dial() },
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		MaxIdemponentCallAttempts:     1,
	}
	return rig
}

type refusedError struct{}

func (refusedError) Error() string { return "connection refused" }

var errRefused error = refusedError{}

func newKeyedPost(uri, key string, body []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(uri)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set("X-Key", key)
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	return req
}

// BenchmarkProxyRequest measures one keyed POST through the whole path:
// client → proxy front end → key → table → HostClient → replica → back,
// everything in memory. allocs/op counts the client and the replica too.
func BenchmarkProxyRequest(b *testing.B) {
	rig := startMemRig(b, 3, nil)
	req := newKeyedPost("http://orders.example/ingest", "customer-42", []byte(`{"id":1,"amount":12.5,"note":"benchmark payload"}`))
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	// Warm up pools and connections before measuring.
	for i := 0; i < 10; i++ {
		if err := rig.client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatalf("warm-up: %v %d %s", err, resp.StatusCode(), resp.Body())
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := rig.client.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode() != 200 {
			b.Fatalf("status %d: %s", resp.StatusCode(), resp.Body())
		}
	}
}

// BenchmarkProxyRequestAccessLog is BenchmarkProxyRequest with the access
// log on: logging's real buffered writer, to a file, without the key
// (omit), with its HMAC, and to stdout (here io.Discard, the cost of the
// line alone). The price of one line per request.
func BenchmarkProxyRequestAccessLog(b *testing.B) {
	cases := map[string]func(*logging.Config){
		"file": func(c *logging.Config) { c.Access.Path = filepath.Join(b.TempDir(), "access.log") },
		"file_hmac": func(c *logging.Config) {
			c.Access.Path = filepath.Join(b.TempDir(), "access.log")
			c.Access.Key = logging.KeyHMAC
		},
		"discard": func(c *logging.Config) {},
	}
	for _, name := range []string{"file", "file_hmac", "discard"} {
		b.Run(name, func(b *testing.B) {
			b.Setenv(logging.KeySecretEnv, "0123456789abcdef0123456789abcdef")
			cfg := logging.DefaultConfig()
			cfg.AccessLog = true
			cases[name](&cfg)
			logs, err := logging.New(cfg, io.Discard, io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			defer logs.Close()
			rig := startMemRigOpts(b, 3, nil, Options{AccessLog: logs.Access, AccessKey: logs.Access.KeyAppender()})
			req := newKeyedPost("http://orders.example/ingest", "customer-42", []byte(`{"id":1,"amount":12.5,"note":"benchmark payload"}`))
			defer fasthttp.ReleaseRequest(req)
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			for i := 0; i < 10; i++ {
				if err := rig.client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("warm-up: %v %d %s", err, resp.StatusCode(), resp.Body())
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := rig.client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d", err, resp.StatusCode())
				}
			}
			b.StopTimer()
			if full, failed := logs.Access.Dropped(); full+failed != 0 {
				b.Logf("%d lines dropped (buffer full), %d lost to write errors", full, failed)
			}
		})
	}
}

// BenchmarkAccessLine measures building one access-log line (no output):
// the keyed request of BenchmarkProxyRequest, with the key left out and
// with a stand-in for its HMAC.
func BenchmarkAccessLine(b *testing.B) {
	for _, withKey := range []bool{false, true} {
		b.Run(map[bool]string{false: "key_omitted", true: "key_appended"}[withKey], func(b *testing.B) {
			cfg := testConfig()
			cfg.ReplicaSets[0].Replicas = 1
			opts := Options{Coalesce: -1, AccessLog: io.Discard}
			if withKey {
				opts.AccessKey = func(dst, key []byte) []byte { return append(dst, "0123456789abcdef"...) }
			}
			p, err := New(cfg, opts)
			if err != nil {
				b.Fatal(err)
			}
			rs := p.routes.Load().byName["orders"]
			var ctx fasthttp.RequestCtx
			req := newKeyedPost("http://orders.example/ingest", "customer-42", []byte(`{"id":1}`))
			defer fasthttp.ReleaseRequest(req)
			req.Header.Set("X-Request-Id", "0123456789abcdef0123456789abcdef")
			ctx.Init(req, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}, nil)
			ctx.Response.SetBodyString("ok")
			l := &accessLine{}
			start := time.Now()
			b.ReportAllocs()
			r := request{ctx: &ctx, rs: rs, start: start, named: "orders-1", tried: 1, upstream: time.Millisecond}
			for b.Loop() {
				l.buf = p.appendAccess(l, &r, "", 200)
			}
			b.ReportMetric(float64(len(l.buf)), "bytes/line")
		})
	}
}

// BenchmarkProxyRequestParallel is BenchmarkProxyRequest from GOMAXPROCS
// concurrent clients, each with its own key.
func BenchmarkProxyRequestParallel(b *testing.B) {
	rig := startMemRig(b, 3, nil)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := newKeyedPost("http://orders.example/ingest", "customer-"+time.Now().String(), []byte(`{"id":1}`))
		defer fasthttp.ReleaseRequest(req)
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		for pb.Next() {
			if err := rig.client.Do(req, resp); err != nil {
				b.Error(err)
				return
			}
			if resp.StatusCode() != 200 {
				b.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
				return
			}
		}
	})
}

// BenchmarkKeyExtraction measures the handler's key lookup (replicaSet.key)
// for each source kind, on a request with a realistic set of headers.
func BenchmarkKeyExtraction(b *testing.B) {
	cases := []struct {
		name    string
		sources []balancer.KeySource
		uri     string
		header  string
	}{
		{"header", []balancer.KeySource{{Header: "X-Key"}}, "/ingest", "customer-42"},
		{"header_lowercase_config", []balancer.KeySource{{Header: "x-key"}}, "/ingest", "customer-42"},
		{"path_segment", []balancer.KeySource{{PathSegment: 2}}, "/ingest/customer-42/events", ""},
		{"path_segment_escaped", []balancer.KeySource{{PathSegment: 2}}, "/ingest/customer%2D42/events", ""},
		{"query", []balancer.KeySource{{Query: "key"}}, "/ingest?source=web&key=customer-42&v=2", ""},
		{"query_escaped", []balancer.KeySource{{Query: "key"}}, "/ingest?source=web&key=customer%2D42+x&v=2", ""},
		{"third_of_three", []balancer.KeySource{{Header: "X-Key"}, {PathSegment: 3}, {Query: "key"}}, "/ingest/x?key=customer-42", ""},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			cfg := testConfig()
			cfg.ReplicaSets[0].Replicas = 1
			cfg.ReplicaSets[0].Key = c.sources
			p, err := New(cfg, Options{Coalesce: -1})
			if err != nil {
				b.Fatal(err)
			}
			rs := p.routes.Load().byName["orders"]
			var req fasthttp.Request
			req.SetRequestURI(c.uri)
			req.Header.SetHost("orders.example")
			req.Header.SetMethod("POST")
			for _, h := range []string{"Accept", "Accept-Encoding", "Authorization", "X-Request-Id", "X-Tenant", "Traceparent"} {
				req.Header.Set(h, "some-value-of-typical-length")
			}
			if c.header != "" {
				req.Header.Set("X-Key", c.header)
			}
			uri := req.URI()
			path := uri.PathOriginal()
			if _, st, _ := rs.key(&req.Header, path, uri); st != balancer.KeyOK {
				b.Fatalf("status %v", st)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, st, _ := rs.key(&req.Header, path, uri); st != balancer.KeyOK {
					b.Fatal(st)
				}
			}
		})
	}
}
