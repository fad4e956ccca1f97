package proxy

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

// sendKeys sends every key rounds times to addr from workers goroutines and
// returns, per key, the replica names that answered, in order.
func sendKeys(t *testing.T, addr string, keys []string, rounds, workers int) map[string][]string {
	t.Helper()
	cl := newClient(addr)
	got := make([][]string, len(keys))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(keys); i += workers {
				for r := 0; r < rounds; r++ {
					rep, err := cl.try("POST", "/ingest", "x", "X-Key", keys[i])
					if err == nil && rep.status != 200 {
						err = fmt.Errorf("key %s: %v", keys[i], rep)
					}
					if err != nil {
						errs <- err
						return
					}
					got[i] = append(got[i], rep.body)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	out := make(map[string][]string, len(keys))
	for i, k := range keys {
		out[k] = got[i]
	}
	return out
}

// TestKeysStickToOneReplica: 10,000 keys, each sent twice, each reach exactly
// one replica; a second proxy whose static list is in another order routes
// every key to the same replica; the spread is within the load bound.
func TestKeysStickToOneReplica(t *testing.T) {
	reps := []*testReplica{startReplica(t, "orders-0"), startReplica(t, "orders-1"), startReplica(t, "orders-2")}
	_, addr1 := startProxy(t, nil, reps...)
	_, addr2 := startProxy(t, func(c *Config) {
		s := c.ReplicaSets[0].Static
		s[0], s[1], s[2] = s[2], s[0], s[1] // a different order
	}, reps...)

	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer-%d", i)
	}
	first := sendKeys(t, addr1, keys, 2, 8)
	second := sendKeys(t, addr2, keys, 1, 8)

	perReplica := map[string]int{}
	for _, k := range keys {
		got := append(first[k], second[k]...)
		if len(got) != 3 || got[0] != got[1] || got[0] != got[2] {
			t.Fatalf("key %s was answered by %v (proxy 1 twice, proxy 2 once); want one replica", k, got)
		}
		perReplica[got[0]]++
	}
	// The replicas' own records agree: every key arrived at one replica only,
	// three times.
	for _, k := range keys {
		n, holders := 0, 0
		for _, r := range reps {
			r.mu.Lock()
			if c := r.keys[k]; c > 0 {
				n += c
				holders++
			}
			r.mu.Unlock()
		}
		if holders != 1 || n != 3 {
			t.Fatalf("key %s: %d requests on %d replicas, want 3 on 1", k, n, holders)
		}
	}
	mean := float64(len(keys)) / float64(len(reps))
	maxKeys := 0
	for _, r := range reps {
		maxKeys = max(maxKeys, perReplica[r.name])
	}
	t.Logf("keys per replica: %v; max/mean %.3f", perReplica, float64(maxKeys)/mean)
	if len(perReplica) != 3 {
		t.Fatalf("keys reached %d replicas, want 3: %v", len(perReplica), perReplica)
	}
	if r := float64(maxKeys) / mean; r > 1.25 {
		t.Fatalf("max/mean keys per replica = %.3f, want <= 1.25 (%v)", r, perReplica)
	}
}

// distinctOwners returns one value per replica name, each routed to a
// different replica, so that a test can tell which source a key came from.
func distinctOwners(t *testing.T, p *Proxy, prefix string, n int) []string {
	t.Helper()
	var out []string
	var owners []string
	for i := 0; i < 1000 && len(out) < n; i++ {
		v := fmt.Sprintf("%s%d", prefix, i)
		o := ownerOf(p, "orders", v)
		if !slices.Contains(owners, o) {
			out, owners = append(out, v), append(owners, o)
		}
	}
	if len(out) < n {
		t.Fatalf("found only %d values with distinct owners", len(out))
	}
	return out
}

// TestKeySources checks each key source and the order they are tried in:
// the first source present wins; header names match case-insensitively;
// path and query keys are decoded to the same canonical key as a header.
func TestKeySources(t *testing.T) {
	reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
	p, addr := startProxy(t, func(c *Config) {
		c.ReplicaSets[0].Key = []balancer.KeySource{{Header: "x-tenant-key"}, {PathSegment: 2}, {Query: "key"}}
		c.ReplicaSets[0].Fallback = balancer.FallbackReject
	}, reps...)
	cl := newClient(addr)
	v := distinctOwners(t, p, "v", 3) // v[0], v[1], v[2] live on three different replicas
	owner := func(k string) string { return ownerOf(p, "orders", k) }

	cases := map[string]struct {
		uri   string
		hdrs  []string
		owner string // the replica expected to answer
	}{
		"header exact case":             {"/ingest", []string{"x-tenant-key", v[0]}, owner(v[0])},
		"header other case":             {"/ingest", []string{"X-TENANT-KEY", v[0]}, owner(v[0])},
		"header canonical case":         {"/ingest", []string{"X-Tenant-Key", v[1]}, owner(v[1])},
		"path segment":                  {"/ingest/" + v[1], nil, owner(v[1])},
		"path segment escaped":          {"/ingest/%" + fmt.Sprintf("%02X", v[1][0]) + v[1][1:] + "/more", nil, owner(v[1])},
		"query":                         {"/?key=" + v[2], nil, owner(v[2])},
		"query escaped":                 {"/?a=1&key=" + strings.ReplaceAll(v[2], "v", "%76"), nil, owner(v[2])},
		"query plus is space":           {"/?key=a+b", nil, owner("a b")},
		"header before path":            {"/ingest/" + v[1] + "?key=" + v[2], []string{"X-Tenant-Key", v[0]}, owner(v[0])},
		"path before query":             {"/ingest/" + v[1] + "?key=" + v[2], nil, owner(v[1])},
		"empty header falls through":    {"/ingest/" + v[1], []string{"X-Tenant-Key", ""}, owner(v[1])},
		"missing segment falls through": {"/ingest?key=" + v[2], nil, owner(v[2])},
		"same key any source header":    {"/ingest", []string{"X-Tenant-Key", "same"}, owner("same")},
		"same key any source path":      {"/ingest/same", nil, owner("same")},
		"same key any source query":     {"/?key=same", nil, owner("same")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := cl.do(t, "POST", tc.uri, "x", tc.hdrs...)
			if r.status != 200 || r.body != tc.owner {
				t.Fatalf("%s %v: got %v, want 200 from %s", tc.uri, tc.hdrs, r, tc.owner)
			}
		})
	}
	t.Run("no source present is rejected naming every source", func(t *testing.T) {
		r := cl.do(t, "POST", "/ingest", "x")
		if r.status != 400 {
			t.Fatalf("got %v, want 400", r)
		}
		m := r.errorJSON(t)
		for _, s := range []string{"header x-tenant-key", "path segment 2", "query key"} {
			if !strings.Contains(m["error"], s) {
				t.Errorf("error %q does not name source %q", m["error"], s)
			}
		}
		if m["replica_set"] != "orders" {
			t.Errorf("replica_set = %q, want orders", m["replica_set"])
		}
	})
	t.Run("invalid key in the first present source is rejected, not skipped", func(t *testing.T) {
		r := cl.do(t, "POST", "/ingest/a%2Fb?key="+v[2], "x")
		if r.status != 400 {
			t.Fatalf("got %v, want 400", r)
		}
		r.errorJSON(t)
	})
}

// TestFallback covers each policy for requests without a key.
func TestFallback(t *testing.T) {
	t.Run("round_robin spreads evenly", func(t *testing.T) {
		reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
		_, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].Fallback = balancer.FallbackRoundRobin }, reps...)
		cl := newClient(addr)
		hits := map[string]int{}
		for i := 0; i < 30; i++ {
			r := cl.do(t, "POST", "/ingest", "x")
			if r.status != 200 {
				t.Fatalf("got %v", r)
			}
			hits[r.body]++
		}
		for _, rep := range reps {
			if hits[rep.name] != 10 {
				t.Fatalf("round robin over 30 requests: %v, want 10 each", hits)
			}
		}
	})
	t.Run("random hits every replica", func(t *testing.T) {
		reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
		_, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].Fallback = balancer.FallbackRandom }, reps...)
		cl := newClient(addr)
		hits := map[string]int{}
		for i := 0; i < 300; i++ { // P(a replica is never hit) = 3·(2/3)^300 ≈ 1e-52
			hits[cl.do(t, "POST", "/ingest", "x").body]++
		}
		for _, rep := range reps {
			if hits[rep.name] == 0 {
				t.Fatalf("random over 300 requests never hit %s: %v", rep.name, hits)
			}
		}
	})
	t.Run("least_inflight avoids a busy replica", func(t *testing.T) {
		busy, idle := startReplica(t, "busy"), startReplica(t, "idle")
		release := make(chan struct{})
		arrived := make(chan struct{}, 1)
		busy.setHandler(func(ctx *fasthttp.RequestCtx) {
			if len(ctx.Request.Header.Peek("X-Key")) > 0 { // the keyed request blocks
				arrived <- struct{}{}
				<-release
			}
			ctx.SetBodyString("busy")
		})
		p, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].Fallback = balancer.FallbackLeastInflight }, busy, idle)
		cl := newClient(addr)
		key := keyOwnedBy(t, p, "busy")
		blocked := make(chan reply, 1)
		go func() {
			r, _ := cl.try("POST", "/ingest", "x", "X-Key", key)
			blocked <- r
		}()
		t.Cleanup(func() { // before the proxy shuts down (cleanups run last first)
			close(release)
			<-blocked
		})
		within(t, arrived, 5*time.Second, "the keyed request at busy") // busy now has one request in flight
		// With both choices drawn with replacement, a quarter of these would
		// go to busy: all 40 avoiding it would happen with p ≈ 1e-5.
		for i := 0; i < 40; i++ {
			if r := cl.do(t, "POST", "/ingest", "x"); r.body != "idle" {
				t.Fatalf("keyless request %d went to %v while busy had a request in flight", i, r)
			}
		}
	})
	t.Run("reject answers 400 naming the sources", func(t *testing.T) {
		rep := startReplica(t, "r0")
		_, addr := startProxy(t, func(c *Config) {
			c.ReplicaSets[0].Fallback = balancer.FallbackReject
			c.ReplicaSets[0].Key = []balancer.KeySource{{Header: "X-Key"}, {PathSegment: 3}}
		}, rep)
		r := newClient(addr).do(t, "POST", "/ingest", "x")
		if r.status != 400 {
			t.Fatalf("got %v, want 400", r)
		}
		m := r.errorJSON(t)
		if !strings.Contains(m["error"], "header X-Key, path segment 3") {
			t.Fatalf("error %q does not name the sources", m["error"])
		}
		if rep.count.Load() != 0 {
			t.Fatalf("a rejected request reached the replica")
		}
	})
}

// TestRotation takes a replica out of rotation and back: only its keys move,
// each to the next replica along the ring, and they come back; with
// failover strict its keys get 503 + Retry-After instead.
func TestRotation(t *testing.T) {
	keys := make([]string, 1500)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	route := func(t *testing.T, cl *client) map[string]reply {
		out := map[string]reply{}
		for _, k := range keys {
			out[k] = cl.do(t, "POST", "/ingest", "x", "X-Key", k)
		}
		return out
	}
	for _, failover := range []balancer.Failover{balancer.FailoverNext, balancer.FailoverStrict} {
		t.Run(failover.String(), func(t *testing.T) {
			reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
			p, addr := startProxy(t, func(c *Config) { c.ReplicaSets[0].Failover = failover }, reps...)
			cl := newClient(addr)
			router := p.Router("orders")
			before := route(t, cl)

			router.SetHealthy("r1", false)
			n1 := reps[1].count.Load()
			during := route(t, cl)
			if reps[1].count.Load() != n1 {
				t.Fatalf("r1 out of rotation still received requests")
			}
			moved := 0
			tbl := router.Table()
			for _, k := range keys {
				b, d := before[k], during[k]
				if b.status != 200 {
					t.Fatalf("key %s before: %v", k, b)
				}
				if b.body != "r1" {
					if d.status != 200 || d.body != b.body {
						t.Fatalf("key %s owned by %s moved to %v when r1 left rotation", k, b.body, d)
					}
					continue
				}
				moved++
				if failover == balancer.FailoverStrict {
					if d.status != 503 || d.header["Retry-After"] == "" {
						t.Fatalf("strict: key %s of r1 got %v, want 503 with Retry-After", k, d)
					}
					if m := d.errorJSON(t); m["replica"] != "r1" || m["replica_set"] != "orders" {
						t.Fatalf("strict: error body %v, want replica r1 of orders", m)
					}
					continue
				}
				// The stand-in is the next ring member after r1 for this key's
				// partition: the same on every proxy.
				next := ""
				for _, s := range tbl.Order(balancer.HashString(k)) {
					if name := tbl.Replica(s).Name; name != "r1" {
						next = name
						break
					}
				}
				if d.status != 200 || d.body != next {
					t.Fatalf("key %s of r1 went to %v, want the next along the ring, %s", k, d, next)
				}
			}
			if moved == 0 {
				t.Fatal("r1 owned none of the keys: the test proves nothing")
			}

			router.SetHealthy("r1", true)
			after := route(t, cl)
			for _, k := range keys {
				if after[k].status != 200 || after[k].body != before[k].body {
					t.Fatalf("key %s: %v before, %v after r1 returned", k, before[k], after[k])
				}
			}
		})
	}
}

// TestMatchSets checks that a request goes to the most specific set.
func TestMatchSets(t *testing.T) {
	a, b, c, d := startReplica(t, "a"), startReplica(t, "b"), startReplica(t, "c"), startReplica(t, "d")
	set := func(name, host, prefix string, r *testReplica) SetConfig {
		sc := DefaultSetConfig()
		sc.Name, sc.Match = name, MatchConfig{Host: host, PathPrefix: prefix}
		sc.Static = []StaticReplica{{Name: r.name, Addr: r.addr(), Weight: 1}}
		return sc
	}
	_, addr := startProxy(t, func(c2 *Config) {
		c2.ReplicaSets = []SetConfig{
			set("ingest", "", "/ingest", a),
			set("special", "", "/ingest/special", b),
			set("tenant", "Tenant.Example", "/", c),
			set("api", "", "/api/", d),
		}
	})
	cl := newClient(addr)
	cases := map[string]struct{ host, uri, want string }{
		"prefix":                 {"x.example", "/ingest", "a"},
		"prefix with subpath":    {"x.example", "/ingest/k1", "a"},
		"longer prefix wins":     {"x.example", "/ingest/special/k1", "b"},
		"segment boundary":       {"x.example", "/ingestx", ""},
		"host beats path":        {"tenant.example", "/ingest/special/k1", "c"},
		"host case and port":     {"TENANT.example:8080", "/other", "c"},
		"prefix ending in slash": {"x.example", "/api/v1", "d"},
		"prefix query":           {"x.example", "/ingest?key=1", "a"},
		"no match":               {"x.example", "/other", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := cl.do(t, "POST", tc.uri, "x", "Host", tc.host, "X-Key", "k")
			if tc.want == "" {
				if r.status != 404 {
					t.Fatalf("got %v, want 404", r)
				}
				if m := r.errorJSON(t); m["replica_set"] != "" {
					t.Fatalf("404 names set %q", m["replica_set"])
				}
				return
			}
			if r.status != 200 || r.body != tc.want {
				t.Fatalf("got %v, want 200 from %s", r, tc.want)
			}
		})
	}
}

// panicObserver panics on every observation: a bug inside the request
// path.
type panicObserver struct{}

func (panicObserver) Observe(string, string, int, error, time.Duration) { panic("observer bug") }

// TestHandlerPanicIs502: a panic inside the request path answers 502
// with keyway's JSON error, the in-flight gauge comes back down, and the
// proxy goes on serving.
func TestHandlerPanicIs502(t *testing.T) {
	rep := startReplica(t, "r0")
	p, addr := startProxyOpts(t, Options{Observer: panicObserver{}, Registerer: newRegistry()}, nil, rep)
	c := newClient(addr)
	for i := range 3 {
		r := c.do(t, "GET", "/x", "", "X-Key", "k")
		if r.status != fasthttp.StatusBadGateway {
			t.Fatalf("request %d: %v, want 502", i, r)
		}
		if msg := r.errorJSON(t)["error"]; msg != "internal proxy error" {
			t.Fatalf("request %d: error %q", i, msg)
		}
	}
	if v := testutil.ToFloat64(p.metrics.inflight); v != 0 {
		t.Fatalf("keyway_inflight_requests = %v after the requests, want 0", v)
	}
}
