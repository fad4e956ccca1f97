package proxy

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap/zaptest"

	"keyway/balancer"
)

// testReplica is a real fasthttp server on 127.0.0.1:0 that records what it
// received. Its handler may be replaced per test.
type testReplica struct {
	name    string
	ln      net.Listener
	srv     *fasthttp.Server
	count   atomic.Int64
	mu      sync.Mutex
	keys    map[string]int
	handler atomic.Pointer[fasthttp.RequestHandler]
	last    atomic.Pointer[fasthttp.Request]
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
			r.count.Add(1)
			var cp fasthttp.Request
			ctx.Request.CopyTo(&cp)
			r.last.Store(&cp)
			r.mu.Lock()
			r.keys[string(ctx.Request.Header.Peek("X-Key"))]++
			r.mu.Unlock()
			if h := r.handler.Load(); h != nil {
				(*h)(ctx)
				return
			}
			ctx.SetStatusCode(200)
			ctx.SetBodyString(name)
		},
		DisableHeaderNamesNormalizing: true,
		NoDefaultServerHeader:         true,
	}
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(func() { _ = r.srv.Shutdown() })
	return r
}

func (r *testReplica) addr() string { return r.ln.Addr().String() }

func (r *testReplica) setHandler(h fasthttp.RequestHandler) { r.handler.Store(&h) }

// startProxy runs a proxy with one set "orders" over the replicas.
func startProxy(t testing.TB, modify func(*Config), reps ...*testReplica) (*Proxy, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	sc := DefaultSetConfig()
	sc.Name = "orders"
	sc.Replicas = len(reps)
	sc.Timeouts.Request = 2 * time.Second
	for _, r := range reps {
		sc.Static = append(sc.Static, StaticReplica{Name: r.name, Addr: r.addr(), Weight: 1})
	}
	cfg.ReplicaSets = []SetConfig{sc}
	if modify != nil {
		modify(&cfg)
	}
	p, err := New(cfg, Options{Logger: zaptest.NewLogger(t), Coalesce: -1})
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
		if err := <-done; err != nil {
			t.Errorf("proxy Run: %v", err)
		}
	})
	return p, p.Addr().String()
}

func TestSmoke(t *testing.T) {
	a, b, c := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")
	p, addr := startProxy(t, nil, a, b, c)
	client := &fasthttp.Client{}
	owners := map[string]string{}
	for i := 0; i < 200; i++ {
		key := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + addr + "/ingest")
		req.Header.SetMethod("POST")
		req.Header.Set("X-Key", key)
		req.SetBodyString("x")
		if err := client.DoTimeout(req, resp, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode(), resp.Body())
		}
		got := string(resp.Body())
		if prev, ok := owners[key]; ok && prev != got {
			t.Fatalf("key %s went to %s then %s", key, prev, got)
		}
		owners[key] = got
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	t.Logf("counts %d %d %d", a.count.Load(), b.count.Load(), c.count.Load())
	_ = p
	_ = balancer.KeyOK
}
