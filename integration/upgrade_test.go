//go:build unix

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/internal/testnet"
)

// fleetYAML makes proxies exchange views fast and call a difference a
// disagreement after 1s.
const fleetYAML = "fleet: {interval: 200ms, disagreement_bound: 1s}\n"

// killUpgraded kills, at the end of the test, the process an upgrade of
// p started, which pidFile names: the test's too, by way of p.
func killUpgraded(t *testing.T, pidFile string, p *Proc) {
	t.Cleanup(func() {
		if pid := readPID(pidFile); pid != 0 && pid != p.Pid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// readPID returns the PID in file, or 0.
func readPID(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// watchAgreement polls a proxy's fleet view until stop and returns what
// it saw disagree (another proxy routing a set differently) or flap (its
// other proxies other than the one proxy ID peer).
func watchAgreement(t *testing.T, adminAddr, peer string, stop <-chan struct{}) func() []string {
	var mu sync.Mutex
	var seen []string
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			fs := fleetOf(t, adminAddr)
			if !fs.Agree || len(fs.Proxies) != 1 || fs.Proxies[0].ID != peer {
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%s: proxies %+v, sets %+v", time.Now().Format("15:04:05.000"), fs.Proxies, fs.Sets))
				mu.Unlock()
			}
		}
	})
	return func() []string { wg.Wait(); mu.Lock(); defer mu.Unlock(); return seen }
}

// A binary upgrade (SIGUSR2) under 1,000 keyed POSTs a second loses no
// request: no error, no connection error, every key answered by its owner
// before, during and after; the old process exits once drained; another
// proxy of the cluster sees no disagreement and takes nothing over.
func TestUpgradeUnderLoadLosesNothing(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	b := StartProxyWith(t, "proxy-b", nil, 3, fleetYAML)
	for i := range 3 {
		StartReplica(t, fmt.Sprintf("orders-%d", i), []string{b.Gossip})
	}
	b.WaitRotation(t, 3, 20*time.Second)

	dir := t.TempDir()
	pidFile := filepath.Join(dir, "proxy-a.pid")
	// A fixed gossip port, as in production: the old process holds it
	// until it exits; the new one gossips from a free port meanwhile and
	// moves to it then.
	gossipPort := testnet.FreePort(t)
	cfg := WriteFile(t, dir, "proxy-a.yaml", strings.Replace(proxyYAML([]string{b.Gossip}, 3, fleetYAML+"server: {drain_idle: 2s}\n"),
		"bind_port: 0", fmt.Sprintf("bind_port: %d", gossipPort), 1))
	a := StartLogged(t, "proxy-a", "proxy", "-c", cfg, "--pid-file", pidFile)
	killUpgraded(t, pidFile, a)
	addr := a.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	adminAddr := a.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	pa := &ProxyProc{Proc: a, Addr: addr, Admin: adminAddr}
	pa.WaitRotation(t, 3, 20*time.Second)
	poll.Until(t, 10*time.Second, "the PID file", func() bool { return readPID(pidFile) == a.Pid() })
	poll.Until(t, 10*time.Second, "the two proxies to hear each other", func() bool {
		return len(fleetOf(t, b.Admin).Proxies) == 1 && len(fleetOf(t, adminAddr).Proxies) == 1
	})

	keys := Keys(300)
	c := NewClient()
	owners := c.Owners(t, b.Addr, keys, 8)
	if via := c.Owners(t, addr, keys, 8); fmt.Sprint(via) != fmt.Sprint(owners) {
		t.Fatal("the two proxies route keys differently before the upgrade")
	}

	id := fleetOf(t, adminAddr).Self
	if got := fleetOf(t, b.Admin).Proxies[0].ID; got != id {
		t.Fatalf("the other proxy knows proxy-a as %q, proxy-a says it is %q", got, id)
	}
	stopWatch := make(chan struct{})
	disagreements := watchAgreement(t, b.Admin, id, stopWatch)
	load := StartLoad(func() string { return addr }, keys, owners, 1000)
	poll.Until(t, 10*time.Second, "1,000 requests before the upgrade", func() bool { n, _ := load.Counts(); return n >= 1000 })

	old := a.Pid()
	if err := syscall.Kill(old, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 70*time.Second, "the new process to be ready (PID file)", func() bool { p := readPID(pidFile); return p != 0 && p != old })
	sent, _ := load.Counts()
	start := time.Now()
	poll.Until(t, 10*time.Second, "the old process to exit", a.Exited)
	exitAfter := time.Since(start)
	if err := a.err; err != nil {
		t.Fatalf("the old process exited with %v", err)
	}
	moved := a.WaitLine(t, logField("gossip moved", "addr"), 20*time.Second)[1]
	if want := fmt.Sprintf("127.0.0.1:%d", gossipPort); moved != want {
		t.Errorf("the new process moved its gossip to %s, want the configured %s", moved, want)
	}
	poll.Until(t, 10*time.Second, "1,000 requests after the old process exited", func() bool { n, _ := load.Counts(); return n >= sent+1000 })
	total, failures := load.Stop()
	close(stopWatch)
	if failures != "" {
		t.Errorf("requests lost across the upgrade: %s", failures)
	}
	t.Logf("%d requests, the old process exited %v after the new one was ready", total, exitAfter.Round(time.Millisecond))

	// After: the same addresses serve, from the new process.
	if via := c.Owners(t, addr, keys, 8); fmt.Sprint(via) != fmt.Sprint(owners) {
		t.Error("the new process routes keys differently")
	}
	if fs := fleetOf(t, adminAddr); !fs.Agree || fs.Self != id {
		t.Errorf("the new process (%s) disagrees with the fleet, or is not %s: %+v", fs.Self, id, fs.Sets)
	}
	if d := disagreements(); len(d) > 0 {
		t.Errorf("the other proxy saw a disagreement, or another proxy than %s, during the upgrade: %v", id, d)
	}
	for _, msg := range []string{"another proxy routes a replica set differently, for longer than fleet.disagreement_bound: some keys go to different replicas",
		"rolling restart taken over: the proxy running it left the fleet", "member dead"} {
		if l := b.Logs(msg); len(l) > 0 {
			t.Errorf("the other proxy logged %q: %v", msg, l)
		}
	}
	// The old process left, and the new one's member on a free port when
	// it moved: leaves, not deaths, in the other proxy's audit trail.
	var events struct {
		Events []map[string]any `json:"events"`
	}
	stacktest.GetJSON(t, "http://"+b.Admin+"/v1/events?kind=member_leave,member_dead", &events)
	leaves := 0
	for _, e := range events.Events {
		if e["role"] != "proxy" {
			continue
		}
		if e["kind"] == "member_dead" {
			t.Errorf("the other proxy recorded a proxy process dead: %v", e)
		} else {
			leaves++
		}
	}
	if leaves != 2 {
		t.Errorf("the other proxy recorded %d proxy leaves, want 2 (the old process, and the new one's member on a free port when it moved): %+v", leaves, events.Events)
	}
	if l := a.Logs("upgrade: the new process serves; this one stops accepting and drains"); len(l) != 1 {
		t.Errorf("the old process's log of the handover: %v", l)
	}
}

// An upgrade whose new process cannot start (here its configuration file
// became invalid) changes nothing: the old process says so, goes on
// serving every request, and a later upgrade (the file fixed) works.
func TestFailedUpgradeKeepsServing(t *testing.T) {
	skipShort(t)
	_, repAddr := StartReplicaProcess(t, "orders-0")
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "proxy.pid")
	good := fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
server: {drain_idle: 1s}
replica_sets:
  - name: orders
    replicas: 1
    key: [{header: X-Key}]
    static: [{name: orders-0, addr: %q}]
`, repAddr)
	cfg := WriteFile(t, dir, "proxy.yaml", good)
	a := StartLogged(t, "proxy", "proxy", "-c", cfg, "--pid-file", pidFile)
	killUpgraded(t, pidFile, a)
	addr := a.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	poll.Until(t, 10*time.Second, "the PID file", func() bool { return readPID(pidFile) == a.Pid() })

	load := StartLoad(func() string { return addr }, Keys(50), nil, 500)
	WriteFile(t, dir, "proxy.yaml", good+"    bogus_key: 1\n")
	if err := syscall.Kill(a.Pid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	a.WaitLine(t, regexp.MustCompile(`"msg":"upgrade failed; this process goes on serving"`), 70*time.Second)
	if a.Exited() || readPID(pidFile) != a.Pid() {
		t.Fatal("the old process stopped, or handed over, after a failed upgrade")
	}
	sent, _ := load.Counts()
	poll.Until(t, 10*time.Second, "500 requests after the failed upgrade", func() bool { n, _ := load.Counts(); return n >= sent+500 })

	WriteFile(t, dir, "proxy.yaml", good)
	if err := syscall.Kill(a.Pid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 70*time.Second, "the new process to serve", func() bool { p := readPID(pidFile); return p != 0 && p != a.Pid() })
	poll.Until(t, 10*time.Second, "the old process to exit", a.Exited)
	sent, _ = load.Counts()
	poll.Until(t, 10*time.Second, "500 requests after the upgrade", func() bool { n, _ := load.Counts(); return n >= sent+500 })
	if total, failures := load.Stop(); failures != "" {
		t.Errorf("requests lost across a failed and a good upgrade (%d sent): %s", total, failures)
	}
}
