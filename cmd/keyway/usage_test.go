package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"keyway/config"
	"keyway/demo"
)

// commands are the commands topUsage lists.
func commands(t *testing.T) []string {
	t.Helper()
	out := topCommands()
	if len(out) < 20 {
		t.Fatalf("topUsage lists only %v", out)
	}
	return out
}

// --help and -h print the command's usage to stdout and exit 0, for every
// command; a bad flag prints the problem and the usage to stderr, exit 2.
func TestEveryCommandHelp(t *testing.T) {
	for _, cmd := range commands(t) {
		for _, args := range [][]string{{cmd, "--help"}, {cmd, "-h"}, {"help", cmd}} {
			out, errOut, err := keywayCLI(t, args...)
			if err != nil || exitCode(err) != 0 || errOut != "" {
				t.Errorf("%v: %v (exit %d), stderr %q; want exit 0 and nothing on stderr", args, err, exitCode(err), errOut)
			}
			if !strings.HasPrefix(out, "Usage: keyway ") || !strings.Contains(out, cmd) {
				t.Errorf("%v: stdout %q, want the command's usage", args, out)
			}
		}
		out, errOut, err := keywayCLI(t, cmd, "--no-such-flag")
		if err == nil || exitCode(err) != exitConfig || out != "" || !strings.Contains(errOut, "flag provided but not defined: -no-such-flag") ||
			!strings.Contains(errOut, "Usage: keyway ") {
			t.Errorf("%s --no-such-flag: %v (exit %d), stdout %q, stderr %q; want exit 2 with the usage on stderr", cmd, err, exitCode(err), out, errOut)
		}
	}
	// The demo runs its embedded configuration without -c.
	out, _, _ := keywayCLI(t, "demo", "--help")
	line := regexp.MustCompile(`(?m)^  -c FILE\n\s+(.*)$`).FindStringSubmatch(out)
	if line == nil || strings.Contains(line[1], "required") || !strings.Contains(line[1], "optional") {
		t.Errorf("demo --help on -c: %q\n%s", line, out)
	}
	if !strings.HasPrefix(out, "Usage: keyway demo [-c FILE] [flags]") {
		t.Errorf("demo --help: %q", out)
	}
}

// A configuration file named without -c gets a hint.
func TestPositionalFileHint(t *testing.T) {
	for _, args := range [][]string{
		{"validate", "keyway.yaml"},
		{"proxy", "keyway.yaml"},
		{"proxy", "keyway.yaml", "--listen", ":9000"},
		{"demo", "keyway.yaml"},
		{"agent", "keyway.yaml"},
	} {
		_, _, err := keywayCLI(t, args...)
		if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), `unexpected argument "keyway.yaml": did you mean -c keyway.yaml?`) {
			t.Errorf("%v: %v (exit %d)", args, err, exitCode(err))
		}
	}
	// A file that exists, whatever its name, gets the hint too.
	conf := filepath.Join(t.TempDir(), "keyway.conf")
	os.WriteFile(conf, []byte("listen: :8080\n"), 0o644)
	if _, _, err := keywayCLI(t, "proxy", conf); err == nil || !strings.Contains(err.Error(), "did you mean -c "+conf+"?") {
		t.Errorf("proxy %s: %v", conf, err)
	}
	for _, args := range [][]string{{"status", "extra"}, {"validate", "-c", "a.yaml", "b.yaml"}, {"agent", "orders"}} {
		if _, _, err := keywayCLI(t, args...); err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), "unexpected arguments: ") {
			t.Errorf("%v: %v (exit %d)", args, err, exitCode(err))
		}
	}
}

// The proxy's and the agent's files are told apart: validate checks an
// agent's file as one, and proxy and agent name the command that reads
// the file they were given.
func TestFileKinds(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	agentFile, proxyFile := "../../examples/agent.yaml", "../../examples/minimal.yaml"
	mixed := write("mixed.yaml", "replica: {set: orders}\nreplica_sets: [{name: orders, static: [{name: orders-0, addr: \"127.0.0.1:9001\"}]}]\n")
	badAgent := write("bad-agent.yaml", "replica: {set: orders, addr: \"127.0.0.1:99999\"}\ngossip: {bind_addr: 127.0.0.1, join: [\"127.0.0.1:7946\"]}\n")
	for _, tc := range []struct {
		args  []string
		first string // the error's first line
		has   string
	}{
		{[]string{"proxy", "-c", agentFile},
			agentFile + " is an agent's configuration (keys replica, probe, drain, supervise, lock_file, exit_with_parent): run it with keyway agent -c " + agentFile + ", check it with keyway validate -c " + agentFile + "; read as a proxy's configuration:",
			`unknown key "replica"`},
		{[]string{"agent", "-c", proxyFile},
			proxyFile + " is a proxy's configuration (keys replica_sets): run it with keyway proxy -c " + proxyFile + ", check it with keyway validate -c " + proxyFile + "; read as an agent's configuration:",
			`unknown key "replica_sets"`},
		{[]string{"validate", "-c", agentFile, "--listen", ":9000"},
			agentFile + " is an agent's configuration (keys replica, probe, drain, supervise, lock_file, exit_with_parent), and the flags given are the proxy's: check it with keyway agent --check -c " + agentFile + " and the agent's flags (keyway agent --help)",
			""},
		{[]string{"validate", "-c", mixed}, mixed + `:1: replica: unknown key "replica"; did you mean "replica_sets"?`,
			mixed + " mixes keys of the agent's configuration (replica) with the proxy's (replica_sets): the proxy and the agent read separate files; check an agent's file with keyway agent --check -c FILE"},
		{[]string{"validate", "-c", badAgent}, badAgent + `:1: replica.addr: "127.0.0.1:99999" has an invalid port: use 1 to 65535`,
			"(" + badAgent + " was checked as an agent's configuration, as keyway agent -c " + badAgent + " reads it, because of its keys replica)"},
	} {
		out, _, err := keywayCLI(t, tc.args...)
		if err == nil || exitCode(err) != exitConfig || out != "" {
			t.Errorf("%v: %v (exit %d), stdout %q; want exit 2", tc.args, err, exitCode(err), out)
			continue
		}
		if first, _, _ := strings.Cut(err.Error(), "\n"); first != tc.first || !strings.Contains(err.Error(), tc.has) {
			t.Errorf("%v:\n%s\nwant the first line %q and %q", tc.args, err, tc.first, tc.has)
		}
	}
	t.Setenv("KEYWAY_AGENT_REPLICA_NAME", "orders-7") // validate reads an agent's file as the agent does
	out, _, err := keywayCLI(t, "validate", "-c", agentFile)
	if err != nil || !strings.HasPrefix(out, "ok: agent file for keyway agent -c "+agentFile+": replica orders/orders-7 at 127.0.0.1:9001") {
		t.Fatalf("validate %s: %q, %v", agentFile, out, err)
	}
}

// --replicas 0 is a count out of range, not a missing flag.
func TestScaleReplicasFlag(t *testing.T) {
	t.Setenv("KEYWAY_ADMIN_TOKEN", "t")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "orders"}, "keyway scale needs --set SET and --replicas N (N from 1 to 1000)"},
		{[]string{"--replicas", "3"}, "keyway scale needs --set SET and --replicas N (N from 1 to 1000)"},
		{[]string{"--set", "orders", "--replicas", "0"}, "--replicas 0: the declared replica count must be 1 to 1000 (to stop a set, use keyway stop --set orders)"},
		{[]string{"--set", "orders", "--replicas", "-2"}, "--replicas -2: the declared replica count must be 1 to 1000"},
		{[]string{"--set", "orders", "--replicas", "1001"}, "--replicas 1001: the declared replica count must be 1 to 1000"},
	} {
		_, _, err := keywayCLI(t, append([]string{"scale", "--admin", "127.0.0.1:9"}, tc.args...)...)
		if err == nil || exitCode(err) != exitConfig || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("scale %v: %v (exit %d), want exit 2 and %q", tc.args, err, exitCode(err), tc.want)
		}
	}
}

// The commands that need the admin token are those whose synopsis takes
// --token-file, and those have the flag; the demo's banner and the
// operations guide list every one of them.
func TestTokenCommands(t *testing.T) {
	need := tokenCommands()
	if len(need) < 11 || !slices.Contains(need, "drain") || !slices.Contains(need, "runtime clear") || slices.Contains(need, "status") {
		t.Fatalf("tokenCommands() = %q", need)
	}
	hasFlag := func(args ...string) bool {
		out, _, err := keywayCLI(t, append(args, "--help")...)
		if err != nil {
			t.Fatalf("%v --help: %v", args, err)
		}
		return regexp.MustCompile(`(?m)^  -token-file FILE$`).MatchString(out)
	}
	for _, name := range need {
		if !hasFlag(strings.Fields(name)...) {
			t.Errorf("keyway %s: its synopsis takes --token-file, its flags do not", name)
		}
	}
	for _, cmd := range commands(t) {
		if !slices.ContainsFunc(need, func(n string) bool { return strings.Fields(n)[0] == cmd }) && hasFlag(cmd) {
			t.Errorf("keyway %s has --token-file, but its synopsis does not say so", cmd)
		}
	}

	var banner strings.Builder
	printDemoHelp(&banner, demoConfig(t), "127.0.0.1:8080", "127.0.0.1:9901", "/tmp/keyway-demo-1/admin-token")
	if want := "admin token for this run (for " + strings.Join(need, ", ") + "): /tmp/keyway-demo-1/admin-token\n"; !strings.Contains(banner.String(), want) {
		t.Errorf("the demo's banner:\n%s\nwant the line %q", banner.String(), want)
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "The commands that change something (`" + strings.Join(need, "`, `") + "`) need\nthe admin token"
	if !strings.Contains(strings.ReplaceAll(string(ops), "\n", " "), strings.ReplaceAll(want, "\n", " ")) {
		t.Errorf("docs/operations.md does not say %q", want)
	}
}

// demoConfig is the demo's embedded configuration.
func demoConfig(t *testing.T) config.Config {
	t.Helper()
	cfg, err := config.LoadBytes(demo.ConfigName, demo.ConfigYAML)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
