package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/config"
	"keyway/integration"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// operateStack is a proxy run by serveFile in-process from a file, with
// two static demo replicas of "orders" and an admin token.
type operateStack struct {
	proxy, admin, file, token string
	replicas                  []string // "name addr"
}

func (st *operateStack) write(t *testing.T, extra string) {
	t.Helper()
	yml := fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token_file: %q}
log: {level: info}
replica_sets:
  - name: orders
    replicas: 2
    static:
      - {name: %s, addr: %q}
      - {name: %s, addr: %q}
%s`, st.token, strings.Fields(st.replicas[0])[0], strings.Fields(st.replicas[0])[1],
		strings.Fields(st.replicas[1])[0], strings.Fields(st.replicas[1])[1], extra)
	tmp := st.file + ".tmp"
	if err := os.WriteFile(tmp, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, st.file); err != nil {
		t.Fatal(err)
	}
}

func startOperateStack(t *testing.T) *operateStack {
	t.Helper()
	dir := t.TempDir()
	st := &operateStack{file: filepath.Join(dir, "keyway.yaml"), token: filepath.Join(dir, "token")}
	if err := os.WriteFile(st.token, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		name := fmt.Sprintf("orders-%d", i)
		addr, _ := stacktest.StartDemoReplica(t, name)
		st.replicas = append(st.replicas, name+" "+addr)
	}
	st.write(t, "")
	load := func() (config.Config, error) {
		return config.Load(st.file, config.WithEnv(func(string) (string, bool) { return "", false }))
	}
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	stk := stacktest.StartProxy(t, cfg, stacktest.Opts{File: st.file, Load: load})
	st.proxy, st.admin = stk.Proxy, stk.Admin
	stacktest.WaitRotation(t, st.admin, "orders", 2)
	return st
}

func TestReloadAndScaleCLI(t *testing.T) {
	st := startOperateStack(t)
	cli := func(args ...string) (string, error) {
		out, _, err := keywayCLI(t, append(args, "--admin", st.admin, "--token-file", st.token)...)
		return out, err
	}
	if out, err := cli("reload"); err != nil || !strings.Contains(out, "no change") {
		t.Fatalf("reload of the same file: %q %v", out, err)
	}

	// A new set and a changed retry count apply; the new set serves at once.
	st.write(t, `    retries: {attempts: 1}
  - name: events
    match: {path_prefix: /events}
    static:
      - {name: orders-0, addr: "`+strings.Fields(st.replicas[0])[1]+`"}
`)
	out, err := cli("reload")
	if err != nil || !strings.Contains(out, "added sets:   events") || !strings.Contains(out, "changed sets: orders") || !strings.Contains(out, "replica_sets[0].retries.attempts") {
		t.Fatalf("reload adding events: %q %v", out, err)
	}
	resp, err := http.Post("http://"+st.proxy+"/events/x", "text/plain", strings.NewReader("e"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("events after reload: %d", resp.StatusCode)
	}
	var cfgView map[string]any
	stacktest.GetJSON(t, "http://"+st.admin+"/v1/config", &cfgView)
	if b, _ := json.Marshal(cfgView); !strings.Contains(string(b), `"events"`) {
		t.Fatalf("/v1/config does not show the reloaded set: %s", b)
	}

	// A start-only key refuses the whole file, naming the key.
	good, _ := os.ReadFile(st.file)
	if err := os.WriteFile(st.file, []byte(strings.Replace(string(good), "listen: 127.0.0.1:0\n", "listen: 127.0.0.1:1\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = cli("reload")
	if err == nil || !strings.Contains(err.Error(), "listen: running with") || !strings.Contains(err.Error(), "restart keyway") {
		t.Fatalf("reload of a start-only change: %q %v", out, err)
	}
	if got := integration.Metric(st.admin, "keyway_config_reloads_total", map[string]string{"result": "failure"}); got != 1 {
		t.Fatalf("failures counted: %v, want 1", got)
	}
	if got := integration.Metric(st.admin, "keyway_config_reloads_total", map[string]string{"result": "success"}); got != 2 {
		t.Fatalf("successes counted: %v, want 2", got)
	}
	if got := integration.Metric(st.admin, "keyway_config_last_reload_successful", nil); got != 0 {
		t.Fatalf("keyway_config_last_reload_successful = %v after a refusal, want 0", got)
	}
	if err := os.WriteFile(st.file, good, 0o644); err != nil {
		t.Fatal(err)
	}

	// Scale: declared 2 → 4, the set reads Degraded; reloads keep it, even
	// one that changes the file's replicas (the run-time state wins) until
	// the run-time state is cleared.
	// Versions are hybrid logical clock values: each write's is above the
	// last.
	version := func(out string) uint64 {
		t.Helper()
		m := regexp.MustCompile(`version (\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no version in %q", out)
		}
		v, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	out, err = cli("scale", "--set", "orders", "--replicas", "4")
	if err != nil || !strings.Contains(out, "declared 4 (was 2), scope this proxy, version ") {
		t.Fatalf("scale: %q %v", out, err)
	}
	scaled := version(out)
	var set struct {
		Phase    string `json:"phase"`
		Declared int    `json:"declared"`
	}
	stacktest.GetJSON(t, "http://"+st.admin+"/v1/replica_sets/orders", &set)
	if set.Declared != 4 || set.Phase != "Degraded" {
		t.Fatalf("after scale: %+v, want declared 4 and Degraded", set)
	}
	if out, err := cli("reload"); err != nil || !strings.Contains(out, "no change") {
		t.Fatalf("reload after scale: %q %v", out, err)
	}
	stacktest.GetJSON(t, "http://"+st.admin+"/v1/replica_sets/orders", &set)
	if set.Declared != 4 {
		t.Fatalf("declared after an unrelated reload: %d, want 4", set.Declared)
	}
	st.write(t, "") // events removed, replicas still 2 in the file: unchanged key
	if out, err := cli("reload"); err != nil || !strings.Contains(out, "removed sets: events") {
		t.Fatalf("reload removing events: %q %v", out, err)
	}
	if err := os.WriteFile(st.file, []byte(strings.Replace(string(mustRead(t, st.file)), "replicas: 2", "replicas: 3", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cli("reload"); err != nil {
		t.Fatal(err)
	}
	stacktest.GetJSON(t, "http://"+st.admin+"/v1/replica_sets/orders", &set)
	if set.Declared != 4 || set.Phase != "Degraded" {
		t.Fatalf("after the file changed replicas: %+v, want the run-time 4, Degraded", set)
	}
	if out, _, err := keywayCLI(t, "status", "--admin", st.admin); err != nil || !strings.Contains(out, "run-time state overrides the file (replicas): scale by ") {
		t.Fatalf("status with a run-time override: %q %v", out, err)
	}
	if out, _, err := keywayCLI(t, "runtime", "--admin", st.admin); err != nil || !strings.Contains(out, "replicas=4") || !strings.Contains(out, "orders") {
		t.Fatalf("runtime: %q %v", out, err)
	}
	if out, err := cli("runtime", "clear", "--set", "orders"); err != nil || !strings.Contains(out, "cleared orders: version ") || version(out) <= scaled {
		t.Fatalf("runtime clear: %q %v; want a version above the scale's %d", out, err, scaled)
	}
	stacktest.GetJSON(t, "http://"+st.admin+"/v1/replica_sets/orders", &set)
	if set.Declared != 3 || set.Phase != "Degraded" {
		t.Fatalf("after the run-time state was cleared: %+v, want the file's 3, Degraded", set)
	}
	if _, err := cli("runtime", "clear", "--set", "orders"); err == nil || !strings.Contains(err.Error(), "no run-time state") {
		t.Fatalf("a second clear: %v", err)
	}

	// Errors: unknown set, bad count, no token, a rotated token.
	if _, err := cli("scale", "--set", "nope", "--replicas", "2"); err == nil || !strings.Contains(err.Error(), `unknown replica set "nope"`) {
		t.Fatalf("scale of an unknown set: %v", err)
	}
	if _, err := cli("scale", "--set", "orders", "--replicas", "1001"); err == nil || !strings.Contains(err.Error(), "must be 1 to 1000") || exitCode(err) != exitConfig {
		t.Fatalf("scale to 1001: %v", err)
	}
	t.Setenv("KEYWAY_ADMIN_TOKEN", "")
	if _, _, err := keywayCLI(t, "reload", "--admin", st.admin); err == nil || exitCode(err) != exitConfig {
		t.Fatalf("reload without a token: %v", err)
	}
	if err := os.WriteFile(st.token, []byte("tok-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(t.TempDir(), "old")
	if err := os.WriteFile(old, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The reload that reads the rotated file is authorized by the old token.
	if _, _, err := keywayCLI(t, "reload", "--admin", st.admin, "--token-file", old); err != nil {
		t.Fatal(err)
	}
	if _, _, err := keywayCLI(t, "reload", "--admin", st.admin, "--token-file", old); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("reload with the old token after rotation: %v", err)
	}
	if _, err := cli("reload"); err != nil {
		t.Fatalf("reload with the new token: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// KEYWAY_ADMIN_TOKEN wins over admin.token_file, at start and on reload:
// a token file that does not exist does not refuse the unchanged file.
func TestReloadWithEnvToken(t *testing.T) {
	t.Setenv("KEYWAY_ADMIN_TOKEN", "env-tok")
	dir := t.TempDir()
	addr, _ := stacktest.StartDemoReplica(t, "orders-0")
	file := filepath.Join(dir, "keyway.yaml")
	yml := `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token_file: "` + filepath.Join(dir, "missing-token") + `"}
replica_sets:
  - name: orders
    static:
      - {name: orders-0, addr: "` + addr + `"}
`
	if err := os.WriteFile(file, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	load := func() (config.Config, error) { return config.Load(file) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	stk := stacktest.StartProxy(t, cfg, stacktest.Opts{File: file, Load: load})
	if out, _, err := keywayCLI(t, "reload", "--admin", stk.Admin); err != nil || !strings.Contains(out, "no change") {
		t.Fatalf("reload of the unchanged file with the token from the environment: %q %v", out, err)
	}
}

// A set added by a reload whose replicas gossip already knows serves its
// first request as soon as the reload has answered.
func TestReloadAddsGossipSet(t *testing.T) {
	dir := t.TempDir()
	orders, events := stacktest.StartReplica(t, "orders-0"), stacktest.StartReplica(t, "events-0")
	file := filepath.Join(dir, "keyway.yaml")
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(extra string) {
		yml := `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token_file: "` + token + `"}
log: {level: warn}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast}
replica_sets:
  - name: orders
    static:
      - {name: orders-0, addr: "` + orders.Addr + `"}
` + extra
		if err := os.WriteFile(file+".tmp", []byte(yml), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	load := func() (config.Config, error) { return config.Load(file) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	stk := stacktest.StartProxy(t, cfg, stacktest.Opts{File: file, Load: load, Gossip: true})

	stacktest.StartGossipReplica(t, stk.Gossip, membership.Meta{Set: "events", Replica: "events-0", Addr: events.Addr, State: balancer.StateReady})
	// The proxy sees the replica of a set it does not serve yet.
	poll.Until(t, 10*time.Second, "the unknown set counted", func() bool {
		return integration.Metric(stk.Admin, "keyway_gossip_unknown_set_replicas_total", nil) == 1
	})

	write("  - name: events\n    match: {path_prefix: /events}\n")
	if out, _, err := keywayCLI(t, "reload", "--admin", stk.Admin, "--token-file", token); err != nil || !strings.Contains(out, "added sets:   events") {
		t.Fatalf("reload: %q %v", out, err)
	}
	resp, err := http.Post("http://"+stk.Proxy+"/events/x", "text/plain", strings.NewReader("e"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "events-0" {
		t.Fatalf("first request to the new set: %d %s", resp.StatusCode, body)
	}
}
