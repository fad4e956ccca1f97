//go:build unix

package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/slow"
)

// A plain SIGTERM under 1,000 keyed POSTs a second: the proxy stops
// accepting at once, answers every request that reached it (keep-alive
// connections get Connection: close and their clients reconnect, to a
// closed port here: nothing else listens), and exits as soon as no
// connection is left, within its drain grace.
func TestSIGTERMUnderLoadAnswersWhatArrivedAndExits(t *testing.T) {
	skipShort(t)
	b := StartProxyWith(t, "proxy-b", nil, 3, "")
	for i := range 3 {
		StartReplica(t, fmt.Sprintf("orders-%d", i), []string{b.Gossip})
	}
	a := StartProxyWith(t, "proxy-a", []string{b.Gossip}, 3, "server: {drain_idle: 2s}\n")
	a.WaitRotation(t, 3, 20*time.Second)

	load := StartLoad(func() string { return a.Addr }, Keys(300), nil, 1000)
	poll.Until(t, 10*time.Second, "1,000 requests", func() bool { n, _ := load.Counts(); return n >= 1000 })
	start := time.Now()
	if err := syscall.Kill(a.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, "the proxy to exit", a.Exited)
	took := time.Since(start)
	if err := a.err; err != nil {
		t.Fatalf("exit: %v", err)
	}
	sent, _ := load.Counts()
	poll.Until(t, 10*time.Second, "500 more requests", func() bool { n, _ := load.Counts(); return n >= sent+500 })
	total, summary := load.Stop()
	// Refused: sent after the listener closed. Anything else reached
	// keyway and was lost.
	if n := load.FailedExcept("connection refused"); n != 0 {
		t.Errorf("%d requests that reached keyway failed: %s", n, summary)
	}
	t.Logf("%d requests (%s); exited %v after SIGTERM, drain_idle 2s", total, summary, took.Round(time.Millisecond))
}

// Socket activation as systemd does it: the test holds the listening
// sockets and starts keyway with them as fds 3 and 4 (LISTEN_FDS,
// LISTEN_FDNAMES proxy:admin, LISTEN_PID). Under 1,000 keyed POSTs a
// second, the proxy is stopped (SIGTERM, waited for) and a new one started
// on the same sockets: nothing is refused, and every request is answered,
// those sent in the gap once the new process serves. Then the new one is
// upgraded (SIGUSR2): the sockets systemd passed pass on too.
func TestSocketActivationRestartUnderLoad(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	var static string
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		_, addr := StartReplicaProcess(t, name)
		static += fmt.Sprintf("      - {name: %s, addr: %q}\n", name, addr)
	}
	hold := func() (*os.File, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		f, err := ln.(*net.TCPListener).File()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f, ln.Addr().String()
	}
	sock, addr := hold()
	adminSock, adminAddr := hold()
	// listen names the proxy socket's address; admin.listen names
	// another address: systemd's name for the socket decides.
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "proxy.pid")
	cfg := WriteFile(t, dir, "proxy.yaml", fmt.Sprintf(`listen: %q
admin: {listen: "127.0.0.1:1"}
log: {level: info, format: json}
server: {drain_idle: 1s}
replica_sets:
  - name: orders
    replicas: 3
    key: [{header: X-Key}]
    static:
%s`, addr, static))
	start := func(name string) *Proc {
		p := StartActivated(t, name, []*os.File{sock, adminSock}, "proxy:admin", "proxy", "-c", cfg, "--pid-file", pidFile)
		if got := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]; got != addr {
			t.Fatalf("%s listens on %s, not on the socket it was given (%s)", name, got, addr)
		}
		if got := p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]; got != adminAddr {
			t.Fatalf("%s's admin API listens on %s, not on the socket it was given (%s)", name, got, adminAddr)
		}
		return p
	}
	first := start("proxy-1")
	keys := Keys(300)
	owners := NewClient().Owners(t, addr, keys, 8)

	load := StartLoad(func() string { return addr }, keys, owners, 1000)
	poll.Until(t, 10*time.Second, "1,000 requests", func() bool { n, _ := load.Counts(); return n >= 1000 })
	if err := syscall.Kill(first.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, "the first process to exit", first.Exited)
	if err := first.err; err != nil {
		t.Fatalf("the first process: %v", err)
	}
	stopped := time.Now()
	sent, _ := load.Counts()
	second := start("proxy-2")
	poll.Until(t, 10*time.Second, "1,000 requests after the restart", func() bool { n, _ := load.Counts(); return n >= sent+1000 })
	if _, failed := load.Counts(); failed != 0 {
		_, failures := load.Stop()
		t.Fatalf("requests lost across a stop and start on one socket: %s", failures)
	}
	served := second.servedAfter(stopped)

	killUpgraded(t, pidFile, second)
	poll.Until(t, 10*time.Second, "the PID file", func() bool { return readPID(pidFile) == second.Pid() })
	if err := syscall.Kill(second.Pid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 70*time.Second, "the upgrade's new process to serve", func() bool { p := readPID(pidFile); return p != 0 && p != second.Pid() })
	poll.Until(t, 10*time.Second, "the upgraded process to exit", second.Exited)
	sent, _ = load.Counts()
	poll.Until(t, 10*time.Second, "1,000 requests after the upgrade", func() bool { n, _ := load.Counts(); return n >= sent+1000 })
	total, failures := load.Stop()
	if failures != "" {
		t.Errorf("requests lost across the upgrade of a socket-activated proxy: %s", failures)
	}
	if got := Metric(adminAddr, "keyway_build_info", nil); got != 1 {
		t.Errorf("the admin API on the socket systemd passed, after the upgrade: keyway_build_info %v", got)
	}
	// A plain stop accepts through the drain while systemd holds the
	// socket, the upgrade's new process's too (it inherited the socket
	// from the old one, not from systemd); an upgrade's old process
	// stops accepting at once, as the new one accepts.
	third := readPID(pidFile)
	if err := syscall.Kill(third, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the upgraded process to exit", func() bool { return syscall.Kill(third, 0) != nil })
	accepting := func(p *Proc) (out []any) {
		for _, l := range p.Logs("proxy shutting down") {
			out = append(out, l["accepting_while_draining"])
		}
		return out
	}
	if got := accepting(first); !slices.Equal(got, []any{true}) {
		t.Errorf("the first process's stop: accepting_while_draining %v, want [true]", got)
	}
	// The second process's output carries the upgrade's new process's too.
	if got := accepting(second); !slices.Equal(got, []any{false, true}) {
		t.Errorf("the upgrade's old process, then the new one stopped: accepting_while_draining %v, want [false true]", got)
	}
	t.Logf("%d requests; the second process served %v after the first exited", total, served.Round(time.Millisecond))
}

// servedAfter is how long after t the process logged "proxy listening".
func (p *Proc) servedAfter(t time.Time) time.Duration {
	for _, l := range p.Logs("proxy listening") {
		if ts, ok := l["ts"].(string); ok {
			if at, err := time.Parse(time.RFC3339Nano, ts); err == nil {
				return at.Sub(t)
			}
		}
	}
	return -1
}
