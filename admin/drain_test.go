package admin

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeDrainer knows orders/{orders-0 (gossip), orders-1 (static),
// orders-2 (unreachable)} and records its calls.
type fakeDrainer struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeDrainer) Drain(set, replica string, drain bool) (string, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("%s/%s %v", set, replica, drain))
	f.mu.Unlock()
	if set != "orders" {
		return "", fmt.Errorf("%w %q", ErrUnknownSet, set)
	}
	switch replica {
	case "orders-0":
		return ScopeGossip, nil
	case "orders-1":
		return ScopeThisProxy, nil
	case "orders-2":
		return "", fmt.Errorf("%w: no live member advertises it", ErrUnreachable)
	}
	return "", fmt.Errorf("%w %q", ErrUnknownReplica, replica)
}

func noEnv(string) (string, bool) { return "", false }

func envWith(tok string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		if k == TokenEnv {
			return tok, true
		}
		return "", false
	}
}

func drainServer(t *testing.T, cfg Config, env func(string) (string, bool), d Drainer) string {
	t.Helper()
	s, err := New(cfg, Options{Gatherer: prometheus.NewPedanticRegistry(), Sets: testView(), Drainer: d, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.srv.Handler)
	t.Cleanup(ts.Close)
	return ts.URL
}

func do(t *testing.T, method, url, token string) (int, map[string]any) {
	t.Helper()
	code, b := doBody(t, method, url, token, "")
	var m map[string]any
	if err := json.Unmarshal([]byte(b), &m); err != nil {
		t.Fatalf("%s %s: %v: %s", method, url, err, b)
	}
	return code, m
}

func TestDrainEndpoints(t *testing.T) {
	d := &fakeDrainer{}
	base := drainServer(t, Config{Listen: "127.0.0.1:0"}, envWith("s3cret"), d)
	path := func(set, rep, action string) string {
		return base + "/v1/replica_sets/" + set + "/replicas/" + rep + "/" + action
	}
	for _, tc := range []struct {
		method, url, token string
		code               int
		want               map[string]any
		errHas             string
	}{
		{"POST", path("orders", "orders-0", "drain"), "", 401, nil, "bearer token"},
		{"POST", path("orders", "orders-0", "drain"), "wrong", 401, nil, "bearer token"},
		{"POST", path("orders", "orders-0", "undrain"), "s3cre", 401, nil, "bearer token"},
		{"GET", path("orders", "orders-0", "drain"), "s3cret", 405, nil, "use POST"},
		{"GET", path("orders", "orders-0", "undrain"), "", 405, nil, "use POST"},
		{"PUT", path("orders", "orders-0", "drain"), "s3cret", 405, nil, "use POST"},
		{"POST", path("nope", "orders-0", "drain"), "s3cret", 404, nil, `unknown replica set "nope"`},
		{"POST", path("orders", "orders-7", "undrain"), "s3cret", 404, nil, `has no replica "orders-7"`},
		{"POST", path("orders", "orders-2", "drain"), "s3cret", 409, nil, "not reachable by gossip"},
		{"POST", path("orders", "orders-0", "drain"), "s3cret", 202,
			map[string]any{"set": "orders", "replica": "orders-0", "action": "drain", "scope": "gossip"}, ""},
		{"POST", path("orders", "orders-1", "undrain"), "s3cret", 202,
			map[string]any{"set": "orders", "replica": "orders-1", "action": "undrain", "scope": "this proxy"}, ""},
	} {
		code, body := do(t, tc.method, tc.url, tc.token)
		name := tc.method + " " + strings.TrimPrefix(tc.url, base) + " token " + tc.token
		if code != tc.code {
			t.Errorf("%s: %d %v, want %d", name, code, body, tc.code)
			continue
		}
		if tc.errHas != "" {
			if msg, _ := body["error"].(string); !strings.Contains(msg, tc.errHas) {
				t.Errorf("%s: error %q, want it to contain %q", name, msg, tc.errHas)
			}
		}
		for k, v := range tc.want {
			if body[k] != v {
				t.Errorf("%s: %s = %v, want %v (body %v)", name, k, body[k], v, body)
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// Only authorized POSTs reach the drainer.
	if len(d.calls) != 5 {
		t.Fatalf("drainer calls %v, want 5", d.calls)
	}
}

func TestDrainToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := "/v1/replica_sets/orders/replicas/orders-0/drain"

	t.Run("file", func(t *testing.T) {
		base := drainServer(t, Config{Listen: "127.0.0.1:0", TokenFile: file}, noEnv, &fakeDrainer{})
		if code, _ := do(t, "POST", base+url, "from-file"); code != 202 {
			t.Fatalf("token from file: %d", code)
		}
		if code, _ := do(t, "POST", base+url, "from-env"); code != 401 {
			t.Fatalf("other token: %d", code)
		}
	})
	t.Run("env wins", func(t *testing.T) {
		base := drainServer(t, Config{Listen: "127.0.0.1:0", TokenFile: file}, envWith("from-env"), &fakeDrainer{})
		if code, _ := do(t, "POST", base+url, "from-env"); code != 202 {
			t.Fatalf("token from env: %d", code)
		}
		if code, _ := do(t, "POST", base+url, "from-file"); code != 401 {
			t.Fatalf("file token with env set: %d", code)
		}
	})
	t.Run("none", func(t *testing.T) {
		base := drainServer(t, Config{Listen: "127.0.0.1:0"}, noEnv, &fakeDrainer{})
		code, body := do(t, "POST", base+url, "anything")
		if code != 401 || !strings.Contains(body["error"].(string), "no admin token configured") {
			t.Fatalf("no token configured: %d %v", code, body)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		_, err := New(Config{Listen: "127.0.0.1:0", TokenFile: filepath.Join(dir, "nope")}, Options{Gatherer: prometheus.NewRegistry(), Env: noEnv})
		if err == nil || !strings.Contains(err.Error(), "token_file") {
			t.Fatalf("missing token file: %v", err)
		}
	})
	t.Run("empty file", func(t *testing.T) {
		empty := filepath.Join(dir, "empty")
		_ = os.WriteFile(empty, []byte(" \n"), 0o600)
		_, err := New(Config{Listen: "127.0.0.1:0", TokenFile: empty}, Options{Gatherer: prometheus.NewRegistry(), Env: noEnv})
		if err == nil || !strings.Contains(err.Error(), "is empty") {
			t.Fatalf("empty token file: %v", err)
		}
	})
}

func TestRefuseNonLoopbackWithoutToken(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, listen := range []string{"0.0.0.0:9901", ":9901", "10.1.2.3:9901", "[::]:9901"} {
		_, err := New(Config{Listen: listen}, Options{Gatherer: reg, Env: noEnv})
		if err == nil || !strings.Contains(err.Error(), "admin.listen") || !strings.Contains(err.Error(), "admin.token_file") {
			t.Errorf("listen %s without a token: %v, want a refusal naming admin.listen and the fix", listen, err)
		}
		if _, err := New(Config{Listen: listen}, Options{Gatherer: reg, Env: envWith("t")}); err != nil {
			t.Errorf("listen %s with a token: %v", listen, err)
		}
	}
	for _, listen := range []string{"127.0.0.1:9901", "localhost:9901", "[::1]:9901", ""} {
		if _, err := New(Config{Listen: listen}, Options{Gatherer: reg, Env: noEnv}); err != nil {
			t.Errorf("listen %q without a token: %v", listen, err)
		}
	}
}
