package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"keyway/fleetauth"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"keyway/config"
	"keyway/demo"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
)

func TestVersionAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &errb); err != nil || !strings.HasPrefix(out.String(), "keyway ") {
		t.Fatalf("version: %v %q", err, out.String())
	}
	err := run(context.Background(), nil, &out, &errb)
	if exitCode(err) != exitConfig || !strings.Contains(errb.String(), "keyway demo") {
		t.Fatalf("no command: err %v code %d, usage %q", err, exitCode(err), errb.String())
	}
	if err := run(context.Background(), []string{"frobnicate"}, &out, &errb); exitCode(err) != exitConfig {
		t.Fatalf("unknown command: %v", err)
	}
	out.Reset()
	errb.Reset()
	err = run(context.Background(), []string{"proxy", "--help"}, &out, &errb)
	if err != nil || !strings.Contains(out.String(), "Precedence") || !strings.Contains(out.String(), "KEYWAY_") || errb.Len() != 0 {
		t.Fatalf("proxy --help: %v %q %q", err, out.String(), errb.String())
	}
}

func TestValidateExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	files = append(files, "../../demo/demo.yaml")
	for i, f := range files {
		files[i], _ = filepath.Abs(f)
	}
	// The examples' TLS files (relative: tls/tls.crt, ...) made for the test.
	t.Chdir(exampleCerts(t))
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			var out, errb bytes.Buffer
			if err := run(context.Background(), []string{"validate", "-c", f}, &out, &errb); err != nil {
				t.Fatalf("validate %s: %v", f, err)
			}
			if !strings.HasPrefix(out.String(), "ok: ") || strings.Count(out.String(), "\n") != 1 {
				t.Fatalf("want a one-line summary starting with ok:, got %q", out.String())
			}
			// An agent's file is checked as one, and said to be one.
			if agent := strings.HasPrefix(filepath.Base(f), "agent"); agent != strings.HasPrefix(out.String(), "ok: agent file for keyway agent -c "+f+": replica ") {
				t.Fatalf("agent file %v, summary %q", agent, out.String())
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	f := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(f, []byte("listen: \":8080\"\nreplica_sets:\n  - name: Orders\n    replicas: 0\n    timeouts: {conect: 1s}\n"), 0o644)
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"validate", "-c", f}, &out, &errb)
	var ce *config.Error
	if !errors.As(err, &ce) || exitCode(err) != exitConfig {
		t.Fatalf("want a *config.Error and exit 2, got %v (exit %d)", err, exitCode(err))
	}
	msg := err.Error()
	for _, want := range []string{"bad.yaml:3", "replica_sets[0].name", "bad.yaml:4", "replica_sets[0].replicas", "conect", "did you mean"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if out.Len() != 0 {
		t.Errorf("validate printed a summary for a bad file: %q", out.String())
	}
	// A runtime failure (missing file) is exit 1, not 2.
	err = run(context.Background(), []string{"validate", "-c", filepath.Join(t.TempDir(), "missing.yaml")}, &out, &errb)
	if err == nil || exitCode(err) != exitRuntime {
		t.Fatalf("missing file: %v (exit %d), want exit 1", err, exitCode(err))
	}
}

var (
	proxyLine = regexp.MustCompile(`proxy on http://(\S+),`)
	adminLine = regexp.MustCompile(`admin on http://(\S+) `)
	tokenLine = regexp.MustCompile(`admin token for this run \([^)]*\): (\S+)`)
)

// scanDemoBanner reads the demo's banner up to its token line and returns
// the addresses and token file it names ("" for a line not seen); the rest
// of r is drained in the background.
func scanDemoBanner(r io.Reader) (addr, admin, tokenFile string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if m := proxyLine.FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
		if m := adminLine.FindStringSubmatch(sc.Text()); m != nil {
			admin = m[1]
		}
		if m := tokenLine.FindStringSubmatch(sc.Text()); m != nil {
			tokenFile = m[1]
			break
		}
	}
	go io.Copy(io.Discard, r)
	return addr, admin, tokenFile
}

// startDemo runs `keyway demo` in-process, waits until its three replicas
// are in rotation and returns its addresses and the run's token file.
func startDemo(t *testing.T) (addr, admin, tokenFile string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	errb := &stacktest.SyncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--gossip-bind-port", "0", "--log-level", "warn"}, pw, errb)
		pw.Close()
	}()
	addr, admin, tokenFile = scanDemoBanner(pr)
	if addr == "" || admin == "" || tokenFile == "" {
		cancel()
		t.Fatalf("demo printed no proxy or admin address or token file; stderr: %s, err: %v", errb.String(), <-done)
	}
	stacktest.WaitRotation(t, admin, "orders", 3)
	checkMembers(t, admin)
	return addr, admin, tokenFile, func() error {
		cancel()
		return <-done
	}
}

func TestDemoRoutesKeysConsistently(t *testing.T) {
	addr, admin, tokenFile, stop := startDemo(t)
	owner := map[string]string{}
	seen := map[string]bool{}
	for round := 0; round < 2; round++ {
		for i := 0; i < 60; i++ {
			key := "order-" + string(rune('A'+i%26)) + string(rune('a'+i/26))
			replica := stacktest.SendKey(t, addr, key)
			if prev, ok := owner[key]; ok && prev != replica {
				t.Fatalf("key %s moved from %s to %s", key, prev, replica)
			}
			owner[key] = replica
			seen[replica] = true
		}
	}
	if len(seen) != 3 {
		t.Fatalf("60 keys reached %d replicas, want all 3: %v", len(seen), seen)
	}
	// The path segment and query sources route like the header.
	for _, u := range []string{"/ingest/order-Aa", "/ingest?key=order-Aa"} {
		resp, err := http.Get("http://" + addr + u)
		if err != nil {
			t.Fatal(err)
		}
		var a demo.Answer
		json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if a.Replica != owner["order-Aa"] {
			t.Errorf("%s went to %s, header key went to %s", u, a.Replica, owner["order-Aa"])
		}
	}
	// The run's admin token works for the mutating commands it prints, and
	// is removed when the demo stops.
	if out, _, err := keywayCLI(t, "drain", "--admin", admin, "--set", "orders", "--replica", "orders-2", "--token-file", tokenFile); err != nil || !strings.Contains(out, "accepted") {
		t.Fatalf("drain with the demo's token: %q %v", out, err)
	}
	stacktest.WaitRotation(t, admin, "orders", 2)
	if out, _, err := keywayCLI(t, "undrain", "--admin", admin, "--set", "orders", "--replica", "orders-2", "--token-file", tokenFile); err != nil || !strings.Contains(out, "accepted") {
		t.Fatalf("undrain with the demo's token: %q %v", out, err)
	}
	stacktest.WaitRotation(t, admin, "orders", 3)
	if err := stop(); err != nil {
		t.Fatalf("demo did not stop cleanly: %v", err)
	}
	if _, err := os.Stat(tokenFile); !os.IsNotExist(err) {
		t.Errorf("the demo's token file outlived it: %v", err)
	}
}

// TestBinaryDemo builds the real binary, runs `keyway demo`, sends a
// request and stops it with SIGTERM: the README's first command.
func TestBinaryDemo(t *testing.T) {
	slow.Skip(t)
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "keyway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "demo", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--gossip-bind-port", "0")
	stdout, _ := cmd.StdoutPipe()
	stderr := &stacktest.SyncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	addr, admin, _ := scanDemoBanner(stdout)
	if addr == "" || admin == "" {
		t.Fatalf("no proxy or admin address printed; stderr:\n%s", stderr.String())
	}
	stacktest.WaitRotation(t, admin, "orders", 3)
	req, _ := http.NewRequest("POST", "http://"+addr+"/ingest", strings.NewReader("hello"))
	req.Header.Set("X-Key", "order-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"key":"order-42"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case err := <-waitErr:
		if err != nil {
			t.Fatalf("keyway demo exited with %v after SIGTERM; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("keyway demo did not exit within 30s of SIGTERM")
	}
	if !strings.Contains(stderr.String(), "proxy stopped") {
		t.Errorf("no graceful-stop log line; stderr:\n%s", stderr.String())
	}
}

func TestReplicaCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"replica", "--name", "orders-7", "--listen", "127.0.0.1:0"}, pw, io.Discard)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatal("replica printed nothing")
	}
	var name, addr string
	if _, err := fmt.Sscanf(sc.Text(), "replica %s listening on %s", &name, &addr); err != nil || name != "orders-7" {
		t.Fatalf("unexpected first line %q: %v", sc.Text(), err)
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/ingest", strings.NewReader("abc"))
	req.Header.Set("X-Key", "k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var a demo.Answer
	json.NewDecoder(resp.Body).Decode(&a)
	resp.Body.Close()
	if a.Replica != "orders-7" || a.Key != "k1" || a.Bytes != 3 {
		t.Fatalf("answer %+v", a)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("replica did not stop cleanly: %v", err)
	}
}

// checkMembers asks the admin API for the gossip members: the demo's three
// replicas (alive, ready) and the proxy itself.
func checkMembers(t *testing.T, admin string) {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/v1/members")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Members []struct{ Role, Status, Replica, State string } `json:"members"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	replicas, proxies := 0, 0
	for _, m := range out.Members {
		switch {
		case m.Role == "replica" && m.Status == "alive" && m.State == "ready":
			replicas++
		case m.Role == "proxy":
			proxies++
		}
	}
	if replicas != 3 || proxies != 1 {
		t.Fatalf("/v1/members: %d ready replicas and %d proxies, want 3 and 1: %+v", replicas, proxies, out.Members)
	}
}

// validate refuses what keyway proxy would refuse at start: an admin
// listener off loopback without a token.
func TestValidateAdminToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k.yaml")
	if err := os.WriteFile(file, []byte("admin: {listen: \"0.0.0.0:9901\"}\nreplica_sets:\n  - name: orders\n    static: [{name: o0, addr: \"127.0.0.1:9001\"}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KEYWAY_ADMIN_TOKEN", "")
	_, _, err := keywayCLI(t, "validate", "-c", file)
	if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("validate off loopback without a token: %v", err)
	}
	t.Setenv("KEYWAY_ADMIN_TOKEN", "t")
	if out, _, err := keywayCLI(t, "validate", "-c", file); err != nil || !strings.HasPrefix(out, "ok:") {
		t.Fatalf("validate with a token: %q %v", out, err)
	}
}

// keyway validate refuses what the proxy's gossip would refuse at start:
// no key off loopback; a key from the environment, or gossip.insecure,
// makes it valid.
func TestValidateGossipKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "g.yaml")
	if err := os.WriteFile(file, []byte("gossip: {enabled: true, bind_addr: 0.0.0.0}\nreplica_sets:\n  - name: orders\n    replicas: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KEYWAY_GOSSIP_KEY", "")
	_, _, err := keywayCLI(t, "validate", "-c", file)
	if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), `g.yaml:1: gossip.bind_addr: gossip would listen on "0.0.0.0", which is not a loopback address, without an encryption key`) {
		t.Fatalf("validate off loopback without a key: %v", err)
	}
	if out, _, err := keywayCLI(t, "validate", "-c", file, "--set", "gossip.insecure=true"); err != nil || !strings.HasPrefix(out, "ok:") {
		t.Fatalf("validate with gossip.insecure: %q %v", out, err)
	}
	t.Setenv("KEYWAY_GOSSIP_KEY", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	// A key is not enough: every member holds it. The proxy needs its
	// credentials too.
	_, _, err = keywayCLI(t, "validate", "-c", file)
	if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), `g.yaml:1: gossip.credentials_file: gossip on bind_addr "0.0.0.0", off loopback, needs the fleet's credentials`) {
		t.Fatalf("validate off loopback with a key, without credentials: %v", err)
	}
	creds := fleetauth.Generate([]string{"orders"})
	agentFile := filepath.Join(t.TempDir(), "agent-orders.yaml")
	if err := os.WriteFile(agentFile, creds.ForAgent("orders").Marshal("orders' agents"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = keywayCLI(t, "validate", "-c", file, "--set", "gossip.credentials_file="+agentFile)
	if err == nil || !strings.Contains(err.Error(), "gossip.credentials_file: "+agentFile+": proxy.private: no private key") {
		t.Fatalf("validate with an agent's credentials: %v", err)
	}
	proxyFile := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(proxyFile, creds.ForProxy().Marshal("proxies"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, _, err := keywayCLI(t, "validate", "-c", file, "--set", "gossip.credentials_file="+proxyFile); err != nil || !strings.HasPrefix(out, "ok:") {
		t.Fatalf("validate with a key and the proxy's credentials: %q %v", out, err)
	}
}

// keyway validate --previous warns when the new file removes a set whose
// requests would go to another set.
func TestValidateWarnsOfFallThrough(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.yaml")
	next := filepath.Join(dir, "new.yaml")
	const sets = "listen: 127.0.0.1:0\nreplica_sets:\n  - {name: orders, replicas: 1}\n"
	if err := os.WriteFile(old, []byte(sets+"  - {name: users, replicas: 1, match: {path_prefix: /users/}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(next, []byte(sets), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := keywayCLI(t, "validate", "-c", next, "--previous", old)
	if err != nil || !strings.HasPrefix(out, "ok:") {
		t.Fatalf("validate: %q %v", out, err)
	}
	if !strings.Contains(errOut, `warning: replica set "users" is removed: its requests (path /users/) go to replica set "orders" from now on`) {
		t.Fatalf("no fall-through warning: %q", errOut)
	}
	if _, errOut, _ := keywayCLI(t, "validate", "-c", next); strings.Contains(errOut, "is removed") {
		t.Fatalf("a warning without --previous: %q", errOut)
	}
}
