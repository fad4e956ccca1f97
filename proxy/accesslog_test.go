package proxy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
	"keyway/logging"
)

// lineSink is an access log that keeps its lines.
type lineSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *lineSink) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

// lines parses every line, failing on one that is not a JSON object.
func (s *lineSink) lines(t testing.TB) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(s.buf.String(), "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("access-log line is not a JSON object: %v\n%s", err, l)
		}
		out = append(out, m)
	}
	return out
}

var reqIDForm = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestAccessLog: one JSON line per request through a real listener, for
// answers from replicas (after a retry) and from keyway itself, with
// every field.
func TestAccessLog(t *testing.T) {
	sink := &lineSink{}
	dead, live := startReplica(t, "dead"), startReplica(t, "live")
	p, addr := startProxyOpts(t, Options{AccessLog: sink}, func(c *Config) {
		c.ReplicaSets[0].Match.PathPrefix = "/ingest"
		c.ReplicaSets[0].Key = []balancer.KeySource{{Header: "X-Key"}, {PathSegment: 2}}
	}, dead, live)
	key := keyOwnedBy(t, p, "dead")
	dead.stop(t)
	live.setHandler(func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("accepted") })
	cl := newClient(addr)
	cl.do(t, "POST", "/ingest/a?x=1", "body", "X-Key", key, "X-Request-Id", "rid-1")
	cl.do(t, "PUT", "/ingest/"+key+"/events", "")
	cl.do(t, "GET", "/elsewhere", "")

	lines := sink.lines(t)
	if len(lines) != 3 {
		t.Fatalf("%d access-log lines, want 3: %v", len(lines), lines)
	}
	want := []map[string]any{
		{"request_id": "rid-1", "method": "POST", "host": "orders.example", "path": "/ingest/{key}", "status": 200.0, "set": "orders",
			"replica": "live", "attempts": 2.0, "bytes_in": 4.0, "bytes_out": 8.0},
		{"method": "PUT", "path": "/ingest/{key}/events", "status": 200.0, "set": "orders", "replica": "live", "attempts": 1.0, "bytes_in": 0.0},
		{"method": "GET", "path": "/elsewhere", "status": 404.0, "set": "", "replica": "", "attempts": 0.0, "reason": "no_set", "upstream_duration": 0.0},
	}
	for i, got := range lines {
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %v (%v)", i, k, got[k], v, got)
			}
		}
		ts, err := time.Parse(time.RFC3339Nano, got["time"].(string))
		if err != nil || !strings.HasSuffix(got["time"].(string), "Z") || time.Since(ts) > time.Minute || time.Since(ts) < 0 {
			t.Errorf("line %d: time %v is not a recent RFC 3339 UTC time (%v)", i, got["time"], err)
		}
		if c, _ := got["client"].(string); !strings.HasPrefix(c, "127.0.0.1:") {
			t.Errorf("line %d: client %v, want 127.0.0.1:PORT", i, got["client"])
		}
		d, _ := got["duration"].(float64)
		u, _ := got["upstream_duration"].(float64)
		if d <= 0 || u < 0 || u > d || d > 10 {
			t.Errorf("line %d: duration %v, upstream_duration %v: want 0 <= upstream <= duration, duration > 0", i, got["duration"], got["upstream_duration"])
		}
		if i < 2 && u <= 0 {
			t.Errorf("line %d: upstream_duration %v, want > 0 after an exchange with a replica", i, u)
		}
		if _, ok := got["key"]; ok {
			t.Errorf("line %d: the key is logged without AccessKey: %v", i, got)
		}
		if _, ok := got["reason"]; ok != (i == 2) {
			t.Errorf("line %d: reason %v", i, got["reason"])
		}
	}
	// Without the client's id, the line has the id keyway forwarded.
	if id := lines[1]["request_id"].(string); !reqIDForm.MatchString(id) || string(live.last.Load().Header.Peek("X-Request-Id")) != id {
		t.Errorf("request_id %q: want the 32 hex digits the replica received (%q)", id, live.last.Load().Header.Peek("X-Request-Id"))
	}
	if id := lines[2]["request_id"].(string); !reqIDForm.MatchString(id) || id == lines[1]["request_id"] {
		t.Errorf("request_id %q of a local answer: want a new id of 32 hex digits", id)
	}
}

// TestAccessLogUnreadable: requests fasthttp could not read get a line
// too, with the reason, the set whose body limit applied, and a duration
// of their own (not the previous request's on the connection).
func TestAccessLogUnreadable(t *testing.T) {
	sink := &lineSink{}
	r := startReplica(t, "r0")
	_, addr := startProxyOpts(t, Options{AccessLog: sink}, func(c *Config) { c.ReplicaSets[0].MaxBodyBytes = 16 }, r)
	rc := dialRaw(t, addr)
	rc.send(t, "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\nContent-Length: 2\r\n\r\nok")
	if got := rc.read(t); got.status != 200 {
		t.Fatalf("first request: %v", got)
	}
	rc.send(t, "POST /ingest HTTP/1.1\r\nHost: orders.example\r\nX-Key: k\r\nContent-Length: 100\r\n\r\n"+strings.Repeat("x", 100))
	if got := rc.read(t); got.status != 413 {
		t.Fatalf("large body: %v", got)
	}
	rc2 := dialRaw(t, addr)
	rc2.send(t, "GARBAGE\r\n\r\n")
	if got := rc2.read(t); got.status != 400 {
		t.Fatalf("malformed: %v", got)
	}
	lines := sink.lines(t)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %v", len(lines), lines)
	}
	want := []map[string]any{
		{"status": 200.0, "set": "orders", "replica": "r0"},
		{"status": 413.0, "set": "orders", "replica": "", "reason": "body_too_large", "attempts": 0.0},
		{"status": 400.0, "set": "", "replica": "", "reason": "malformed"},
	}
	for i, l := range lines {
		for k, v := range want[i] {
			if l[k] != v {
				t.Errorf("line %d: %s = %v, want %v (%v)", i, k, l[k], v, l)
			}
		}
		if d, _ := l["duration"].(float64); d < 0 || d > 5 {
			t.Errorf("line %d: duration %v", i, l["duration"])
		}
		if id, _ := l["request_id"].(string); !reqIDForm.MatchString(id) {
			t.Errorf("line %d: no request id", i)
		}
	}
}

// TestAccessLogKey: with AccessKey, the line carries the key's logged
// form, computed from the decoded key whatever its source; without it,
// no key. The key's path segment is always {key}.
func TestAccessLogKey(t *testing.T) {
	sources := []balancer.KeySource{{Header: "X-Key"}, {PathSegment: 2}, {Query: "k"}}
	cases := map[string]struct {
		path string
		hdrs []string
		key  any // nil: no key field
		logs string
	}{
		"header":               {path: "/ingest", hdrs: []string{"X-Key", "cust-42"}, key: "<cust-42>", logs: "/ingest"},
		"path segment escaped": {path: "/ingest/cust%2D42/x", key: "<cust-42>", logs: "/ingest/{key}/x"},
		"query, plus":          {path: "/ingest?k=a+b%21", key: "<a b!>", logs: "/ingest"},
		"header first":         {path: "/ingest/other", hdrs: []string{"X-Key", "h"}, key: "<h>", logs: "/ingest/{key}"},
		"invalid path key":     {path: "/ingest/a%2Fb", key: nil, logs: "/ingest/{key}"},
		"no key":               {path: "/ingest", key: nil, logs: "/ingest"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			sink := &lineSink{}
			opts := Options{AccessLog: sink, AccessKey: func(dst, key []byte) []byte {
				return append(append(append(dst, '<'), key...), '>')
			}}
			r := startReplica(t, "r0")
			_, addr := startProxyOpts(t, opts, func(c *Config) { c.ReplicaSets[0].Key = sources }, r)
			newClient(addr).do(t, "POST", tc.path, "x", tc.hdrs...)
			lines := sink.lines(t)
			if len(lines) != 1 {
				t.Fatalf("%d lines", len(lines))
			}
			if got := lines[0]["key"]; got != tc.key {
				t.Errorf("key = %v, want %v (%v)", got, tc.key, lines[0])
			}
			if got := lines[0]["path"]; got != tc.logs {
				t.Errorf("path = %v, want %v", got, tc.logs)
			}
		})
	}
}

// TestAccessLogHMAC: the line's key is HMAC-SHA256(secret, key) cut to 16
// hex digits, through logging's real access log.
func TestAccessLogHMAC(t *testing.T) {
	secret := "0123456789abcdef0123456789abcdef"
	t.Setenv(logging.KeySecretEnv, secret)
	var out lineSink
	cfg := logging.DefaultConfig()
	cfg.AccessLog = true
	cfg.Access.Key = logging.KeyHMAC
	logs, err := logging.New(cfg, &bytes.Buffer{}, &out)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, "r0")
	_, addr := startProxyOpts(t, Options{AccessLog: logs.Access, AccessKey: logs.Access.KeyAppender()}, nil, r)
	newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "customer-42")
	logs.Close()
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("customer-42"))
	want := hex.EncodeToString(mac.Sum(nil))[:16]
	if lines := out.lines(t); len(lines) != 1 || lines[0]["key"] != want {
		t.Fatalf("lines %v: want one with key %s", lines, want)
	}
}

// TestAccessLineHostile: whatever a client puts in the path, the host or
// the request id — quotes, backslashes, control characters, invalid
// UTF-8, JavaScript line terminators, huge values — the line is one valid
// JSON object whose values are the client's (cut, invalid bytes replaced).
func TestAccessLineHostile(t *testing.T) {
	cfg := testConfig()
	cfg.ReplicaSets[0].Replicas = 1
	p, err := New(cfg, Options{Coalesce: -1, AccessLog: &lineSink{}})
	if err != nil {
		t.Fatal(err)
	}
	rs := p.routes.Load().byName["orders"]
	hostile := []string{
		`/a"b\c`, "/ctl\x00\x01\x1f\x7f\t\r\n", "/bad\xff\xfe\xc3(", "/js\u2028\u2029", "/ok/é/😀",
		"/" + strings.Repeat("x", maxLogPath+10), "/" + strings.Repeat("é", maxLogPath),
	}
	for _, h := range hostile {
		var ctx fasthttp.RequestCtx
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 5}, nil)
		ctx.Request.SetRequestURIBytes([]byte(h))
		ctx.Request.Header.SetHost("host" + h)
		ctx.Request.Header.Set("X-Request-Id", "id"+h)
		ctx.Response.SetBodyString("ok")
		l := &accessLine{}
		r := request{ctx: &ctx, rs: rs, start: time.Now(), named: "rep\"\x01", tried: 1, upstream: time.Millisecond}
		line := p.appendAccess(l, &r, "", 200)
		if !bytes.HasSuffix(line, []byte("}\n")) || bytes.Count(line, []byte("\n")) != 1 {
			t.Fatalf("%q: not one line: %q", h, line)
		}
		if !json.Valid(line) {
			t.Fatalf("%q: invalid JSON: %q", h, line)
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatal(err)
		}
		path := string(ctx.URI().PathOriginal())
		check := func(field, raw string, max int) {
			t.Helper()
			got := m[field].(string)
			want := strings.ToValidUTF8(raw, "\uFFFD")
			if len(raw) > max {
				if !strings.HasPrefix(want, got) || len(got) > max || len(got) < max-3 {
					t.Errorf("%s: %d bytes %q..., want the first %d bytes of %q...", field, len(got), got[:20], max, want[:20])
				}
				return
			}
			// Each invalid byte is its own replacement character.
			if utf8.ValidString(raw) && got != want || !utf8.ValidString(got) || !utf8.ValidString(raw) && !strings.Contains(got, "\uFFFD") {
				t.Errorf("%s = %q, want %q", field, got, want)
			}
		}
		check("path", path, maxLogPath)
		// fasthttp turns CR and LF in header values into spaces.
		check("host", string(ctx.Request.Header.Host()), maxLogHost)
		check("request_id", string(ctx.Request.Header.Peek("X-Request-Id")), maxLogRequestID)
		if m["replica"] != "rep\"\x01" || m["client"] != "192.0.2.1:5" {
			t.Errorf("replica %q, client %q", m["replica"], m["client"])
		}
		if _, cut := m["path_truncated"]; cut != (len(path) > maxLogPath) {
			t.Errorf("path_truncated %v for a path of %d bytes", m["path_truncated"], len(path))
		}
	}
}

func TestRedactKeySegments(t *testing.T) {
	seg := func(n ...int) []keySource {
		out := []keySource{{kind: keyHeader, name: []byte("X-Key")}}
		for _, i := range n {
			out = append(out, keySource{kind: keyPathSegment, segment: i})
		}
		return out
	}
	cases := []struct {
		path    string
		sources []keySource
		want    string
	}{
		{"/ingest/abc", seg(2), "/ingest/{key}"},
		{"/ingest/abc/x", seg(2), "/ingest/{key}/x"},
		{"/ingest/", seg(2), "/ingest/"},
		{"/ingest", seg(2), "/ingest"},
		{"/a/b/c", seg(1, 3), "/{key}/b/{key}"},
		{"/a/b", seg(), "/a/b"},
		{"//a", seg(2), "//{key}"},
		{"*", seg(1), "*"},
	}
	for _, tc := range cases {
		if got := string(redactKeySegments(nil, []byte(tc.path), tc.sources)); got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

// TestCanonicalKeyMatchesRouting: the key the log shows is the one routing
// hashed: HashKey of it is rs.key's hash, for every source and escape.
func TestCanonicalKeyMatchesRouting(t *testing.T) {
	cfg := testConfig()
	cfg.ReplicaSets[0].Replicas = 1
	cfg.ReplicaSets[0].Key = []balancer.KeySource{{Header: "X-Key"}, {PathSegment: 2}, {Query: "k"}}
	p, err := New(cfg, Options{Coalesce: -1})
	if err != nil {
		t.Fatal(err)
	}
	rs := p.routes.Load().byName["orders"]
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", "-", "%41", "%c3%a9", "+", "%2B", "%20", "é", "~", "%2f", "%", "%zz", ".", "..", "&", "="}
	gen := func() string {
		var b strings.Builder
		for range 1 + rng.IntN(5) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	seen := map[balancer.KeyStatus]int{}
	for range 3000 {
		var req fasthttp.Request
		uri := "/ingest"
		switch rng.IntN(3) {
		case 0:
			req.Header.Set("X-Key", strings.ReplaceAll(gen(), "%", ""))
		case 1:
			uri = "/ingest/" + gen() + "/tail"
		default:
			uri = "/ingest?x=1&k=" + gen()
		}
		req.Header.DisableNormalizing()
		req.URI().DisablePathNormalizing = true
		req.SetRequestURI(uri)
		u := req.URI()
		path := u.PathOriginal()
		hash, st, _ := rs.key(&req.Header, path, u)
		seen[st]++
		key, ok := appendCanonicalKey(nil, rs, &req.Header, path, u)
		if ok != (st == balancer.KeyOK) {
			t.Fatalf("%s %q: canonical key ok=%v, routing status %v", uri, req.Header.Peek("X-Key"), ok, st)
		}
		if ok && balancer.HashKey(key) != hash {
			t.Fatalf("%s %q: logged key %q does not hash to the routing hash", uri, req.Header.Peek("X-Key"), key)
		}
	}
	if seen[balancer.KeyOK] < 100 || seen[balancer.KeyInvalid] < 10 {
		t.Fatalf("the generator covers too little: %v", seen)
	}
}
