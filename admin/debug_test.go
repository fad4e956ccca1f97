package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// serveRec sends one request to the server's handler (no listener: the
// addresses below are never bound) and returns the status, the
// Content-Type and the body.
func serveRec(t *testing.T, s *Server, method, path, token string) (int, string, string) {
	t.Helper()
	req := httptest.NewRequest(method, "http://localhost"+path, nil) // a Host the listener answers to
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	s.srv.Handler.ServeHTTP(rec, req)
	return rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()
}

func newDebugServer(t *testing.T, cfg Config, token string) *Server {
	t.Helper()
	env := func(string) (string, bool) { return token, token != "" }
	s, err := New(cfg, Options{Gatherer: prometheus.NewRegistry(), Config: &fakeView{}, Sets: &fakeView{}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// debugPaths are the endpoints admin.debug guards.
var debugPaths = []string{"/debug/pprof/", "/debug/pprof/cmdline", "/v1/config"}

func TestDebugOpenOnLoopback(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:9901", "[::1]:9901", "localhost:9901"} {
		s := newDebugServer(t, Config{Listen: listen, Debug: DebugAuto}, "")
		for _, p := range debugPaths {
			if code, _, body := serveRec(t, s, "GET", p, ""); code != http.StatusOK {
				t.Errorf("listen %s: GET %s without a token = %d %s, want 200", listen, p, code, body)
			}
		}
	}
}

func TestDebugNeedsTokenOffLoopback(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:9901", ":9901", "10.1.2.3:9901"} {
		for _, debug := range []string{"", DebugAuto} {
			s := newDebugServer(t, Config{Listen: listen, Debug: debug}, "s3cret")
			for _, p := range debugPaths {
				for _, tok := range []string{"", "wrong"} {
					code, ctype, body := serveRec(t, s, "GET", p, tok)
					if code != http.StatusUnauthorized || ctype != "application/json" {
						t.Fatalf("listen %s debug %q: GET %s with token %q = %d %s %s, want 401 JSON", listen, debug, p, tok, code, ctype, body)
					}
					var e ErrorBody
					if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e.Error, "admin.listen") || !strings.Contains(e.Error, "Bearer") {
						t.Errorf("401 body %s: want an error naming admin.listen and the bearer token", body)
					}
				}
				if code, _, body := serveRec(t, s, "GET", p, "s3cret"); code != http.StatusOK {
					t.Errorf("listen %s: GET %s with the token = %d %s, want 200", listen, p, code, body)
				}
			}
			// The routing state stays readable without the token.
			if code, _, body := serveRec(t, s, "GET", "/v1/replica_sets", ""); code != http.StatusOK {
				t.Errorf("GET /v1/replica_sets without a token = %d %s, want 200", code, body)
			}
			if code, _, _ := serveRec(t, s, "GET", "/metrics", ""); code != http.StatusOK {
				t.Errorf("GET /metrics without a token = %d, want 200", code)
			}
		}
	}
}

func TestDebugModes(t *testing.T) {
	// token: the token on loopback too.
	s := newDebugServer(t, Config{Listen: "127.0.0.1:9901", Debug: DebugToken}, "s3cret")
	for _, p := range debugPaths {
		if code, _, body := serveRec(t, s, "GET", p, ""); code != http.StatusUnauthorized || !strings.Contains(body, "admin.debug is token") {
			t.Errorf("debug token: GET %s = %d %s, want 401 naming admin.debug", p, code, body)
		}
		if code, _, _ := serveRec(t, s, "GET", p, "s3cret"); code != http.StatusOK {
			t.Errorf("debug token: GET %s with the token = %d, want 200", p, code)
		}
	}
	// open: nobody is asked, even off loopback.
	s = newDebugServer(t, Config{Listen: "0.0.0.0:9901", Debug: DebugOpen}, "s3cret")
	for _, p := range debugPaths {
		if code, _, _ := serveRec(t, s, "GET", p, ""); code != http.StatusOK {
			t.Errorf("debug open: GET %s = %d, want 200", p, code)
		}
	}
	// off: not served at all, even with the token.
	s = newDebugServer(t, Config{Listen: "127.0.0.1:9901", Debug: DebugOff}, "s3cret")
	for _, p := range debugPaths {
		if code, ctype, body := serveRec(t, s, "GET", p, "s3cret"); code != http.StatusNotFound || ctype != "application/json" || !strings.Contains(body, "admin.debug is off") {
			t.Errorf("debug off: GET %s = %d %s %s, want 404 JSON naming admin.debug", p, code, ctype, body)
		}
	}
	// token without a token configured: refused at start, naming the key.
	_, err := New(Config{Listen: "127.0.0.1:9901", Debug: DebugToken}, Options{Gatherer: prometheus.NewRegistry(), Env: func(string) (string, bool) { return "", false }})
	if err == nil || !strings.Contains(err.Error(), "admin.debug") {
		t.Errorf("New(debug token, no token) = %v, want an error naming admin.debug", err)
	}
	if err := (Config{Listen: "127.0.0.1:9901", Debug: "yes"}).Validate(); err == nil || !strings.HasPrefix(err.Error(), "debug: ") || !strings.Contains(err.Error(), `"yes"`) {
		t.Errorf("Validate(debug yes) = %v, want an error naming debug and the value", err)
	}
}

// TestUnknownPathsAnswerJSON: every path of the admin listener that
// serves nothing answers a JSON 404, and a wrong method a JSON 405 with
// Allow, like the API.
func TestUnknownPathsAnswerJSON(t *testing.T) {
	s := newDebugServer(t, Config{Listen: "127.0.0.1:9901"}, "")
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/", 404}, {"GET", "/foo", 404}, {"GET", "/v2/sets", 404}, {"GET", "/v1/nope", 404},
		{"GET", "/ui/nope.js", 404}, {"GET", "/ui/a/b", 404}, {"POST", "/foo", 404},
		{"POST", "/metrics", 405}, {"DELETE", "/healthz", 405}, {"POST", "/readyz", 405},
		{"POST", "/ui", 405}, {"PUT", "/ui/app.js", 405}, {"POST", "/debug/pprof/cmdline", 405},
	} {
		code, ctype, body := serveRec(t, s, tc.method, tc.path, "")
		var e ErrorBody
		if code != tc.code || ctype != "application/json" || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
			t.Errorf("%s %s = %d %q %s, want %d with a JSON error", tc.method, tc.path, code, ctype, body, tc.code)
		}
	}
	// The endpoints themselves still answer as before.
	for _, p := range []string{"/metrics", "/healthz", "/readyz", "/ui", "/ui/app.js", "/debug/pprof/"} {
		if code, _, _ := serveRec(t, s, "GET", p, ""); code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", p, code)
		}
	}
	rec := httptest.NewRecorder()
	s.srv.Handler.ServeHTTP(rec, httptest.NewRequest("POST", "http://localhost/metrics", nil))
	if got := rec.Header().Get("Allow"); got != "GET, HEAD" {
		t.Errorf("POST /metrics Allow = %q, want GET, HEAD", got)
	}
}
