//go:build unix

package integration

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
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
// socket and starts keyway with it as fd 3 (LISTEN_FDS, LISTEN_FDNAMES
// proxy, LISTEN_PID). Under 1,000 keyed POSTs a second, the proxy is
// stopped (SIGTERM, waited for) and a new one started on the same socket:
// nothing is refused, and every request is answered, those sent in the
// gap once the new process serves.
func TestSocketActivationRestartUnderLoad(t *testing.T) {
	skipShort(t)
	var static string
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		_, addr := StartReplicaProcess(t, name)
		static += fmt.Sprintf("      - {name: %s, addr: %q}\n", name, addr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sock, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	addr := ln.Addr().String()
	// listen names the socket's address; the name "proxy" would do alone.
	cfg := WriteFile(t, t.TempDir(), "proxy.yaml", fmt.Sprintf(`listen: %q
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
server: {drain_idle: 1s}
replica_sets:
  - name: orders
    replicas: 3
    key: [{header: X-Key}]
    static:
%s`, addr, static))
	start := func(name string) *Proc {
		p := StartActivated(t, name, []*os.File{sock}, "proxy", "proxy", "-c", cfg)
		if got := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]; got != addr {
			t.Fatalf("%s listens on %s, not on the socket it was given (%s)", name, got, addr)
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
	total, failures := load.Stop()
	if failures != "" {
		t.Errorf("requests lost across a stop and start on one socket: %s", failures)
	}
	t.Logf("%d requests; the second process served %v after the first exited", total, second.servedAfter(stopped).Round(time.Millisecond))
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
