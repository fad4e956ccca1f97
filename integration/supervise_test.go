package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
)

// freeAddr returns 127.0.0.1:PORT with a port that was free a moment ago:
// a supervising agent needs its replica's address before the replica runs.
//
// The port is drawn below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), which is where every bind to port 0
// draws from: between this call and the replica's bind, other processes
// of the test (the agents' gossip, other listeners) bind port 0, and one
// did take a port handed out from that range, so the replica could never
// start. Only when the range cannot be read, or no port below it is free,
// does it fall back to a port 0 bind.
func freeAddr(t testing.TB) string {
	t.Helper()
	if lo := ephemeralLow(); lo > 2048 {
		base := max(1024, lo-16384)
		for range 64 {
			addr := fmt.Sprintf("127.0.0.1:%d", base+rand.IntN(lo-base))
			if ln, err := net.Listen("tcp", addr); err == nil {
				ln.Close()
				return addr
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 0.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}

// SupervisedProc is a `keyway agent … -- CMD` process: an agent that runs
// its replica itself.
type SupervisedProc struct {
	*Proc
	Name, Addr string
}

// StartSupervised starts an agent for replica name at addr, with every
// key given as a flag (fast probes and gossip, short restart backoff; extra
// flags override), that runs and supervises command.
func StartSupervised(t testing.TB, name, addr string, join []string, extra []string, command ...string) *SupervisedProc {
	t.Helper()
	return &SupervisedProc{Proc: Start(t, name+"-agent", supervisedArgs(name, addr, join, extra, command...)...), Name: name, Addr: addr}
}

// supervisedArgs are the arguments of StartSupervised's agent.
func supervisedArgs(name, addr string, join []string, extra []string, command ...string) []string {
	args := []string{"agent",
		"--replica.set", "orders", "--replica.name", name, "--replica.addr", addr,
		"--probe.interval", "100ms", "--probe.timeout", "500ms", "--probe.rise", "2", "--probe.fall", "2",
		"--drain.timeout", "10s", "--listen", "127.0.0.1:0", "--log.format", "json",
		"--gossip.bind_addr", "127.0.0.1", "--gossip.bind_port", "0", "--gossip.profile", "fast",
		"--gossip.push_pull_interval", "2s", "--gossip.forget_after", "1m", "--gossip.rejoin_interval", "5s",
		"--supervise.backoff_min", "100ms", "--supervise.backoff_max", "400ms", "--supervise.stop_grace", "5s",
	}
	for _, j := range join {
		args = append(args, "--gossip.join", j)
	}
	args = append(args, extra...)
	return append(append(args, "--"), command...)
}

// StartSupervisedReplica starts a supervising agent whose command is a
// demo replica (the keyway binary) named name on a free port.
func StartSupervisedReplica(t testing.TB, name string, join []string, extra ...string) *SupervisedProc {
	t.Helper()
	addr := freeAddr(t)
	return StartSupervised(t, name, addr, join, extra, Binary, "replica", "--name", name, "--listen", addr)
}

// ChildPids returns the PIDs of the processes the agent started, in order
// ("replica process started" log lines).
func (s *SupervisedProc) ChildPids() []int {
	var out []int
	for _, l := range s.Logs("replica process started") {
		if pid, ok := l["pid"].(float64); ok {
			out = append(out, int(pid))
		}
	}
	return out
}

// processEvents returns a proxy's replica_process audit events for a
// replica, in the agent's order (seq).
func processEvents(t testing.TB, adminAddr, replica string) []map[string]any {
	t.Helper()
	var list struct {
		Events []map[string]any `json:"events"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/events?kind=replica_process", &list)
	var out []map[string]any
	for _, e := range list.Events {
		if e["replica"] == replica {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b map[string]any) int { return int(a["seq"].(float64) - b["seq"].(float64)) })
	return out
}

// describeEvents writes events as "start", "exit:exit_code:1",
// "exit:signal:SIGKILL", "restart", "give_up".
func describeEvents(evs []map[string]any) []string {
	var out []string
	for _, e := range evs {
		s := e["event"].(string)
		if s == "exit" {
			s += ":" + fmt.Sprint(e["reason"])
			if sig, ok := e["signal"]; ok {
				s += ":" + fmt.Sprint(sig)
			} else if code, ok := e["code"]; ok {
				s += ":" + fmt.Sprint(code)
			}
		}
		out = append(out, s)
	}
	return out
}

// supervisedCluster starts a proxy and three supervised demo replicas,
// all in rotation.
func supervisedCluster(t *testing.T) (*ProxyProc, []*SupervisedProc) {
	t.Helper()
	px := StartProxy(t, "proxy-a", nil, 3)
	var reps []*SupervisedProc
	for i := range 3 {
		reps = append(reps, StartSupervisedReplica(t, fmt.Sprintf("orders-%d", i), []string{px.Gossip}))
	}
	px.WaitRotation(t, 3, 30*time.Second)
	return px, reps
}

// A replica process killed with SIGKILL is restarted by its agent under
// the same name, back in rotation on its own, with exactly its keys.
func TestSupervisedReplicaRestartsAfterKill(t *testing.T) {
	skipShort(t)
	px, reps := supervisedCluster(t)
	c := NewClient()
	keys := Keys(300)
	before := c.Owners(t, px.Addr, keys, 8)
	victim := reps[1]
	owned := 0
	for _, k := range keys {
		if before[k] == victim.Name {
			owned++
		}
	}
	if owned == 0 {
		t.Fatalf("no key owned by %s", victim.Name)
	}
	pids := victim.ChildPids()
	if len(pids) != 1 {
		t.Fatalf("%s's agent started %d processes, want 1", victim.Name, len(pids))
	}
	// The replica passes its output through the agent.
	victim.WaitLine(t, regexp.MustCompile(`^replica orders-1 listening on `+regexp.QuoteMeta(victim.Addr)+`$`), 10*time.Second)

	killed := time.Now()
	kill(t, pids[0], syscall.SIGKILL)
	poll.Until(t, 20*time.Second, "a second process", func() bool { return len(victim.ChildPids()) == 2 })
	restartedIn := time.Since(killed)
	poll.Until(t, 20*time.Second, "orders-1 ready again on the agent", func() bool {
		n := 0
		for _, l := range victim.Logs("replica state changed") {
			if l["to"] == "ready" {
				n++
			}
		}
		return n == 2
	})
	readyIn := time.Since(killed)
	poll.Until(t, 20*time.Second, "orders-1 ready and in rotation on the proxy", func() bool {
		state, _, in, ok := setReplica(t, px.Admin, victim.Name)
		return ok && state == "ready" && in && px.InRotation() == 3
	})
	rotationIn := time.Since(killed)
	t.Logf("SIGKILL to the replica process: new process in %s, advertised ready in %s, back in the proxy's rotation in %s",
		restartedIn.Round(time.Millisecond), readyIn.Round(time.Millisecond), rotationIn.Round(time.Millisecond))

	exits := victim.Logs("replica process exited")
	if len(exits) != 1 || exits[0]["reason"] != "signal" || exits[0]["signal"] != "SIGKILL" || int(exits[0]["pid"].(float64)) != pids[0] {
		t.Fatalf("exit log: %v", exits)
	}
	after := c.Owners(t, px.Addr, keys, 8)
	for _, k := range keys {
		if after[k] != before[k] {
			t.Fatalf("key %s: %s before the kill, %s after the restart", k, before[k], after[k])
		}
	}
	s, _, err := (&admin.Client{Addr: px.Admin}).Set("orders")
	if err != nil {
		t.Fatal(err)
	}
	if s.Phase != "Running" || s.RingSize != 3 {
		t.Fatalf("after the restart: phase %s, ring %d", s.Phase, s.RingSize)
	}
	t.Logf("%d keys, %d of them %s's: every key with the same replica after the restart", len(keys), owned, victim.Name)

	var evs []string
	poll.Until(t, 10*time.Second, "the proxy's audit trail to show the kill and the restart", func() bool {
		evs = describeEvents(processEvents(t, px.Admin, victim.Name))
		return slices.Equal(evs, []string{"start", "exit:signal:SIGKILL", "restart", "start"})
	})
	if v := Metric(agentHTTP(t, victim), "keyway_agent_child_exits_total", map[string]string{"reason": "signal"}); v != 1 {
		t.Fatalf("keyway_agent_child_exits_total{reason=signal} = %v", v)
	}
}

// agentHTTP returns the agent's own HTTP address (its "agent started"
// line).
func agentHTTP(t testing.TB, s *SupervisedProc) string {
	t.Helper()
	return s.WaitLine(t, logField("agent started", "http"), 10*time.Second)[1]
}

// A process that keeps exiting makes its agent give up: the proxy sees the
// replica failed, the set Degraded, and its audit trail has every start,
// exit and restart, and the give-up.
func TestSupervisedReplicaGivesUp(t *testing.T) {
	skipShort(t)
	px := StartProxy(t, "proxy-a", nil, 3)
	for i := range 2 {
		StartSupervisedReplica(t, fmt.Sprintf("orders-%d", i), []string{px.Gossip})
	}
	px.WaitRotation(t, 2, 30*time.Second)
	start := time.Now()
	bad := StartSupervised(t, "orders-2", freeAddr(t), []string{px.Gossip},
		[]string{"--supervise.max_restarts", "3", "--supervise.backoff_min", "50ms", "--supervise.backoff_max", "200ms", "--supervise.window", "1m"},
		"/bin/sh", "-c", "echo orders-2 crashing >&2; exit 1")
	poll.Until(t, 30*time.Second, "the proxy to see orders-2 failed", func() bool {
		state, _, in, ok := setReplica(t, px.Admin, "orders-2")
		return ok && state == "failed" && !in
	})
	failedIn := time.Since(start)
	s, _, err := (&admin.Client{Addr: px.Admin}).Set("orders")
	if err != nil {
		t.Fatal(err)
	}
	if s.Phase != "Degraded" || s.InRotation != 2 {
		t.Fatalf("set: phase %s, %d in rotation; want Degraded with 2", s.Phase, s.InRotation)
	}
	if got := len(bad.Logs("replica process started")); got != 4 {
		t.Fatalf("%d starts, want 4 (the first and max_restarts 3)", got)
	}
	bad.WaitLine(t, regexp.MustCompile(`^orders-2 crashing$`), 5*time.Second) // stderr passed through

	want := []string{"start", "exit:exit_code:1", "restart", "start", "exit:exit_code:1", "restart",
		"start", "exit:exit_code:1", "restart", "start", "exit:exit_code:1", "give_up"}
	var evs []map[string]any
	poll.Until(t, 10*time.Second, "the proxy's audit trail to hold the whole story", func() bool {
		evs = processEvents(t, px.Admin, "orders-2")
		return slices.Equal(describeEvents(evs), want)
	})
	last := evs[len(evs)-1]
	if last["restarts"] != 3.0 {
		t.Fatalf("give_up event: %v", last)
	}
	for i, e := range evs {
		if e["event"] == "restart" {
			if b, _ := time.ParseDuration(e["backoff"].(string)); b < 50*time.Millisecond || b >= 250*time.Millisecond {
				t.Fatalf("event %d: backoff %s, want 50ms to 250ms", i, b)
			}
		}
	}
	b, _ := json.Marshal(last)
	t.Logf("orders-2 failed on the proxy %s after its agent started (4 runs of a command that exits 1 at once, backoff 50ms to 200ms); last audit event %s",
		failedIn.Round(time.Millisecond), b)
	agentAddr := agentHTTP(t, bad)
	if v := Metric(agentAddr, "keyway_agent_child_gave_up_total", nil); v != 1 {
		t.Fatalf("keyway_agent_child_gave_up_total = %v", v)
	}
	if v := Metric(agentAddr, "keyway_agent_state", map[string]string{"state": "failed"}); v != 1 {
		t.Fatalf("keyway_agent_state{state=failed} = %v", v)
	}
	// Failed stays failed (the agent waits for a repair), and SIGTERM
	// still ends the agent cleanly.
	bad.Term(t, 30*time.Second)
}

// SIGTERM to a supervising agent drains the replica first (no request
// fails), then stops its process, then advertises stopped and exits.
func TestSupervisedReplicaStopsAfterDrain(t *testing.T) {
	skipShort(t)
	px, reps := supervisedCluster(t)
	victim := reps[2]
	pid := victim.ChildPids()[0]

	c := NewClient()
	var stop atomic.Bool
	var sent atomic.Int64
	var mu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				code, _, err := c.Send(px.Addr, key)
				sent.Add(1)
				if err != nil || code != 200 {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %d %v", key, code, err))
					mu.Unlock()
				}
			}
		}()
	}
	poll.Until(t, 10*time.Second, "some load", func() bool { return sent.Load() > 200 })
	termAt := time.Now()
	victim.Term(t, 30*time.Second)
	exitIn := time.Since(termAt)
	poll.Until(t, 10*time.Second, "the proxy to route without orders-2", func() bool { return px.InRotation() == 2 })
	stop.Store(true)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed while orders-2's agent stopped, e.g. %v", len(failures), sent.Load(), failures[:min(5, len(failures))])
	}
	if gone, err := processGone(pid); !gone {
		t.Fatalf("the replica process %d is still there after its agent exited (kill 0: %v)", pid, err)
	}

	// The order, in the agent's log: drained, process stopped (SIGTERM,
	// it exited), then stopped advertised.
	order := logOrder(victim.Proc, "replica drained", "stopping replica process", "replica process exited", "replica state changed:stopped")
	if want := []string{"replica drained", "stopping replica process", "replica process exited", "replica state changed:stopped"}; !slices.Equal(order, want) {
		t.Fatalf("shutdown order %v, want %v", order, want)
	}
	ex := victim.Logs("replica process exited")
	if len(ex) != 1 || ex[0]["reason"] != "stop" || ex[0]["code"] != 0.0 || ex[0]["killed"] != nil {
		t.Fatalf("exit: %v", ex)
	}
	t.Logf("SIGTERM to the supervising agent under load: exited after %s, %d requests, none failed", exitIn.Round(time.Millisecond), sent.Load())
}

// logOrder returns, in log order, which of the given messages the process
// logged; "msg:to" stands for a "replica state changed" line to that state.
func logOrder(p *Proc, msgs ...string) []string {
	p.mu.Lock()
	lines := slices.Clone(p.lines)
	p.mu.Unlock()
	var out []string
	for _, l := range lines {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		for _, want := range msgs {
			msg, to, hasTo := cutLast(want, ":")
			if m["msg"] == msg && (!hasTo || m["to"] == to) {
				out = append(out, want)
			}
		}
	}
	return out
}

func cutLast(s, sep string) (string, string, bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// A replica that gave up comes back with a repair: its process keeps
// failing until the operator fixes it (here: a file appears), then
// keyway repair, asked of a proxy, makes its agent start it again; it is
// back in rotation and the set Running.
func TestRepairRestartsAReplicaThatGaveUp(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	px := StartProxy(t, "proxy-a", nil, 3)
	for i := range 2 {
		StartSupervisedReplica(t, fmt.Sprintf("orders-%d", i), []string{px.Gossip})
	}
	fixed := filepath.Join(t.TempDir(), "fixed")
	addr := freeAddr(t)
	StartSupervised(t, "orders-2", addr, []string{px.Gossip},
		[]string{"--supervise.max_restarts", "2", "--supervise.backoff_min", "50ms", "--supervise.backoff_max", "100ms", "--supervise.window", "1m"},
		"/bin/sh", "-c", `test -f "$1" || exit 1; exec "$2" replica --name orders-2 --listen "$3"`, "sh", fixed, Binary, addr)
	poll.Until(t, 30*time.Second, "orders-2 failed", func() bool {
		state, _, _, ok := setReplica(t, px.Admin, "orders-2")
		return ok && state == "failed"
	})
	if err := os.WriteFile(fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res, _, err := (&admin.Client{Addr: px.Admin, Token: "s3cret"}).Repair("orders")
	if err != nil || len(res.Failed) != 1 || len(res.Agents) != 3 {
		t.Fatalf("repair: %+v %v", res, err)
	}
	start := time.Now()
	px.WaitRotation(t, 3, 30*time.Second)
	t.Logf("repair: orders-2 back in rotation %s after the answer", time.Since(start).Round(time.Millisecond))
	s, _, err := (&admin.Client{Addr: px.Admin}).Set("orders")
	if err != nil || s.Phase != "Running" {
		t.Fatalf("after the repair: phase %s, %v", s.Phase, err)
	}
	poll.Until(t, 10*time.Second, "a repair event in the proxy's audit trail", func() bool {
		return slices.Contains(describeEvents(processEvents(t, px.Admin, "orders-2")), "repair")
	})
}
