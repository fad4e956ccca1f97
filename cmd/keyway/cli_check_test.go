package main

import (
	"strings"
	"testing"

	"keyway/config"
	"keyway/internal/stacktest"
)

// The CLI clients pointed at the proxy listener instead of the admin API
// fail, saying so, instead of reading an answer as "no replica sets".
func TestCLIProxyListenerIsNotTheAdminAPI(t *testing.T) {
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
		{own.Proxy, own.Proxy + " answered like a keyway proxy listener, not the admin API: pass the admin address (admin.listen, default 127.0.0.1:9901)"},
		{relay.Proxy, relay.Proxy + " is not a keyway admin API: GET /v1/replica_sets answered HTTP 200"},
	} {
		for _, args := range [][]string{
			{"status"}, {"members"}, {"route", "--set", "orders", "--key", "k"}, {"runtime"}, {"runtime", "export"},
			{"plan", "--set", "orders", "--add", "orders-9"},
		} {
			args = append(args, "--admin", tc.addr)
			out, _, err := keywayCLI(t, args...)
			want := tc.want
			if args[0] != "status" {
				want, _, _ = strings.Cut(want, ": GET") // each names its own request
			}
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
