//go:build !race

package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

// countingObserver is an Observer that keeps nothing but a count.
type countingObserver struct{ n int }

func (o *countingObserver) Observe(_, _ string, _ int, _ error, _ time.Duration) { o.n++ }

// TestHandlerAllocs guards the steady-state hot path: a proxied request that
// a replica answers 2xx costs the handler no allocation. It drives
// p.handle with one reused RequestCtx against in-memory replicas; the
// count includes the replica's server and the HostClient.
func TestHandlerAllocs(t *testing.T) {
	cases := map[string]struct {
		modify func(*Config)
		uri    string
		hdrs   []string
	}{
		"keyed POST, header":           {uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"keyed POST, path segment":     {modify: keys(balancer.KeySource{PathSegment: 2}), uri: "/ingest/customer%2D42"},
		"keyed POST, query":            {modify: keys(balancer.KeySource{Query: "key"}), uri: "/ingest?key=customer-42"},
		"keyless, round robin":         {uri: "/ingest"},
		"keyless, least inflight":      {modify: fallback(balancer.FallbackLeastInflight), uri: "/ingest"},
		"keyless, random":              {modify: fallback(balancer.FallbackRandom), uri: "/ingest"},
		"client XFF, request id, hops": {uri: "/ingest", hdrs: []string{"X-Key", "k", "X-Forwarded-For", "203.0.113.9", "X-Request-Id", "abc", "Connection", "keep-alive, X-Hop", "X-Hop", "1", "Keep-Alive", "timeout=5"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rig := startMemRig(t, 3, tc.modify)
			obs := &countingObserver{}
			rig.p.opts.Observer = obs

			tmpl := newKeyedPost("http://orders.example"+tc.uri, "", []byte(`{"id":1,"amount":12.5}`))
			defer fasthttp.ReleaseRequest(tmpl)
			tmpl.Header.Del("X-Key")
			for i := 0; i+1 < len(tc.hdrs); i += 2 {
				tmpl.Header.Set(tc.hdrs[i], tc.hdrs[i+1])
			}
			var ctx fasthttp.RequestCtx
			ctx.Init(tmpl, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
			run := func() {
				tmpl.CopyTo(&ctx.Request)
				ctx.Response.Reset()
				ctx.Response.Header.SetNoDefaultContentType(true)
				rig.p.handle(&ctx)
				if ctx.Response.StatusCode() != 200 {
					t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
				}
			}
			for i := 0; i < 20; i++ { // fill pools and connections
				run()
			}
			if allocs := testing.AllocsPerRun(500, run); allocs != 0 {
				t.Fatalf("%v allocations per proxied request, want 0", allocs)
			}
			if obs.n == 0 {
				t.Fatal("the observer was never called")
			}
		})
	}
}

// TestFullPathAllocs is the same guard over the whole in-memory path:
// client → proxy front end → replica and back.
func TestFullPathAllocs(t *testing.T) {
	rig := startMemRig(t, 3, nil)
	req := newKeyedPost("http://orders.example/ingest", "customer-42", []byte(`{"id":1}`))
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	run := func() {
		if err := rig.client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
		}
	}
	for i := 0; i < 20; i++ {
		run()
	}
	if allocs := testing.AllocsPerRun(500, run); allocs != 0 {
		t.Fatalf("%v allocations per request on the whole path, want 0", allocs)
	}
}

func keys(src ...balancer.KeySource) func(*Config) {
	return func(c *Config) { c.ReplicaSets[0].Key = src }
}

func fallback(f balancer.Fallback) func(*Config) {
	return func(c *Config) { c.ReplicaSets[0].Fallback = f }
}
