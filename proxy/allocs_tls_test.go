//go:build !race

package proxy

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/valyala/fasthttp"

	"keyway/internal/testcerts"
	"keyway/tlsconfig"
)

// tcpRig is a proxy with one fasthttp replica (itself allocation-free)
// over real TCP, plain or behind TLS, driven through p.handle. run sends
// one keyed POST; conns lists the proxy's connections to the replica.
type tcpRig struct {
	run   func()
	conns func() []net.Conn
}

func startTCPRig(t testing.TB, useTLS bool) tcpRig {
	t.Helper()
	dir := t.TempDir()
	ca := testcerts.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("r0") },
		NoDefaultServerHeader: true, NoDefaultContentType: true, NoDefaultDate: true,
	}
	var serveLn net.Listener = ln
	if useTLS {
		serveLn = tls.NewListener(ln, issueServer(t, ca, dir, "r0", "127.0.0.1"))
	}
	go func() { _ = srv.Serve(serveLn) }()
	t.Cleanup(func() { ln.Close(); _ = srv.Shutdown() })
	dl := &dialLog{}
	p, _ := startProxyOpts(t, Options{dial: dl.dial}, func(c *Config) {
		if useTLS {
			c.ReplicaSets[0].TLS = tlsconfig.ClientConfig{Enabled: true, CAFile: ca.File(t, dir)}
		}
	}, &testReplica{name: "r0", ln: ln})
	tmpl := newKeyedPost("http://orders.example/ingest", "customer-42", []byte(`{"id":1}`))
	t.Cleanup(func() { fasthttp.ReleaseRequest(tmpl) })
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(tmpl, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	return tcpRig{
		run: func() {
			tmpl.CopyTo(&ctx.Request)
			ctx.Response.Reset()
			ctx.Response.Header.SetNoDefaultContentType(true)
			p.handle(ctx)
			if ctx.Response.StatusCode() != 200 {
				t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
			}
		},
		conns: dl.all,
	}
}

// TestStaleCheckedPathAllocs guards the request path over real TCP
// connections, where the stale check peeks at every reused connection
// (the in-memory rigs of TestHandlerAllocs have no socket to peek at):
// plain HTTP allocates nothing per request in steady state, TLS nothing of
// keyway's.
func TestStaleCheckedPathAllocs(t *testing.T) {
	for name, useTLS := range map[string]bool{"plain HTTP": false, "TLS": true} {
		t.Run(name, func(t *testing.T) {
			rig := startTCPRig(t, useTLS)
			for i := 0; i < 20; i++ {
				rig.run()
			}
			// crypto/tls allocates per record it reads (readFromUntil's
			// atLeastReader escapes): one in the proxy, reading the answer,
			// and one in the replica, reading the request. Nothing else.
			want := 0.0
			if useTLS {
				want = 2
			}
			if allocs := testing.AllocsPerRun(500, rig.run); allocs > want {
				t.Fatalf("%v allocations per proxied request, want at most %v", allocs, want)
			}
			if n := len(rig.conns()); n != 1 {
				t.Fatalf("%d connections to the replica, want 1 (reused: every request went through the stale check)", n)
			}
		})
	}
}

// BenchmarkUpstream measures one keyed POST through p.handle to a replica
// over loopback TCP, plain and TLS (one pooled connection, reused).
func BenchmarkUpstream(b *testing.B) {
	for name, useTLS := range map[string]bool{"plain": false, "tls": true} {
		b.Run(name, func(b *testing.B) {
			rig := startTCPRig(b, useTLS)
			rig.run()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				rig.run()
			}
		})
	}
}
