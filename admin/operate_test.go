package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeOperator reloads successfully every other call and scales orders.
type fakeOperator struct {
	mu      sync.Mutex
	reloads int
	scaled  map[string]int
}

func (f *fakeOperator) Reload(source string) (ReloadResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloads++
	if f.reloads%2 == 0 {
		return ReloadResult{}, &ReloadError{File: "keyway.yaml", Problems: []string{"keyway.yaml:3: listen: changed", "keyway.yaml:9: replica_sets[0].name: bad"}}
	}
	return ReloadResult{Result: "success", File: "keyway.yaml", Changed: []string{"orders"}, Keys: []string{"replica_sets[0].retries.attempts"}}, nil
}

func (f *fakeOperator) SetDeclared(set string, n int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if set != "orders" {
		return 0, fmt.Errorf("%w %q", ErrUnknownSet, set)
	}
	prev := f.scaled[set]
	f.scaled[set] = n
	return prev, nil
}

func doBody(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q, body %s", method, url, ct, b)
	}
	return resp.StatusCode, string(b)
}

func TestReloadAndScaleEndpoints(t *testing.T) {
	op := &fakeOperator{scaled: map[string]int{"orders": 2}}
	s, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewPedanticRegistry(), Sets: testView(), Reloader: op, Scaler: op, Env: envWith("s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	base := serveHandler(t, s)
	for _, tc := range []struct {
		method, path, token, body string
		code                      int
		has                       []string
	}{
		{"POST", "/v1/reload", "", "", 401, []string{"bearer token"}},
		{"GET", "/v1/reload", "s3cret", "", 405, []string{"use POST"}},
		{"POST", "/v1/reload", "s3cret", "", 200, []string{`"result": "success"`, `"changed": [`, `"replica_sets[0].retries.attempts"`}},
		{"POST", "/v1/reload", "s3cret", "", 422, []string{"not applied; the running configuration stays", `"problems": [`, "listen: changed", "replica_sets[0].name: bad"}},
		{"PATCH", "/v1/replica_sets/orders", "", `{"replicas": 3}`, 401, []string{"bearer token"}},
		{"PATCH", "/v1/replica_sets/orders", "wrong", `{"replicas": 3}`, 401, []string{"bearer token"}},
		{"PATCH", "/v1/replica_sets/nope", "s3cret", `{"replicas": 3}`, 404, []string{`unknown replica set \"nope\"`, "known sets: orders"}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{"replicas": 0}`, 400, []string{"replicas: 0 is out of range"}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{"replica": 3}`, 400, []string{`unknown field \"replica\"`}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{}`, 400, []string{`\"replicas\" is missing`}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `not json`, 400, []string{"want JSON"}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{"replicas": 4}`, 200, []string{`"replicas": 4`, `"previous": 2`, `"scope": "this proxy"`}},
	} {
		code, body := doBody(t, tc.method, base+tc.path, tc.token, tc.body)
		if code != tc.code {
			t.Errorf("%s %s (token %q, body %s): %d %s, want %d", tc.method, tc.path, tc.token, tc.body, code, body, tc.code)
			continue
		}
		for _, h := range tc.has {
			if !strings.Contains(body, h) {
				t.Errorf("%s %s: body %s lacks %s", tc.method, tc.path, body, h)
			}
		}
	}
	if op.scaled["orders"] != 4 || op.reloads != 2 {
		t.Fatalf("operator saw %d reloads and orders=%d, want 2 and 4", op.reloads, op.scaled["orders"])
	}
	// Without a Reloader (no configuration file): 501.
	s2, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewPedanticRegistry(), Env: envWith("s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := doBody(t, "POST", serveHandler(t, s2)+"/v1/reload", "s3cret", ""); code != 501 || !strings.Contains(body, "no configuration file") {
		t.Fatalf("reload without a reloader: %d %s", code, body)
	}
}

func TestReloadToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Listen: "127.0.0.1:0", TokenFile: file}, Options{Gatherer: prometheus.NewPedanticRegistry(), Drainer: &fakeDrainer{}, Env: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	base := serveHandler(t, s)
	drain := base + "/v1/replica_sets/orders/replicas/orders-0/drain"
	if code, _ := doBody(t, "POST", drain, "one", ""); code != 202 {
		t.Fatalf("first token: %d", code)
	}
	if err := os.WriteFile(file, []byte("two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadToken(file); err != nil {
		t.Fatal(err)
	}
	if code, _ := doBody(t, "POST", drain, "one", ""); code != 401 {
		t.Fatalf("old token after rotation: %d, want 401", code)
	}
	if code, _ := doBody(t, "POST", drain, "two", ""); code != 202 {
		t.Fatalf("new token: %d, want 202", code)
	}
	// A missing file keeps the token in use.
	if err := s.ReloadToken(filepath.Join(dir, "gone")); err == nil || !strings.Contains(err.Error(), "admin.token_file") {
		t.Fatalf("ReloadToken(missing) = %v", err)
	}
	if code, _ := doBody(t, "POST", drain, "two", ""); code != 202 {
		t.Fatalf("token after a failed rotation: %d, want 202", code)
	}
	var re *ReloadError
	if !errors.As(error(&ReloadError{File: "f", Problems: []string{"a"}}), &re) || !strings.Contains(re.Error(), "1 problem)") {
		t.Fatalf("ReloadError text: %v", re)
	}
}

func serveHandler(t *testing.T, s *Server) string {
	t.Helper()
	ts := httptest.NewServer(s.srv.Handler)
	t.Cleanup(ts.Close)
	return ts.URL
}

// CheckToken follows New's rules: the environment first, then the file;
// no token at all is refused only off loopback. Nothing listens here.
func TestCheckToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	off, err := New(Config{Listen: "10.1.2.3:9901", TokenFile: file}, Options{Gatherer: prometheus.NewPedanticRegistry(), Env: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.CheckToken(file); err != nil {
		t.Fatalf("CheckToken(file) = %v", err)
	}
	if err := off.CheckToken(""); err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("CheckToken(no token) off loopback = %v, want a refusal", err)
	}
	if err := off.CheckToken(filepath.Join(dir, "gone")); err == nil || !strings.Contains(err.Error(), "admin.token_file") {
		t.Fatalf("CheckToken(missing file) = %v", err)
	}
	env, err := New(Config{Listen: "10.1.2.3:9901"}, Options{Gatherer: prometheus.NewPedanticRegistry(), Env: envWith("e")})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.CheckToken(filepath.Join(dir, "gone")); err != nil {
		t.Fatalf("with KEYWAY_ADMIN_TOKEN set, a missing token file = %v, want nil (the environment wins)", err)
	}
	lo, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewPedanticRegistry(), Env: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	if err := lo.CheckToken(""); err != nil {
		t.Fatalf("no token on loopback = %v, want nil", err)
	}
}
