package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/internal/poll"
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
	// A wrong token is the API's 401, and the CLI names its flag.
	bad := filepath.Join(t.TempDir(), "bad")
	_ = os.WriteFile(bad, []byte("nope\n"), 0o600)
	_, _, err := keywayCLI(t, "drain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-1", "--token-file", bad)
	for _, want := range []string{"missing or wrong bearer token (HTTP 401)", "the token sent was refused", "with --token-file FILE or set " + admin.TokenEnv} {
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Authorization:") {
			t.Fatalf("drain with a wrong token: %v; want an error saying %q, without the HTTP-level advice", err, want)
		}
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

// keyway drain --wait returns once no request is in flight to the
// replica, printing its progress, and fails when that does not happen in
// time.
func TestCLIDrainWait(t *testing.T) {
	t.Setenv(admin.TokenEnv, "s3cret")
	reps := []*stacktest.Replica{stacktest.StartReplica(t, "orders-0"), stacktest.StartReplica(t, "orders-1")}
	yml := "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nlog: {level: warn}\nreplica_sets:\n  - name: orders\n    replicas: 2\n    timeouts: {request: 30s}\n    static:\n"
	for _, r := range reps {
		yml += "      - {name: " + r.Name + ", addr: \"" + r.Addr + "\"}\n"
	}
	cfg, err := config.LoadBytes("drain.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	st := stacktest.StartProxy(t, cfg, stacktest.Opts{})
	key := ""
	for i := 0; key == ""; i++ {
		var ex admin.RouteExplain
		k := "k" + strings.Repeat("x", i)
		stacktest.GetJSON(t, "http://"+st.Admin+"/v1/route?set=orders&key="+k, &ex)
		if ex.Pick == "orders-1" {
			key = k
		}
	}
	// A request that hangs at orders-1 until the test releases it.
	hung := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+st.Proxy+"/x", nil)
		req.Header.Set("X-Key", key)
		req.Header.Set("X-Hang", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			hung <- 0
			return
		}
		resp.Body.Close()
		hung <- resp.StatusCode
	}()
	poll.Until(t, 10*time.Second, "the request to hang at orders-1", func() bool { return replicaStatus(t, st.Admin, "orders-1").Inflight == 1 })

	// Too short a wait fails, naming what is still in flight.
	if _, _, err := keywayCLI(t, "drain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-1", "--wait", "300ms"); err == nil || !strings.Contains(err.Error(), "1 request still in flight") {
		t.Fatalf("drain --wait 300ms with a request in flight: %v", err)
	}
	progress := &stacktest.SyncBuffer{}
	out := make(chan string, 1)
	go func() {
		err := run(context.Background(), []string{"drain", "--admin", st.Admin, "--set", "orders", "--replica", "orders-1", "--wait", "20s"}, progress, io.Discard)
		o := progress.String()
		if err != nil {
			o += "error: " + err.Error()
		}
		out <- o
	}()
	poll.Until(t, 10*time.Second, "drain --wait to report the request in flight", func() bool { return strings.Contains(progress.String(), "1 in flight on 1 proxy") })
	reps[1].Unblock()
	if code := <-hung; code != 200 {
		t.Fatalf("the request in flight during the drain got %d", code)
	}
	o := <-out
	if !strings.Contains(o, "1 in flight on 1 proxy") || !strings.Contains(o, "orders/orders-1 drained after") {
		t.Fatalf("drain --wait output:\n%s", o)
	}
}

// keyway repair: the token is required; an unknown set is a 404; a set of
// static replicas all in rotation has nothing to repair: refused at once.
func TestCLIRepair(t *testing.T) {
	t.Setenv(admin.TokenEnv, "s3cret")
	st := stacktest.StartOrders(t)
	t.Setenv(admin.TokenEnv, "") // the proxy read it at start; the CLI now has none
	if _, _, err := keywayCLI(t, "repair", "--admin", st.Admin, "--set", "orders"); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("repair without a token: %v", err)
	}
	t.Setenv(admin.TokenEnv, "s3cret")
	if _, _, err := keywayCLI(t, "repair", "--admin", st.Admin, "--set", "nope"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Fatalf("repair of an unknown set: %v", err)
	}
	out, _, err := keywayCLI(t, "repair", "--admin", st.Admin, "--set", "orders")
	if err == nil || exitCode(err) != exitRuntime || out != "" || !strings.Contains(err.Error(), "repair orders refused: nothing to repair: no replica of orders is failed") ||
		!strings.Contains(err.Error(), "use keyway restart --set orders") || !strings.Contains(err.Error(), "HTTP 409") {
		t.Fatalf("repair with nothing to repair: %q %v", out, err)
	}
}

// keyway restart --ack: not with --force or --step-timeout (a usage
// error); with no failed restart to acknowledge, the API's 404 says so.
func TestCLIRestartAck(t *testing.T) {
	t.Setenv(admin.TokenEnv, "s3cret")
	st := stacktest.StartOrders(t)
	for _, args := range [][]string{{"--ack", "--force"}, {"--ack", "--step-timeout", "5s"}} {
		args = append([]string{"restart", "--admin", st.Admin, "--set", "orders"}, args...)
		if _, _, err := keywayCLI(t, args...); err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), "--ack starts no restart") {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	_, _, err := keywayCLI(t, "restart", "--admin", st.Admin, "--set", "orders", "--ack")
	if err == nil || !strings.Contains(err.Error(), "no rolling restart of orders has run") || !strings.Contains(err.Error(), "HTTP 404") {
		t.Fatalf("restart --ack without a restart: %v", err)
	}
}
