package admin

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every answer of the listener carries X-Keyway-Admin, plain-text and
// Prometheus answers included: the client's probe can rely on it.
func TestAdminHeaderOnEveryPath(t *testing.T) {
	base := startAPI(t, Options{Sets: testView(), Env: envWith("s3cret")})
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/v1/", 200},
		{"POST", "/v1/", 405},
		{"GET", "/healthz", 200},
		{"GET", "/readyz", 200},
		{"GET", "/metrics", 200},
		{"GET", "/ui", 200},
		{"GET", "/debug/pprof/", 200},
		{"GET", "/nope", 404},
		{"POST", "/v1/reload", 401},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || resp.Header.Get(AdminHeader) != "1" {
			t.Errorf("%s %s: %d with %s %q; want %d with %s: 1", tc.method, tc.path, resp.StatusCode, AdminHeader, resp.Header.Get(AdminHeader), tc.code, AdminHeader)
		}
		if tc.path == "/v1/" && tc.code == 200 && !strings.Contains(string(b), `"api": "keyway admin"`) {
			t.Errorf("GET /v1/: %s", b)
		}
	}
}

// The client probes once, without a token, then sends its calls; a probe
// answered 421 stops it before any token is sent.
func TestClientProbesOnce(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewRegistry(), Sets: testView(), Drainer: &fakeDrainer{}, Env: envWith("s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s %q", r.Method, r.URL.Path, r.Header.Get("Authorization")))
		mu.Unlock()
		s.srv.Handler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	c := &Client{Addr: srv.URL, Token: "s3cret"}
	if _, _, err := c.Sets(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Drain("orders", "orders-0", true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Set("orders"); err != nil {
		t.Fatal(err)
	}
	seenNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
	want := []string{`GET /v1/ ""`, `GET /v1/replica_sets ""`, `POST /v1/replica_sets/orders/replicas/orders-0/drain "Bearer s3cret"`, `GET /v1/replica_sets/orders ""`}
	if got := seenNow(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the server saw\n%q\nwant\n%q", got, want)
	}

	// A name the listener does not answer to: the probe's 421 is the error.
	mu.Lock()
	seen = nil
	mu.Unlock()
	c = &Client{Addr: strings.Replace(srv.URL, "127.0.0.1", "127.0.0.1.nip.io.invalid", 1), Token: "s3cret"}
	c.transport = &http.Transport{Dial: func(network, _ string) (net.Conn, error) {
		return net.Dial(network, strings.TrimPrefix(srv.URL, "http://"))
	}}
	_, _, err = c.Drain("orders", "orders-0", true)
	if err == nil || !strings.Contains(err.Error(), `does not answer to Host "127.0.0.1.nip.io.invalid:`) || !strings.Contains(err.Error(), "admin.allowed_hosts") || !strings.Contains(err.Error(), "HTTP 421") {
		t.Fatalf("Drain through a name the listener does not answer to: %v", err)
	}
	if got := seenNow(); len(got) != 1 || got[0] != `GET /v1/ ""` {
		t.Fatalf("the server saw %q; want only the probe", got)
	}
}
