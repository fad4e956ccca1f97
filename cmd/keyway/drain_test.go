package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"keyway/admin"
	"keyway/internal/stacktest"
)

// keyway drain and undrain against a proxy with static replicas: the drain
// holds the replica out of rotation on this proxy (scope "this proxy"),
// with reason admin, and its keys go elsewhere; undrain brings it back.
func TestCLIDrainUndrainStatic(t *testing.T) {
	t.Setenv(admin.TokenEnv, "s3cret")
	st := stacktest.StartOrders(t)

	// Without a token (an empty env and no file) the CLI refuses.
	t.Setenv(admin.TokenEnv, "")
	if _, _, err := keywayCLI(t, "drain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-1"); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("drain without a token: %v", err)
	}
	// A wrong token is the API's 401.
	bad := filepath.Join(t.TempDir(), "bad")
	_ = os.WriteFile(bad, []byte("nope\n"), 0o600)
	if _, _, err := keywayCLI(t, "drain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-1", "--token-file", bad); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("drain with a wrong token: %v", err)
	}
	// Unknown replica: the API's 404.
	t.Setenv(admin.TokenEnv, "s3cret")
	if _, _, err := keywayCLI(t, "drain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-9"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Fatalf("drain of an unknown replica: %v", err)
	}

	keys := []string{}
	for i := range 200 {
		keys = append(keys, "k"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	out, _, err := keywayCLI(t, "drain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "drain orders/orders-1: accepted, scope this proxy only") {
		t.Fatalf("drain output %q", out)
	}
	stacktest.WaitRotation(t, st.Admin, "orders", 2)
	rs := replicaStatus(t, st.Admin, "orders-1")
	if rs.InRotation || !strings.Contains(rs.Reason, "admin") {
		t.Fatalf("after drain: %+v", rs)
	}
	for _, k := range keys {
		if got := st.Send(t, k); got == "orders-1" {
			t.Fatalf("key %s went to the drained replica", k)
		}
	}

	tok := filepath.Join(t.TempDir(), "token")
	_ = os.WriteFile(tok, []byte("s3cret\n"), 0o600)
	t.Setenv(admin.TokenEnv, "")
	out, _, err = keywayCLI(t, "undrain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-1", "--token-file", tok, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res admin.DrainResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res != (admin.DrainResult{Set: "orders", Replica: "orders-1", Action: "undrain", Scope: "this proxy"}) {
		t.Fatalf("undrain --json: %q %v", out, err)
	}
	stacktest.WaitRotation(t, st.Admin, "orders", 3)
	seen := false
	for _, k := range keys {
		seen = seen || st.Send(t, k) == "orders-1"
	}
	if !seen {
		t.Fatal("no key went to orders-1 after undrain")
	}

	// The audit trail has both actions.
	resp, err := http.Get("http://" + st.Admin + "/v1/events?kind=admin_action")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var evs struct {
		Events []map[string]any `json:"events"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&evs); err != nil {
		t.Fatal(err)
	}
	if len(evs.Events) != 2 {
		t.Fatalf("admin_action events: %v", evs.Events)
	}
}

func replicaStatus(t *testing.T, adminAddr, name string) admin.ReplicaStatus {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/v1/replica_sets/orders")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st admin.SetStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Replicas {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no replica %s in %+v", name, st)
	return admin.ReplicaStatus{}
}
