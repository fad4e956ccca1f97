//go:build !race

package proxy

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"keyway/balancer"
	"keyway/logging"
)

// countingObserver is an Observer that keeps nothing but a count.
type countingObserver struct{ n int }

func (o *countingObserver) Observe(_, _ string, _ int, _ error, _ time.Duration) { o.n++ }

// TestHandlerAllocs guards the steady-state hot path: a proxied request that
// a replica answers 2xx costs the handler no allocation. It drives
// p.handle with one reused RequestCtx against in-memory replicas; the
// count includes the replica's server and the HostClient. The access log
// is off here (TestHandlerAllocsAccessLog has it on).
func TestHandlerAllocs(t *testing.T) {
	cases := map[string]struct {
		modify   func(*Config)
		failOpen bool
		setup    func(*Proxy) // after the start, before the first request
		uri      string
		hdrs     []string
	}{
		"keyed POST, header":              {uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"keyed POST, path segment":        {modify: keys(balancer.KeySource{PathSegment: 2}), uri: "/ingest/customer%2D42"},
		"keyed POST, query":               {modify: keys(balancer.KeySource{Query: "key"}), uri: "/ingest?key=customer-42"},
		"keyless, round robin":            {uri: "/ingest"},
		"keyless, least inflight":         {modify: fallback(balancer.FallbackLeastInflight), uri: "/ingest"},
		"keyless, random":                 {modify: fallback(balancer.FallbackRandom), uri: "/ingest"},
		"client XFF, request id, hops":    {uri: "/ingest", hdrs: []string{"X-Key", "k", "X-Forwarded-For", "203.0.113.9", "X-Request-Id", "abc", "Connection", "keep-alive, X-Hop", "X-Hop", "1", "Keep-Alive", "timeout=5"}},
		"keyed, owner out, failover next": {setup: excludeOwnerOf("customer-42"), uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"keyed, all out, fail open":       {failOpen: true, setup: excludeAll, uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"keyless, all out, fail open":     {failOpen: true, setup: excludeAll, uri: "/ingest"},
		"route context, keyed":            {modify: routeContext, uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"route context, keyed, stand-in":  {modify: routeContext, setup: excludeOwnerOf("customer-42"), uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"route context, keyless":          {modify: routeContext, uri: "/ingest"},
		"route context, client sent one":  {modify: routeContext, uri: "/ingest", hdrs: []string{"X-Key", "customer-42", "X-Keyway-Route", "forged"}},
		"route context, path segment key": {modify: both(routeContext, keys(balancer.KeySource{PathSegment: 2})), uri: "/ingest/customer%2D42%20%3B7"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rig := startMemRigOpts(t, 3, tc.modify, Options{FailOpen: tc.failOpen})
			if tc.setup != nil {
				tc.setup(rig.p)
			}
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
			if rc := ctx.Request.Header.PeekAll("X-Keyway-Route"); strings.HasPrefix(name, "route context") != (len(rc) == 1 && strings.Contains(string(rc[0]), "ring=")) {
				t.Fatalf("route context headers forwarded: %q", rc)
			}
			if obs.n == 0 {
				t.Fatal("the observer was never called")
			}
		})
	}
}

// TestHandlerAllocsAccessLog is TestHandlerAllocs with the access log on
// (logging's real writer, to a file): the line is built in a pooled buffer
// and appended to the log's buffer, so it costs no allocation either, with
// the key left out, hashed (HMAC) or plain, from a header or the path.
func TestHandlerAllocsAccessLog(t *testing.T) {
	t.Setenv(logging.KeySecretEnv, "0123456789abcdef0123456789abcdef")
	cases := map[string]struct {
		key    string
		modify func(*Config)
		uri    string
		hdrs   []string
	}{
		"key omitted":                {key: logging.KeyOmit, uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"key hmac, header":           {key: logging.KeyHMAC, uri: "/ingest", hdrs: []string{"X-Key", "customer-42"}},
		"key hmac, path segment":     {key: logging.KeyHMAC, modify: keys(balancer.KeySource{PathSegment: 2}), uri: "/ingest/customer%2D42/x"},
		"key plain, query":           {key: logging.KeyPlain, modify: keys(balancer.KeySource{Query: "key"}), uri: "/ingest?key=customer+42"},
		"client request id, escaped": {key: logging.KeyOmit, uri: "/ingest", hdrs: []string{"X-Key", "k", "X-Request-Id", `a"b\\é`}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := logging.DefaultConfig()
			cfg.AccessLog = true
			cfg.Access.Key = tc.key
			cfg.Access.Path = filepath.Join(t.TempDir(), "access.log")
			logs, err := logging.New(cfg, io.Discard, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			rig := startMemRigOpts(t, 3, tc.modify, Options{AccessLog: logs.Access, AccessKey: logs.Access.KeyAppender()})
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
			for i := 0; i < 20; i++ {
				run()
			}
			allocs := testing.AllocsPerRun(500, run)
			logs.Close()
			if allocs != 0 {
				t.Fatalf("%v allocations per proxied request with the access log on, want 0", allocs)
			}
			b, err := os.ReadFile(cfg.Access.Path)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(b, []byte("\n")); n != 521 {
				t.Fatalf("%d lines in the access log, want 521", n)
			}
			if full, failed := logs.Access.Dropped(); full+failed != 0 {
				t.Fatalf("dropped %d, %d lines", full, failed)
			}
		})
	}
}

// TestFullPathAllocs is the same guard over the whole in-memory path:
// client → proxy front end → replica and back. A request without a body
// allocates nothing. One with a body allocates what fasthttp's server
// allocates for any streamed request body and no more: fasthttp v1.78.0
// drains what a handler left of a body stream with io.CopyN, whose
// io.LimitReader escapes (24 bytes per request, server.go's discard),
// however much was left. The reference is a bare fasthttp server with
// StreamRequestBody that reads the body whole, measured here: if fasthttp
// stops allocating there, this guard tightens to zero by itself.
func TestFullPathAllocs(t *testing.T) {
	rig := startMemRig(t, 3, nil)
	post := newKeyedPost("http://orders.example/ingest", "customer-42", []byte(`{"id":1}`))
	defer fasthttp.ReleaseRequest(post)
	get := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(get)
	get.SetRequestURI("http://orders.example/ingest")
	get.Header.Set("X-Key", "customer-42")
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	allocs := func(c *fasthttp.HostClient, req *fasthttp.Request) float64 {
		run := func() {
			if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				t.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
			}
		}
		for range 20 {
			run()
		}
		return testing.AllocsPerRun(500, run)
	}
	if n := allocs(rig.client, get); n != 0 {
		t.Fatalf("%v allocations per request without a body on the whole path, want 0", n)
	}
	// The reference: fasthttp alone, streaming the same body.
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			_, _ = io.Copy(io.Discard, ctx.RequestBodyStream())
			ctx.SetBodyString("ok")
		},
		StreamRequestBody: true, NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true,
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	bare := &fasthttp.HostClient{Addr: "bare", Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	ref := allocs(bare, post)
	if n := allocs(rig.client, post); n > ref {
		t.Fatalf("%v allocations per request with a body on the whole path, want at most fasthttp's own %v for a streamed body", n, ref)
	}
	t.Logf("with a body: fasthttp's server alone allocates %v per request", ref)
}

func keys(src ...balancer.KeySource) func(*Config) {
	return func(c *Config) { c.ReplicaSets[0].Key = src }
}

func routeContext(c *Config) { c.ReplicaSets[0].RouteContext.Header = "X-Keyway-Route" }

func both(a, b func(*Config)) func(*Config) {
	return func(c *Config) { a(c); b(c) }
}

func fallback(f balancer.Fallback) func(*Config) {
	return func(c *Config) { c.ReplicaSets[0].Fallback = f }
}

// excludeOwnerOf holds a key's ring owner out of rotation.
func excludeOwnerOf(key string) func(*Proxy) {
	return func(p *Proxy) {
		t := p.Router("orders").Table()
		p.SetExcluded("orders", t.Replica(t.Owner(balancer.HashString(key))).Name, balancer.ReasonProbe, true)
	}
}

// excludeAll holds every replica out of rotation by health checks.
func excludeAll(p *Proxy) {
	for _, m := range p.Router("orders").Table().Members() {
		p.SetExcluded("orders", m.Name, balancer.ReasonProbe, true)
	}
}

// TestDecideAllocs: the routing decision allocates nothing in any of its
// outcomes, keyway's own answers included.
func TestDecideAllocs(t *testing.T) {
	cases := map[string]struct {
		modify   func(*Config)
		failOpen bool
		setup    func(*Proxy)
		ks       balancer.KeyStatus
		answers  bool
	}{
		"keyed":                     {ks: balancer.KeyOK},
		"keyed, failover next":      {setup: excludeOwnerOf("customer-42"), ks: balancer.KeyOK},
		"keyed, strict, owner out":  {modify: strict, setup: excludeOwnerOf("customer-42"), ks: balancer.KeyOK, answers: true},
		"keyed, all out":            {setup: excludeAll, ks: balancer.KeyOK, answers: true},
		"keyed, all out, fail open": {failOpen: true, setup: excludeAll, ks: balancer.KeyOK},
		"keyed, invalid":            {ks: balancer.KeyInvalid, answers: true},
		"keyless":                   {ks: balancer.KeyMissing},
		"keyless, reject":           {modify: fallback(balancer.FallbackReject), ks: balancer.KeyMissing, answers: true},
		"keyless, all out":          {setup: excludeAll, ks: balancer.KeyMissing, answers: true},
		"keyless, all out, open":    {failOpen: true, setup: excludeAll, ks: balancer.KeyMissing},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rig := startMemRigOpts(t, 3, tc.modify, Options{FailOpen: tc.failOpen})
			if tc.setup != nil {
				tc.setup(rig.p)
			}
			rs := rig.p.routes.Load().byName["orders"]
			tbl := rs.router.Table()
			h := balancer.HashString("customer-42")
			var buf [8]uint16
			run := func() {
				cands, d := rig.p.decide(rs, tbl, tc.ks, h, buf[:0])
				if (len(cands) == 0) != tc.answers || (tc.answers && d.msg == "") {
					t.Fatalf("decision %v %+v, want answered %v", cands, d, tc.answers)
				}
			}
			if allocs := testing.AllocsPerRun(1000, run); allocs != 0 {
				t.Fatalf("decide allocated %v times per run, want 0", allocs)
			}
		})
	}
}

func strict(c *Config) { c.ReplicaSets[0].Failover = balancer.FailoverStrict }

// TestShedAllocs: a shed answer allocates nothing either (overload comes
// in floods, and a shed must cost less than the request it spares): a
// full replica, a full replica whose queue wait runs out, a saturated
// replica, and a full set.
func TestShedAllocs(t *testing.T) {
	owner := func(p *Proxy) *Backend {
		tb := p.Router("orders").Table()
		return tb.Backend(tb.Owner(balancer.HashString("customer-42")))
	}
	cases := map[string]struct {
		modify func(*Config)
		setup  func(*Proxy)
		reason string
	}{
		"overloaded": {
			modify: func(c *Config) { c.ReplicaSets[0].Limits.MaxInflightPerReplica = 1 },
			setup:  func(p *Proxy) { owner(p).inflight.Store(1) },
			reason: "overloaded",
		},
		"queue timeout": {
			modify: func(c *Config) {
				l := &c.ReplicaSets[0].Limits
				l.MaxInflightPerReplica, l.MaxQueuedPerReplica, l.MaxQueueWait = 1, 4, time.Millisecond
			},
			setup:  func(p *Proxy) { owner(p).inflight.Store(1) },
			reason: "queue_timeout",
		},
		"saturated": {
			setup:  func(p *Proxy) { owner(p).saturatedUntil.Store(time.Now().Add(time.Hour).UnixNano()) },
			reason: "replica_saturated",
		},
		"set overloaded": {
			modify: func(c *Config) { c.ReplicaSets[0].Limits.MaxInflight = 1 },
			setup:  func(p *Proxy) { p.routes.Load().sets[0].st.inflight.Store(1) },
			reason: "set_overloaded",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rig := startMemRigOpts(t, 3, tc.modify, Options{})
			tc.setup(rig.p)
			tmpl := newKeyedPost("http://orders.example/ingest", "customer-42", []byte(`{"id":1}`))
			defer fasthttp.ReleaseRequest(tmpl)
			var ctx fasthttp.RequestCtx
			ctx.Init(tmpl, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
			run := func() {
				tmpl.CopyTo(&ctx.Request)
				ctx.Response.Reset()
				rig.p.handle(&ctx)
				if ctx.Response.StatusCode() != 503 || !bytes.Contains(ctx.Response.Body(), []byte(`"reason":"`+tc.reason+`"`)) {
					t.Fatalf("status %d: %s; want 503 with reason %s", ctx.Response.StatusCode(), ctx.Response.Body(), tc.reason)
				}
			}
			for range 20 {
				run()
			}
			if allocs := testing.AllocsPerRun(200, run); allocs != 0 {
				t.Fatalf("%v allocations per shed request, want 0", allocs)
			}
		})
	}
}
