package proxy

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

const routeHdr = "X-Keyway-Route"

func withRouteContext(cfg *Config) { cfg.ReplicaSets[0].RouteContext.Header = routeHdr }

// echoRoute makes a test replica answer with its name and every route
// context header it received, "name|value|value...".
func echoRoute(r *testReplica) {
	r.setHandler(func(ctx *fasthttp.RequestCtx) {
		out := r.name
		for _, v := range ctx.Request.Header.PeekAll(routeHdr) {
			out += "|" + string(v)
		}
		ctx.SetBodyString(out)
	})
}

// wantRoute is the route context of an attempt of a keyed request.
func wantRoute(p *Proxy, key, receiver string) string {
	t := p.Router("orders").Table()
	h := balancer.HashString(key)
	owner := t.Replica(t.Owner(h)).Name
	standin := "0"
	if receiver != owner {
		standin = "1"
	}
	return "partition=" + strconv.Itoa(t.Partition(h)) + "; standin=" + standin +
		"; ring=" + t.Digest() + "; key=" + string(appendRouteKey(nil, []byte(key))) + "; owner=" + owner
}

func TestRouteContext(t *testing.T) {
	r0, r1, r2 := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")
	for _, r := range []*testReplica{r0, r1, r2} {
		echoRoute(r)
	}
	p, addr := startProxy(t, withRouteContext, r0, r1, r2)
	cl := newClient(addr)
	ring := func() string {
		t := p.Router("orders").Table()
		return "ring=" + t.Digest()
	}

	key := keyOwnedBy(t, p, "r1")
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", key); r.body != "r1|"+wantRoute(p, key, "r1") {
		t.Fatalf("keyed request to its owner: %q, want %q", r.body, "r1|"+wantRoute(p, key, "r1"))
	}
	// Whatever the client sent under that name is replaced.
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", key, routeHdr, "partition=1; standin=0; owner=r2"); r.body != "r1|"+wantRoute(p, key, "r1") {
		t.Fatalf("a client's own route context reached the replica: %q", r.body)
	}
	// Keyless: only what applies.
	if r := cl.do(t, "POST", "/ingest", "x"); !strings.HasSuffix(r.body, "|"+ring()) || strings.Count(r.body, "|") != 1 {
		t.Fatalf("keyless request: %q, want NAME|%s", r.body, ring())
	}
	// The owner out of rotation: a stand-in gets the key, and says so.
	p.SetExcluded("orders", "r1", balancer.ReasonProbe, true)
	stand := ownerOf(p, "orders", key)
	if stand == "" || stand == "r1" {
		t.Fatalf("key %s goes to %q with its owner r1 out", key, stand)
	}
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", key); r.body != stand+"|"+wantRoute(p, key, stand) {
		t.Fatalf("stand-in: %q, want %q", r.body, stand+"|"+wantRoute(p, key, stand))
	}
	if !strings.Contains(wantRoute(p, key, stand), "standin=1") {
		t.Fatal("the expected route context of a stand-in does not say standin=1")
	}
}

// The header is set per attempt: a retry on the next candidate says it
// is a stand-in, although the owner is in rotation.
func TestRouteContextPerAttempt(t *testing.T) {
	var mu sync.Mutex
	var atOwner []string
	r0 := startRawReplica(t, "r0", func(req *fasthttp.Request, c net.Conn) bool {
		mu.Lock()
		atOwner = append(atOwner, string(req.Header.Peek(routeHdr)))
		mu.Unlock()
		return false // closes without an answer: reset on a fresh connection
	})
	r1 := startReplica(t, "r1")
	echoRoute(r1)
	p, addr := startProxy(t, withRouteContext, r0, r1)
	key := keyWithCandidates(t, p, "r0", "r1")
	r := newClient(addr).do(t, "PUT", "/ingest", "x", "X-Key", key)
	if want := "r1|" + wantRoute(p, key, "r1"); r.status != 200 || r.body != want {
		t.Fatalf("PUT retried on r1: %s, want 200 %q", r, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := wantRoute(p, key, "r0"); len(atOwner) != 1 || atOwner[0] != want {
		t.Fatalf("the owner's attempt carried %q, want [%q]", atOwner, want)
	}
	if !strings.Contains(atOwner[0], "standin=0") {
		t.Fatalf("the owner's attempt: %q", atOwner[0])
	}
}

// Off (the default), the request is forwarded as it was: no header is
// added, and a client's header of that name passes through.
func TestRouteContextOff(t *testing.T) {
	r0 := startReplica(t, "r0")
	echoRoute(r0)
	_, addr := startProxy(t, nil, r0)
	cl := newClient(addr)
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.body != "r0" {
		t.Fatalf("route context off: the replica saw %q", r.body)
	}
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k", routeHdr, "from-client"); r.body != "r0|from-client" {
		t.Fatalf("route context off: the replica saw %q, want the client's header unchanged", r.body)
	}
}

func TestRouteContextConfig(t *testing.T) {
	cases := map[string]struct {
		header string
		want   string // "" for valid
	}{
		"off":                {header: ""},
		"valid":              {header: "X-Keyway-Route"},
		"not a token":        {header: "X Route", want: `route_context.header: "X Route" is not a valid HTTP header name`},
		"colon":              {header: "X-Route:", want: "is not a valid HTTP header name"},
		"hop-by-hop":         {header: "connection", want: `route_context.header: "connection" is a hop-by-hop header`},
		"forwarding header":  {header: "X-Forwarded-For", want: "is a header keyway sets or relies on itself"},
		"host":               {header: "Host", want: "is a header keyway sets or relies on itself"},
		"key header":         {header: "x-key", want: `route_context.header: "x-key" is a key source of this set`},
		"idempotency header": {header: "Idempotency-Key", want: "is the set's retries.idempotency_header"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			sc := DefaultSetConfig()
			sc.Name = "orders"
			sc.Static = []StaticReplica{{Name: "orders-0", Addr: "127.0.0.1:9001", Weight: 1}}
			sc.RouteContext.Header = c.header
			err := sc.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Validate: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// The key is the one routed by, whichever source gave it, in its canonical
// (decoded) form, percent-encoded: a replica reads it back with a URL
// unescaper, and no byte of a key can break the value's fields.
func TestRouteContextKey(t *testing.T) {
	r0 := startReplica(t, "r0")
	echoRoute(r0)
	p, addr := startProxy(t, func(c *Config) {
		withRouteContext(c)
		c.ReplicaSets[0].Key = []balancer.KeySource{{Header: "X-User"}, {PathSegment: 2}, {Query: "key"}}
	}, r0)
	cl := newClient(addr)
	for _, c := range []struct {
		path    string
		hdrs    []string
		key     string // decoded
		encoded string
	}{
		{"/ingest", []string{"X-User", "alice"}, "alice", "alice"},
		{"/ingest/x", []string{"X-User", "tenant 7;a=b%"}, "tenant 7;a=b%", "tenant%207%3Ba%3Db%25"},
		{"/ingest/order%2D42/items", nil, "order-42", "order-42"},
		{"/ingest/caf%C3%A9", nil, "café", "caf%C3%A9"},
		{"/ingest?key=a+b%26c", nil, "a b&c", "a%20b%26c"},
	} {
		r := cl.do(t, "GET", c.path, "", c.hdrs...)
		_, v, _ := strings.Cut(r.body, "|")
		_, after, ok := strings.Cut(v, "; key=")
		enc, _, _ := strings.Cut(after, "; owner=")
		if !ok || enc != c.encoded {
			t.Errorf("%s %q: route context %q, want key=%s", c.path, c.hdrs, v, c.encoded)
			continue
		}
		if dec, err := url.PathUnescape(enc); err != nil || dec != c.key {
			t.Errorf("%s: key=%s decodes to %q, %v; want %q", c.path, enc, dec, err, c.key)
		}
		if !strings.HasPrefix(v, "partition="+strconv.Itoa(p.Router("orders").Table().Partition(balancer.HashString(c.key)))+";") {
			t.Errorf("%s: %q is not the partition of %q", c.path, v, c.key)
		}
	}
}
