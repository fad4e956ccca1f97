package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"keyway/config"
	"keyway/internal/stacktest"
	"keyway/internal/testnet"
)

// keyway runs the CLI in-process and returns stdout and the error.
func keywayCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

func TestCLIStatusMembersRoute(t *testing.T) {
	st := stacktest.StartOrders(t)

	out, _, err := keywayCLI(t, "status", "--admin", st.Admin)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	t.Logf("keyway status:\n%s", out)
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "SET") || !strings.Contains(lines[1], "orders") ||
		!strings.Contains(lines[1], "Running") || !strings.Contains(lines[1], "3/3") {
		t.Fatalf("status header:\n%s", out)
	}
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		found := false
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) >= 4 && f[0] == name && f[1] == "ready" && f[2] == "in" && strings.HasSuffix(f[3], "%") {
				found = true
			}
		}
		if !found {
			t.Errorf("status names no ready, in-rotation %s with a share:\n%s", name, out)
		}
	}
	// The first read of the set: no rate yet, said so, and no traffic.
	if rows := statusRows(out); len(rows) != 3 || !strings.Contains(out, "not measured yet") {
		t.Errorf("first status: want 3 replica rows and a note that rates are not measured yet:\n%s", out)
	} else {
		for _, r := range rows {
			if r.rps != "-" || r.eps != "-" || r.reqs != "0" || r.errs != "0" {
				t.Errorf("first status, %s: %+v, want rates - and totals 0", r.name, r)
			}
		}
	}

	// KEYWAY_ADMIN stands in for --admin.
	t.Setenv("KEYWAY_ADMIN", st.Admin)
	out, _, err = keywayCLI(t, "members")
	if err != nil {
		t.Fatalf("members: %v", err)
	}
	t.Logf("keyway members:\n%s", out)
	if !strings.HasPrefix(out, "NODE") || !strings.Contains(out, " *") || !strings.Contains(out, "proxy") || !strings.Contains(out, "alive") {
		t.Errorf("members should list this proxy (alive, marked *):\n%s", out)
	}

	// route's pick is the replica that answers a request with that key.
	picks := map[string]bool{}
	for i := range 30 {
		key := fmt.Sprintf("order-%d", i)
		out, _, err := keywayCLI(t, "route", "--set", "orders", "--key", key)
		if err != nil {
			t.Fatalf("route: %v", err)
		}
		pick := routeField(out, "pick:")
		if pick == "" || routeField(out, "owner:") != pick || !strings.Contains(out, "PICKED") {
			t.Fatalf("route %s:\n%s", key, out)
		}
		if got := st.Send(t, key); got != pick {
			t.Errorf("key %s: keyway route says %s, the proxy sent it to %s", key, pick, got)
		}
		picks[pick] = true
		if i == 0 {
			t.Logf("keyway route:\n%s", out)
		}
	}
	if len(picks) != 3 {
		t.Errorf("30 keys picked %d replicas, want 3: %v", len(picks), picks)
	}

	// A stopped owner: route says why it is skipped and picks the replica
	// that now answers.
	key := ""
	for i := 0; key == ""; i++ {
		k := fmt.Sprintf("order-%d", i)
		out, _, _ := keywayCLI(t, "route", "--set", "orders", "--key", k)
		if routeField(out, "owner:") == "orders-0" {
			key = k
		}
	}
	st.StopReplica["orders-0"]()
	got := st.Send(t, key)
	out, _, err = keywayCLI(t, "route", "--set", "orders", "--key", key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("keyway route after stopping orders-0:\n%s", out)
	if routeField(out, "owner:") != "orders-0" || routeField(out, "pick:") != got || !strings.Contains(out, "skipped:") {
		t.Errorf("after stopping orders-0 key %s went to %s; route:\n%s", key, got, out)
	}
	out, _, _ = keywayCLI(t, "status")
	if !strings.Contains(out, "out: ") {
		t.Errorf("status after stopping orders-0 shows no replica out of rotation:\n%s", out)
	}
	// 31 requests went through the proxy, each answered by one replica;
	// the stopped orders-0 refused one connection (an error).
	t.Logf("keyway status after traffic:\n%s", out)
	var reqs, errs int
	for _, r := range statusRows(out) {
		n, e := 0, 0
		fmt.Sscan(r.reqs, &n)
		fmt.Sscan(r.errs, &e)
		reqs, errs = reqs+n, errs+e
		if r.rps != "-" && !regexp.MustCompile(`^[0-9.]+$`).MatchString(r.rps) {
			t.Errorf("%s: REQ/S %q", r.name, r.rps)
		}
	}
	if reqs != 31 || errs < 1 {
		t.Errorf("status after 31 requests: REQUESTS add up to %d, ERRORS to %d (want 31 and at least 1):\n%s", reqs, errs, out)
	}

	// JSON passthrough.
	out, _, err = keywayCLI(t, "route", "--set", "orders", "--key", key, "--json")
	var ex struct{ Pick string }
	if err != nil || json.Unmarshal([]byte(out), &ex) != nil || ex.Pick != got {
		t.Errorf("route --json: %v\n%s", err, out)
	}

	// API errors come through with their message.
	_, _, err = keywayCLI(t, "route", "--set", "nope", "--key", "k")
	if err == nil || !strings.Contains(err.Error(), `unknown replica set "nope"`) || exitCode(err) != exitRuntime {
		t.Errorf("unknown set: %v", err)
	}
}

// fl reads a rate: -1 for null.
func fl(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

func TestFmtRate(t *testing.T) {
	for _, c := range []struct {
		in   *float64
		want string
	}{{nil, "-"}, {new(0.0), "0"}, {new(0.004), "0.00"}, {new(0.25), "0.25"}, {new(9.996), "10.00"}, {new(12.345), "12.3"}, {new(1234.5), "1234"}} {
		if got := fmtRate(c.in); got != c.want {
			t.Errorf("fmtRate(%v) = %q, want %q", fl(c.in), got, c.want)
		}
	}
}

// statusRow is one replica line of keyway status.
type statusRow struct{ name, rps, eps, reqs, errs string }

// statusRows parses the replica lines of keyway status, counting the
// columns from the right (ROTATION may hold spaces): ... REQ/S ERR/S
// REQUESTS ERRORS ADDR SOURCE.
func statusRows(out string) []statusRow {
	var rows []statusRow
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if !strings.HasPrefix(l, "  ") || len(f) < 9 || f[0] == "REPLICA" || strings.HasPrefix(f[0], "(") {
			continue
		}
		n := len(f)
		rows = append(rows, statusRow{name: f[0], rps: f[n-6], eps: f[n-5], reqs: f[n-4], errs: f[n-3]})
	}
	return rows
}

// routeField returns the value after a "name:" line of route's output.
func routeField(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, name); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

func TestCLIErrors(t *testing.T) {
	// A free port nobody listens on.
	dead := testnet.RefusedAddr(t)
	for _, cmd := range []string{"status", "members", "route"} {
		args := []string{cmd, "--admin", dead}
		if cmd == "route" {
			args = append(args, "--set", "orders", "--key", "k")
		}
		_, _, err := keywayCLI(t, args...)
		if err == nil || !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), "--admin") ||
			!strings.Contains(err.Error(), "KEYWAY_ADMIN") || exitCode(err) != exitRuntime {
			t.Errorf("%s against a dead address: %v", cmd, err)
		}
	}
	// The environment names the default address; the error names it too.
	t.Setenv("KEYWAY_ADMIN", dead)
	if _, _, err := keywayCLI(t, "status"); err == nil || !strings.Contains(err.Error(), dead) {
		t.Errorf("status with KEYWAY_ADMIN=%s: %v", dead, err)
	}
	for _, args := range [][]string{
		{"route", "--key", "k"},
		{"route", "--set", "orders"},
		{"status", "extra"},
		{"members", "--admin", ""},
		{"status", "--admin", "http://"},
	} {
		if _, _, err := keywayCLI(t, args...); err == nil || exitCode(err) != exitConfig {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	// Something that is not a keyway admin API.
	srv := http.Server{Handler: http.NotFoundHandler()}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Close()
	if _, _, err := keywayCLI(t, "members", "--admin", l.Addr().String()); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("members against a plain 404 server: %v", err)
	}
}

// keyway status --set shows one set (and its row of the fleet block);
// an unknown set is named with the sets the proxy routes.
func TestCLIStatusSet(t *testing.T) {
	orders, _ := stacktest.StartDemoReplica(t, "orders-0")
	users, _ := stacktest.StartDemoReplica(t, "users-0")
	cfg, err := config.LoadBytes("test.yaml", []byte(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast}
replica_sets:
  - name: orders
    match: {path_prefix: /orders}
    replicas: 1
    static: [{name: orders-0, addr: "`+orders+`"}]
  - name: users
    match: {path_prefix: /users}
    replicas: 1
    static: [{name: users-0, addr: "`+users+`"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	st := stacktest.StartProxy(t, cfg, stacktest.Opts{Gossip: true})
	t.Setenv("KEYWAY_ADMIN", st.Admin)

	all, _, err := keywayCLI(t, "status")
	if err != nil || !regexp.MustCompile(`(?m)^orders `).MatchString(all) || !regexp.MustCompile(`(?m)^users `).MatchString(all) {
		t.Fatalf("status: %v\n%s", err, all)
	}
	out, _, err := keywayCLI(t, "status", "--set", "users")
	if err != nil {
		t.Fatalf("status --set users: %v", err)
	}
	t.Logf("keyway status --set users:\n%s", out)
	if !regexp.MustCompile(`(?m)^users `).MatchString(out) || !strings.Contains(out, "users-0") || strings.Contains(out, "orders") {
		t.Errorf("status --set users shows more or less than users (and its fleet row):\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^  users  `).MatchString(out) {
		t.Errorf("status --set users has no fleet row for users:\n%s", out)
	}
	out, _, err = keywayCLI(t, "status", "--set", "users", "--json")
	var js struct {
		ReplicaSets []struct{ Name string } `json:"replica_sets"`
	}
	if err != nil || json.Unmarshal([]byte(out), &js) != nil || len(js.ReplicaSets) != 1 || js.ReplicaSets[0].Name != "users" {
		t.Errorf("status --set users --json: %v\n%s", err, out)
	}
	_, _, err = keywayCLI(t, "status", "--set", "ordres")
	if err == nil || exitCode(err) != exitRuntime || err.Error() != `--set ordres: unknown replica set "ordres": this proxy routes orders, users` {
		t.Errorf("status --set ordres: %v (exit %d)", err, exitCode(err))
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 proxies", 1: "1 proxy", 2: "2 proxies"} {
		if got := plural(n, "proxy", "proxies"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
}

// No message of the CLI prints a count straight before a plural noun
// ("0 in flight on 1 proxies"): counts go through plural.
func TestNoBarePluralCounts(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	bare := regexp.MustCompile(`%d (?:[a-z]+ )?(?:proxies|replicas|requests|jobs|agents|members|keys|records|sets|errors|restarts|certificates|files)\b`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := bare.FindString(line); m != "" {
				t.Errorf("%s:%d: %q prints a count before a plural noun: use plural(n, one, many)", f, i+1, m)
			}
		}
	}
}

// An --admin naming a host alone means the admin listener's default port,
// not HTTP's 80.
func TestAdminDefaultPort(t *testing.T) {
	for in, want := range map[string]string{
		"localhost":              "localhost:9901",
		"10.0.0.5":               "10.0.0.5:9901",
		"::1":                    "[::1]:9901",
		"[::1]":                  "[::1]:9901",
		"proxy-0.keyway.svc":     "proxy-0.keyway.svc:9901",
		"localhost:9911":         "localhost:9911",
		"[::1]:9911":             "[::1]:9911",
		"http://localhost":       "http://localhost",
		"https://admin.example":  "https://admin.example",
		"http://127.0.0.1:9901/": "http://127.0.0.1:9901/",
		"":                       "",
	} {
		if got := withAdminPort(in); got != want {
			t.Errorf("withAdminPort(%q) = %q, want %q", in, got, want)
		}
	}
	// checkAddr applies it: every client command dials that address.
	cf := &cliFlags{admin: "localhost"}
	if err := cf.checkAddr(); err != nil || cf.admin != "localhost:9901" {
		t.Errorf("checkAddr of --admin localhost: %v, address %q", err, cf.admin)
	}
}
