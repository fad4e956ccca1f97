package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
)

// The CLI clients pointed at the proxy listener instead of the admin API
// fail, saying so, instead of reading an answer as "no replica sets".
func TestCLIProxyListenerIsNotTheAdminAPI(t *testing.T) {
	slow.Skip(t)
	// A proxy whose only set is under /ingest answers /v1/... with its own
	// JSON error (404, no set matches).
	cfg, err := config.LoadBytes("ingest.yaml", []byte(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
replica_sets:
  - name: orders
    match: {path_prefix: /ingest}
    static: [{name: orders-0, addr: "127.0.0.1:9"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	own := stacktest.StartProxy(t, cfg, stacktest.Opts{})
	// A proxy whose set takes every path relays a replica's 200 JSON.
	relay := stacktest.StartOrders(t)

	for _, tc := range []struct {
		addr, want string
	}{
		{own.Proxy, own.Proxy + " answered like a keyway proxy listener, not the admin API, and nothing else was sent to it: pass the admin address (admin.listen, default 127.0.0.1:9901)"},
		{relay.Proxy, relay.Proxy + " is not a keyway admin API: GET /v1/ answered HTTP 200"},
	} {
		for _, args := range [][]string{
			{"status"}, {"members"}, {"route", "--set", "orders", "--key", "k"}, {"runtime"}, {"runtime", "export"},
			{"plan", "--set", "orders", "--add", "orders-9"},
		} {
			args = append(args, "--admin", tc.addr)
			out, _, err := keywayCLI(t, args...)
			want := tc.want // each command's first request is the probe, GET /v1/
			if err == nil || !strings.Contains(err.Error(), want) || exitCode(err) != exitRuntime || out != "" {
				t.Errorf("%v: %q, %v (exit %d); want exit 1 saying %q", args, out, err, exitCode(err), want)
			}
		}
	}
	// The admin API itself still answers.
	if out, _, err := keywayCLI(t, "status", "--admin", own.Admin); err != nil || !strings.Contains(out, "orders") {
		t.Fatalf("status against the admin API: %q, %v", out, err)
	}
}

// Pointed at a proxy's traffic port, every command that talks to the admin
// API sends one GET without a token (the probe, GET /v1/) and nothing
// else: the replica behind the proxy sees no token, no actor, no body and
// no mutation, and the command fails saying the address is not the admin
// API.
func TestCLISendsOnlyTheProbeToATrafficPort(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s auth=%q actor=%q body=%q", r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get(admin.ActorHeader), b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"accepted": true}`) // a pipeline's answer, logged by the pipeline
	}))
	t.Cleanup(replica.Close)
	seenNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	cfg, err := config.LoadBytes("relay.yaml", []byte(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "`+strings.TrimPrefix(replica.URL, "http://")+`"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	px := stacktest.StartProxy(t, cfg, stacktest.Opts{})
	poll.Until(t, 10*time.Second, "the proxy relaying to the replica", func() bool {
		resp, err := http.Get("http://" + px.Proxy + "/warm-up")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	spec := filepath.Join(dir, "users.json")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spec, []byte(`{"name": "users", "match": {"path_prefix": "/users"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(admin.TokenEnv, "")
	tok := []string{"--token-file", tokenFile}
	for _, args := range [][]string{
		append([]string{"drain", "--set", "orders", "--replica", "orders-0"}, tok...),
		append([]string{"undrain", "--set", "orders", "--replica", "orders-0"}, tok...),
		append([]string{"scale", "--set", "orders", "--replicas", "5"}, tok...),
		append([]string{"stop", "--set", "orders"}, tok...),
		append([]string{"start", "--set", "orders"}, tok...),
		append([]string{"delete", "--set", "orders"}, tok...),
		append([]string{"create", "-f", spec}, tok...),
		append([]string{"reload"}, tok...),
		append([]string{"repair", "--set", "orders"}, tok...),
		append([]string{"restart", "--set", "orders"}, tok...),
		append([]string{"runtime", "clear", "--set", "orders"}, tok...),
		{"status"}, {"members"}, {"route", "--set", "orders", "--key", "k"}, {"plan", "--set", "orders", "--add", "orders-9"},
		{"runtime"}, {"runtime", "export"},
	} {
		before := len(seenNow())
		args = append(args, "--admin", px.Proxy)
		out, _, err := keywayCLI(t, args...)
		want := px.Proxy + " is not a keyway admin API: GET /v1/ answered HTTP 200, application/json"
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "and nothing else was sent to it: pass the admin address (admin.listen, default 127.0.0.1:9901) with --admin") ||
			exitCode(err) != exitRuntime || out != "" {
			t.Errorf("%v: %q, %v (exit %d); want exit 1 saying %q", args, out, err, exitCode(err), want)
		}
		got := seenNow()[before:]
		if len(got) != 1 || got[0] != `GET /v1/ auth="" actor="" body=""` {
			t.Errorf("%v: the replica behind the traffic port saw %q; want one GET /v1/ without a token, actor or body", args, got)
		}
	}
}
