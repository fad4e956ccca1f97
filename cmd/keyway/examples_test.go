package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
	"keyway/internal/testnet"
)

// notExamples are the lines of a usage shaped like an example that are
// not commands to run: version's sample output.
var notExamples = []string{"keyway v1.2.0 commit 0123456789ab built 2026-11-30T19:00:00Z go1.26.8"}

// usageExample is one example command of a command's usage.
type usageExample struct {
	cmd  string   // the command whose usage shows it
	line string   // as written, continuation lines joined
	args []string // the words after "keyway"
}

// usageExamples extracts the examples of every command's --help: the
// lines indented by two spaces that start with "keyway COMMAND" (COMMAND
// a command of topUsage), with their continuation lines (a line ending in
// a backslash goes on on the next). A line shaped like an example whose
// second word is not a command is an error unless notExamples lists it: a
// misspelt command in an example must not go unnoticed.
func usageExamples(t *testing.T) []usageExample {
	t.Helper()
	cmds := commands(t)
	var out []usageExample
	for _, cmd := range cmds {
		help, _, err := keywayCLI(t, cmd, "--help")
		if err != nil {
			t.Fatalf("%s --help: %v", cmd, err)
		}
		lines := strings.Split(help, "\n")
		for i := 0; i < len(lines); i++ {
			l := lines[i]
			if !strings.HasPrefix(l, "  keyway ") {
				continue
			}
			line := strings.TrimSpace(l)
			for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
			}
			words := strings.Fields(line)
			switch {
			case slices.Contains(notExamples, line):
				continue
			case len(words) < 2 || !slices.Contains(cmds, words[1]):
				t.Errorf("keyway %s --help shows %q, which is no keyway command: fix it, or list it in notExamples", cmd, line)
				continue
			}
			for _, w := range words {
				if strings.ContainsAny(w, `'"$*?<>|&;`) {
					t.Fatalf("example %q: %q needs a shell; the test runs examples without one", line, w)
				}
			}
			out = append(out, usageExample{cmd: cmd, line: line, args: words[1:]})
		}
	}
	return out
}

// Every example of every command's --help runs as written, with the
// environment it needs: a proxy for the commands that ask one (KEYWAY_ADMIN
// names it), a proxy whose gossip an agent joins, an empty directory for
// keyway certs, the repository's root for a file under examples/. The
// commands run as the real program (this test binary is keyway when
// KEYWAYTEST_AS_KEYWAY is set; "keyway" on the PATH of what they start is
// it too). A long-running command (proxy, agent, demo) counts as running
// once it is ready, then the test stops it (SIGTERM to the PID it started)
// and wants exit 0.
//
// Ports: the examples name the ports of a single machine's setup
// (127.0.0.1:7946 for the proxy's gossip, 127.0.0.1:9001 for a replica);
// the test substitutes free loopback ports for those, and sets the
// listeners the examples leave at their defaults (the agent's
// 127.0.0.1:9902, the proxy's :8080 and 127.0.0.1:9901) to port 0 on
// loopback through the environment, so that it never binds a fixed port
// or a public address.
func TestUsageExamplesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every example of every usage, agents and a proxy among them")
	}
	if runtime.GOOS == "windows" {
		t.Skip("stops long-running examples with SIGTERM")
	}
	examples := usageExamples(t)
	seen := map[string]bool{}
	for _, ex := range examples {
		seen[ex.cmd] = true
	}
	for _, cmd := range []string{"agent", "certs", "status", "route", "plan", "proxy"} {
		if !seen[cmd] {
			t.Errorf("keyway %s --help shows no example", cmd)
		}
	}

	// "keyway" on the PATH is this binary.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(exe, filepath.Join(bin, "keyway")); err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The proxy of the commands that ask one, shared: they change nothing.
	orders := stacktest.StartOrders(t)

	for i, ex := range examples {
		t.Run(fmt.Sprintf("%d-%s", i, ex.cmd), func(t *testing.T) {
			t.Logf("example of keyway %s --help: %s", ex.cmd, ex.line)
			r := exampleRun{bin: bin, dir: t.TempDir(), args: slices.Clone(ex.args)}
			switch ex.cmd {
			case "status", "route", "plan", "members", "jobs", "runtime":
				r.env = []string{"KEYWAY_ADMIN=" + orders.Admin}
				r.run(t)
			case "certs":
				r.run(t) // in an empty directory
			case "audit":
				// A trail of two proxies' runs, where the proxies'
				// environment says it is.
				r.env = []string{"KEYWAY_AUDIT_SINK=" + writeSampleTrail(t).dir}
				r.run(t)
			case "proxy":
				r.dir = root // -c examples/...
				r.env = []string{"KEYWAY_LISTEN=127.0.0.1:0", "KEYWAY_ADMIN_LISTEN=127.0.0.1:0"}
				r.serve(t, func(stderr string) bool {
					m := regexp.MustCompile(`"msg":"admin listening","addr":"([^"]+)"`).FindStringSubmatch(stderr)
					return m != nil && httpOK("http://"+m[1]+"/readyz")
				})
			case "agent":
				runAgentExample(t, r)
			default:
				t.Fatalf("no environment for the examples of keyway %s: add one to this test", ex.cmd)
			}
		})
	}
}

// runAgentExample runs an agent example against a proxy of its own whose
// set orders has no replica yet; ready is that replica in its rotation.
// The example's replica address gets a free port: a demo replica listens
// there, unless the agent starts one itself (-- keyway replica ...).
func runAgentExample(t *testing.T, r exampleRun) {
	cfg, err := config.LoadBytes("agent-example.yaml", []byte(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast}
replica_sets:
  - name: orders
    replicas: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	px := stacktest.StartProxy(t, cfg, stacktest.Opts{Gossip: true})
	replica := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	if !slices.Contains(r.args, "--") {
		replica, _ = stacktest.StartDemoReplica(t, "orders-example")
	}
	for i, a := range r.args {
		switch a {
		case "127.0.0.1:7946":
			r.args[i] = px.Gossip
		case "127.0.0.1:9001":
			r.args[i] = replica
		}
	}
	r.env = []string{"KEYWAY_AGENT_LISTEN=127.0.0.1:0"}
	r.serve(t, func(string) bool {
		return strings.Contains(stacktest.Get("http://"+px.Admin+"/metrics"), `keyway_rotation_replicas{set="orders"} 1`+"\n")
	})
}

// exampleRun is one example run as a process of this binary as keyway.
type exampleRun struct {
	bin, dir string
	args     []string
	env      []string // beyond the test's
}

func (r exampleRun) command() (*exec.Cmd, *stacktest.SyncBuffer, *stacktest.SyncBuffer) {
	cmd := exec.Command(filepath.Join(r.bin, "keyway"), r.args...)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), r.env...)
	cmd.Env = append(cmd.Env, "PATH="+r.bin+string(os.PathListSeparator)+os.Getenv("PATH"), asKeyway+"=1")
	stdout, stderr := &stacktest.SyncBuffer{}, &stacktest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd, stdout, stderr
}

// run runs a command that ends by itself, and wants exit 0.
func (r exampleRun) run(t *testing.T) {
	t.Helper()
	cmd, stdout, stderr := r.command()
	if err := cmd.Run(); err != nil {
		t.Fatalf("keyway %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), err, stdout, stderr)
	}
	t.Logf("output:\n%s", stdout)
}

// serve starts a long-running command, waits (30 s at most) until ready
// says it is, given its stderr so far, then stops it with SIGTERM and
// wants exit 0 within 30 s. It kills the process it started if the test
// ends before.
func (r exampleRun) serve(t *testing.T, ready func(stderr string) bool) {
	t.Helper()
	cmd, stdout, stderr := r.command()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill() // the process this test started, by its PID
			<-done
		}
	})
	gone := false
	poll.Until(t, 30*time.Second, "keyway "+strings.Join(r.args, " ")+" to be ready", func() bool {
		select {
		case <-done:
			gone = true
			return true
		default:
		}
		return ready(stderr.String())
	})
	if gone {
		t.Fatalf("keyway %s exited before it was ready: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), waitErr, stdout, stderr)
	}
	t.Logf("ready; stopping PID %d", cmd.Process.Pid)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("keyway %s after SIGTERM: %v\nstderr:\n%s", strings.Join(r.args, " "), waitErr, stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("keyway %s did not exit within 30s of SIGTERM\nstderr:\n%s", strings.Join(r.args, " "), stderr)
	}
}

// httpOK reports whether GET url answers 200.
func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
