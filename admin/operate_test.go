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

// fakeOperator reloads successfully every other call, and makes run-time
// changes of the set orders (declared 2, one replica running).
type fakeOperator struct {
	mu       sync.Mutex
	reloads  int
	scaled   map[string]int
	stopped  map[string]bool
	created  []string
	who      []string
	version  uint64
	problems []string
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

func (f *fakeOperator) change(set, action string, who Actor) SetChange {
	f.version++
	f.who = append(f.who, who.String())
	return SetChange{Set: set, Action: action, Version: f.version, By: who.String(), Via: "proxy-a", Scope: ScopeFleet}
}

func (f *fakeOperator) CreateSet(spec []byte, w Write) (SetChange, error) {
	who := w.Who
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.Contains(string(spec), "bad") {
		return SetChange{}, &SpecError{Problems: []string{"request body:1:2: replicas: must be between 1 and 1000, got 0"}}
	}
	if strings.Contains(string(spec), `"orders"`) {
		return SetChange{}, fmt.Errorf("%w: %q", ErrSetExists, "orders")
	}
	f.created = append(f.created, string(spec))
	return f.change("users", "create", who), nil
}

func (f *fakeOperator) PatchSet(set string, p SetPatch, w Write) (SetChange, error) {
	who := w.Who
	f.mu.Lock()
	defer f.mu.Unlock()
	if set != "orders" {
		return SetChange{}, fmt.Errorf("%w %q", ErrUnknownSet, set)
	}
	c := f.change(set, "scale", who)
	if p.Replicas != nil {
		prev := f.scaled[set]
		f.scaled[set] = *p.Replicas
		c.Replicas, c.Previous = p.Replicas, &prev
	}
	if p.Stop != nil {
		f.stopped[set] = *p.Stop
		c.Stopped = p.Stop
	}
	return c, nil
}

func (f *fakeOperator) DeleteSet(set string, w Write) (SetChange, error) {
	who := w.Who
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case set != "orders":
		return SetChange{}, fmt.Errorf("%w %q", ErrUnknownSet, set)
	case !f.stopped[set]:
		return SetChange{}, &InUseError{Set: set, Replicas: []string{"orders-0 (ready)"}}
	}
	return f.change(set, "delete", who), nil
}

func (f *fakeOperator) ClearRuntime(set string, w Write) (SetChange, error) {
	who := w.Who
	f.mu.Lock()
	defer f.mu.Unlock()
	if set != "orders" {
		return SetChange{}, fmt.Errorf("%w: %q", ErrNoRuntimeState, set)
	}
	return f.change(set, "clear", who), nil
}

func (f *fakeOperator) Runtime() RuntimeStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return RuntimeStatus{Digest: "abc", Synced: true, Records: []RuntimeRecord{{Set: "orders", Version: f.version, Action: "stop"}}}
}

func (f *fakeOperator) Export() ([]byte, error) {
	return []byte("replica_sets:\n  - name: orders\n"), nil
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

func TestReloadAndSetEndpoints(t *testing.T) {
	op := &fakeOperator{scaled: map[string]int{"orders": 2}, stopped: map[string]bool{}}
	s, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewPedanticRegistry(), Sets: testView(), Reloader: op, SetAdmin: op, Env: envWith("s3cret")})
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
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{"replica": 3}`, 400, []string{`unknown key \"replica\"`}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{}`, 400, []string{"nothing to change", `{\"stop\": true}`}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `not json`, 400, []string{"body: send"}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{"replicas": 4}`, 200, []string{`"replicas": 4`, `"previous": 2`, `"scope": "fleet"`, `"by": "anonymous (127.0.0.1:`}},
		{"DELETE", "/v1/replica_sets/orders", "s3cret", "", 400, []string{"still has replicas running or draining", "orders-0 (ready)", "keyway stop --set orders"}},
		{"PATCH", "/v1/replica_sets/orders", "s3cret", `{"stop": true}`, 200, []string{`"stopped": true`}},
		{"DELETE", "/v1/replica_sets/orders", "", "", 401, []string{"bearer token"}},
		{"DELETE", "/v1/replica_sets/nope", "s3cret", "", 404, []string{"unknown replica set"}},
		{"DELETE", "/v1/replica_sets/orders", "s3cret", "", 200, []string{`"action": "delete"`}},
		{"POST", "/v1/replica_sets", "", `{"name": "users"}`, 401, []string{"bearer token"}},
		{"POST", "/v1/replica_sets", "s3cret", `{"name": "users", "replicas": "bad"}`, 400, []string{"definition is invalid", "replicas: must be between"}},
		{"POST", "/v1/replica_sets", "s3cret", `{"name": "orders"}`, 409, []string{"already exists"}},
		{"POST", "/v1/replica_sets", "s3cret", `{"name": "users"}`, 201, []string{`"action": "create"`, `"set": "users"`}},
		{"PUT", "/v1/replica_sets", "s3cret", ``, 405, []string{"POST a set definition"}},
		{"GET", "/v1/runtime", "", "", 200, []string{`"digest": "abc"`, `"records": [`, `"problems": []`}},
		{"DELETE", "/v1/runtime/nope", "s3cret", "", 404, []string{"no run-time state"}},
		{"DELETE", "/v1/runtime/orders", "s3cret", "", 200, []string{`"action": "clear"`}},
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
	if op.scaled["orders"] != 4 || op.reloads != 2 || len(op.created) != 1 {
		t.Fatalf("operator saw %d reloads, orders=%d, created %v; want 2, 4, users", op.reloads, op.scaled["orders"], op.created)
	}
	// The actor header names the caller, at most 128 characters of it.
	req, _ := http.NewRequest("PATCH", base+"/v1/replica_sets/orders", strings.NewReader(`{"stop": false}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set(ActorHeader, "alice@build-7"+strings.Repeat("x", 200))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if last := op.who[len(op.who)-1]; !strings.HasPrefix(last, "alice@build-7"+strings.Repeat("x", 115)+" (127.0.0.1:") {
		t.Fatalf("actor %q", last)
	}
	// The export is YAML.
	resp, err = http.Get(base + "/v1/runtime/export")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/yaml" || !strings.HasPrefix(string(b), "replica_sets:") {
		t.Fatalf("export: %s %q", resp.Header.Get("Content-Type"), b)
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
