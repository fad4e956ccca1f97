package proxy

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
	"keyway/internal/poll"
)

// headField is one field line of a head: its name in lower case (names
// are case-insensitive) and its value as sent.
type headField struct{ name, value string }

// headFields returns the field lines of the first head in raw, sorted by
// name, stably: fields of one name keep their order, which is what their
// combined value depends on.
func headFields(t *testing.T, raw string) []headField {
	t.Helper()
	head, _, ok := strings.Cut(raw, "\r\n\r\n")
	if !ok {
		t.Fatalf("no head end in %q", raw)
	}
	lines := strings.Split(head, "\r\n")[1:]
	fs := make([]headField, 0, len(lines))
	for _, l := range lines {
		name, value, ok := strings.Cut(l, ":")
		if !ok {
			t.Fatalf("field line without a colon: %q", l)
		}
		fs = append(fs, headField{strings.ToLower(name), strings.Trim(value, " \t")})
	}
	slices.SortStableFunc(fs, func(a, b headField) int { return strings.Compare(a.name, b.name) })
	return fs
}

// TestForwardedHeadIsTheClients compares the head a replica receives with
// the one the client sent, field by field: the same fields with the same
// values, in the same order for each name, and nothing added besides the
// documented X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host and
// X-Request-Id (and hop-by-hop fields removed).
func TestForwardedHeadIsTheClients(t *testing.T) {
	rep := startByteReplica(t)
	_, addr := startProxy(t, func(c *Config) {
		sc := &c.ReplicaSets[0]
		sc.Static = []StaticReplica{{Name: "r", Addr: rep.addr(), Weight: 1}}
		sc.Replicas = 1
	})
	added := map[string]bool{"x-forwarded-for": true, "x-forwarded-proto": true, "x-forwarded-host": true, "x-request-id": true}
	hop := map[string]bool{"connection": true, "keep-alive": true, "te": true, "x-hop": true}
	for _, c := range []struct{ name, raw string }{
		{"POST without Content-Type", "POST /a HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\r\nContent-Length: 5\r\n\r\nhello"},
		{"POST with Content-Type", "POST /a HTTP/1.1\r\nHost: orders.example\r\nContent-Type: application/json\r\nX-Key: k1\r\nContent-Length: 2\r\n\r\n{}"},
		{"GET, no body", "GET /a?x=1 HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\r\n\r\n"},
		{"empty body", "POST /a HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\r\nContent-Length: 0\r\n\r\n"},
		{"repeated fields, odd case, empty value", "PUT /a HTTP/1.1\r\nhost: orders.example\r\nx-key: k1\r\nAccept: a/b\r\naccept: c/d\r\nX-Empty:\r\nUSER-AGENT: producer/1\r\nx-Custom-THING: v\r\nCookie: a=b\r\nContent-Length: 1\r\n\r\nz"},
		{"hop-by-hop fields", "POST /a HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nContent-Length: 1\r\n\r\nz"},
		{"the client's own request ID", "POST /a HTTP/1.1\r\nHost: orders.example\r\nX-Key: k1\r\nX-Request-Id: mine\r\nContent-Length: 1\r\n\r\nz"},
		{"HTTP/1.0", "POST /a HTTP/1.0\r\nHost: orders.example\r\nX-Key: k1\r\nContent-Length: 1\r\n\r\nz"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep.take()
			rc := dialRaw(t, addr)
			rc.send(t, c.raw)
			if r := rc.read(t); r.status != 200 {
				t.Fatalf("status %d, want 200", r.status)
			}
			var got string
			poll.Until(t, 5*time.Second, "the replica's copy", func() bool {
				got, _ = rep.take()
				return strings.Contains(got, "\r\n\r\n")
			})
			var sent, fwd []headField
			for _, f := range headFields(t, c.raw) {
				if !hop[f.name] {
					sent = append(sent, f)
				}
			}
			ownID := strings.Contains(c.raw, "X-Request-Id")
			for _, f := range headFields(t, got) {
				if added[f.name] && !(f.name == "x-request-id" && ownID) {
					continue
				}
				fwd = append(fwd, f)
			}
			if !slices.Equal(sent, fwd) {
				t.Fatalf("the replica's fields differ from the client's\nclient:  %v\nreplica: %v\nreceived: %q", sent, fwd, got)
			}
			_, body, _ := strings.Cut(c.raw, "\r\n\r\n")
			if _, gotBody, _ := strings.Cut(got, "\r\n\r\n"); !bytes.Equal([]byte(gotBody), []byte(body)) {
				t.Fatalf("body %q, want %q", gotBody, body)
			}
		})
	}
}

// TestDuplicateKeyRefused: a request that carries the deciding key header
// or key query parameter twice is refused with 400, its JSON error naming
// the field, and reaches no replica; the path segment is one key by
// construction, and a source after the deciding one is not read.
func TestDuplicateKeyRefused(t *testing.T) {
	rep := startReplica(t, "r0")
	p, addr := startProxy(t, func(c *Config) {
		c.ReplicaSets[0].Key = []balancer.KeySource{{Header: "X-Key"}, {Query: "key"}, {PathSegment: 2}}
	}, rep)
	for _, c := range []struct {
		name, raw string
		want      int
		field     string // named in the error
	}{
		{"header twice", "GET /a HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\nX-Key: k2\r\n\r\n", 400, "X-Key"},
		{"header twice, same value", "GET /a HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\nx-key: k1\r\n\r\n", 400, "X-Key"},
		{"header twice, first empty", "GET /a HTTP/1.1\r\nHost: a\r\nX-Key:\r\nX-Key: k2\r\n\r\n", 400, "X-Key"},
		{"query twice", "GET /a?key=k1&x=1&key=k2 HTTP/1.1\r\nHost: a\r\n\r\n", 400, "key"},
		{"query twice, one empty", "GET /a?key=&key=k2 HTTP/1.1\r\nHost: a\r\n\r\n", 400, "key"},
		{"header once, query twice: the header decides", "GET /a?key=k1&key=k2 HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\n\r\n", 200, ""},
		{"path segment", "GET /ingest/k1/k2 HTTP/1.1\r\nHost: a\r\n\r\n", 200, ""},
		{"other fields twice", "GET /a HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\nAccept: a\r\nAccept: b\r\n\r\n", 200, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := rep.count.Load()
			rc := dialRaw(t, addr)
			rc.send(t, c.raw)
			r := rc.read(t)
			if r.status != c.want {
				t.Fatalf("status %d, want %d: %v", r.status, c.want, r)
			}
			if c.want != 400 {
				return
			}
			if n := rep.count.Load(); n != before {
				t.Fatalf("a refused request reached the replica")
			}
			m := r.errorJSON(t)
			if !strings.Contains(m["error"], " "+c.field+" more than once") {
				t.Fatalf("error %q does not name %s", m["error"], c.field)
			}
		})
	}
	if got := testutil.ToFloat64(p.routes.Load().sets[0].local[lrDupKey]); got != 5 {
		t.Fatalf("local responses for duplicate_key: %v, want 5", got)
	}
}
