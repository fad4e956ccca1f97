//go:build unix

package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.yaml.in/yaml/v3"

	"keyway/internal/flock"
	"keyway/internal/poll"
)

// The runner starts this test binary as its "keyway": with fakeAgentEnv
// set (the runner passes the environment on), it plays `keyway agent -c
// FILE -- CMD`: it takes the lock file as a real agent does, writes what
// it was given into its working directory (the replica's state
// directory), and exits on SIGTERM, or at once with FAKE_EXIT's code.
const fakeAgentEnv = "RUNNERTEST_FAKE_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(fakeAgentEnv) == "1" {
		os.Exit(fakeAgent(os.Args[1:]))
	}
	os.Setenv(fakeAgentEnv, "1")
	os.Exit(m.Run())
}

func fakeAgent(args []string) int {
	if len(args) < 4 || args[0] != "agent" || args[1] != "-c" || args[3] != "--" {
		fmt.Fprintln(os.Stderr, "error: not called as keyway agent -c FILE -- CMD:", args)
		return 2
	}
	var cfg struct {
		Replica  struct{ Set, Name, Addr string }
		LockFile string `yaml:"lock_file"`
	}
	b, err := os.ReadFile(args[2])
	if err == nil {
		err = yaml.Unmarshal(b, &cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error: config:", err)
		return 2
	}
	if code := os.Getenv("FAKE_EXIT"); code != "" {
		fmt.Fprintln(os.Stderr, "error: told to fail with code", code)
		var n int
		fmt.Sscan(code, &n)
		return n
	}
	l, err := flock.TryLock(cfg.LockFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error: lock_file:", err)
		return 1
	}
	lb, _ := json.Marshal(AgentLock{Pid: os.Getpid(), Set: cfg.Replica.Set, Replica: cfg.Replica.Name, Addr: cfg.Replica.Addr, Started: time.Now()})
	l.Write(lb)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	wd, _ := os.Getwd()
	given := map[string]any{"config": string(b), "command": args[4:], "wd": wd, "replica": os.Getenv("KEYWAY_REPLICA"),
		"port": os.Getenv("KEYWAY_PORT"), "state_dir": os.Getenv("KEYWAY_STATE_DIR"), "extra": os.Getenv("EXTRA"),
		"proxy_env": os.Getenv("KEYWAY_ADMIN_TOKEN")}
	gb, _ := json.Marshal(given)
	os.WriteFile("given.json", gb, 0o600)
	f, _ := os.OpenFile("starts", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	fmt.Fprintln(f, os.Getpid())
	f.Close()
	<-term
	os.WriteFile("stopped", []byte("1"), 0o600)
	return 0
}

// startRunner runs a runner over dir until the test ends (or stop is
// called), and kills whatever agents remain afterwards.
func startRunner(t *testing.T, dir string, opts Options) (r *Runner, stop func()) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the runner needs a Unix system")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts.Executable = exe
	opts.Interval = 20 * time.Millisecond
	opts.Agent.Join = func() []string { return []string{"127.0.0.1:7946"} }
	r, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	// The agents outlive their runner by design: once it has stopped (it
	// starts none after), kill the ones it started that still run, and
	// every one holding a lock in dir.
	t.Cleanup(func() {
		stop()
		r.mu.Lock()
		var pids []int
		for _, j := range r.jobs {
			if j.child && j.alive() {
				pids = append(pids, j.pid)
			}
		}
		r.mu.Unlock()
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		killAgents(dir)
	})
	return r, stop
}

// killAgents kills every agent holding a lock in dir.
func killAgents(dir string) {
	locks, _ := filepath.Glob(filepath.Join(dir, ".runner", "*.lock"))
	for _, l := range locks {
		if held, b, _ := flock.Held(l); held {
			var h AgentLock
			if json.Unmarshal(b, &h) == nil && h.Pid > 0 {
				syscall.Kill(h.Pid, syscall.SIGKILL)
			}
		}
	}
}

func spec(dir string) Spec {
	s := DefaultSpec()
	s.Command = []string{"pipeline", "--name", "{replica}", "--listen", "{addr}", "--data", "{state_dir}"}
	s.Env = []string{"EXTRA=ordinal-{ordinal}"}
	s.StateDir = dir
	return s
}

func runningJobs(r *Runner, set string) map[string]Job {
	jobs, _ := r.Jobs(set)
	out := map[string]Job{}
	for _, j := range jobs {
		if j.State == "running" {
			out[j.Replica] = j
		}
	}
	return out
}

func waitJobs(t *testing.T, r *Runner, set string, want ...string) map[string]Job {
	t.Helper()
	var got map[string]Job
	poll.Until(t, 10*time.Second, fmt.Sprintf("jobs %v running", want), func() bool {
		got = runningJobs(r, set)
		jobs, _ := r.Jobs(set)
		if len(jobs) != len(want) {
			return false
		}
		for _, w := range want {
			if _, ok := got[w]; !ok {
				return false
			}
		}
		return true
	})
	return got
}

// waitLocked waits until the replicas' agents have taken their locks (a
// started agent takes it first thing, then writes its PID in it). It
// reads the files rather than trying the locks, which would make an agent
// starting at that moment find its lock taken.
func waitLocked(t *testing.T, dir string, replicas ...string) {
	t.Helper()
	poll.Until(t, 5*time.Second, fmt.Sprintf("%v locked", replicas), func() bool {
		for _, name := range replicas {
			b, err := os.ReadFile(filepath.Join(dir, ".runner", name+".lock"))
			var h AgentLock
			if err != nil || json.Unmarshal(b, &h) != nil || h.Pid == 0 {
				return false
			}
		}
		return true
	})
}

func given(t *testing.T, dir, replica string) map[string]any {
	t.Helper()
	var g map[string]any
	poll.Until(t, 5*time.Second, replica+"'s agent wrote what it was given", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, replica, "given.json"))
		return err == nil && json.Unmarshal(b, &g) == nil
	})
	return g
}

func TestRunnerStartsScalesAndStopsAsRemovals(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KEYWAY_ADMIN_TOKEN", "proxy-secret")
	reg := prometheus.NewRegistry()
	r, _ := startRunner(t, dir, Options{Registerer: reg})
	s := spec(dir)
	r.Apply([]Want{{Set: "orders", Replicas: 2, Spec: s}})
	jobs := waitJobs(t, r, "orders", "orders-0", "orders-1")
	poll.Until(t, 5*time.Second, "keyway_jobs{state=running} 2", func() bool {
		return testutil.ToFloat64(r.gauge.WithLabelValues("orders", "running")) == 2
	})
	if n := testutil.CollectAndCount(reg, "keyway_jobs"); n != len(jobStates) {
		t.Errorf("keyway_jobs has %d series, want one per state (%d)", n, len(jobStates))
	}

	g := given(t, dir, "orders-1")
	addr := jobs["orders-1"].Addr
	port := strings.TrimPrefix(addr, "127.0.0.1:")
	wantCmd := fmt.Sprintf("[pipeline --name orders-1 --listen %s --data %s]", addr, filepath.Join(dir, "orders-1"))
	if fmt.Sprint(g["command"]) != wantCmd {
		t.Errorf("command = %v, want %s", g["command"], wantCmd)
	}
	if g["wd"] != filepath.Join(dir, "orders-1") || g["state_dir"] != filepath.Join(dir, "orders-1") {
		t.Errorf("working directory %v, KEYWAY_STATE_DIR %v: want the replica's state directory", g["wd"], g["state_dir"])
	}
	if g["replica"] != "orders-1" || g["port"] != port || g["extra"] != "ordinal-1" {
		t.Errorf("environment: replica %v port %v extra %v", g["replica"], g["port"], g["extra"])
	}
	if g["proxy_env"] != "" {
		t.Errorf("the proxy's KEYWAY_ settings reached the replica: %v", g["proxy_env"])
	}
	for _, want := range []string{"remove: true", "name: orders-1", "addr: " + addr, "listen: \"\"", "lock_file: " + filepath.Join(dir, ".runner", "orders-1.lock"), "- 127.0.0.1:7946"} {
		if !strings.Contains(g["config"].(string), want) {
			t.Errorf("agent configuration lacks %q:\n%s", want, g["config"])
		}
	}

	// Scale out: the new ordinal starts; the others are left alone.
	r.Apply([]Want{{Set: "orders", Replicas: 3, Spec: s}})
	jobs3 := waitJobs(t, r, "orders", "orders-0", "orders-1", "orders-2")
	if jobs3["orders-0"].AgentPid != jobs["orders-0"].AgentPid {
		t.Errorf("scale-out restarted orders-0")
	}
	given(t, dir, "orders-2") // up, with its SIGTERM handler
	// Free ports are handed out once each, though none is bound yet.
	seen := map[string]string{}
	for name, j := range jobs3 {
		if other, ok := seen[j.Addr]; ok {
			t.Errorf("%s and %s were both given %s", name, other, j.Addr)
		}
		seen[j.Addr] = name
	}
	// Scale in: the highest ordinals stop (SIGTERM: a removal), their
	// state stays.
	r.Apply([]Want{{Set: "orders", Replicas: 1, Spec: s}})
	waitJobs(t, r, "orders", "orders-0")
	for _, name := range []string{"orders-1", "orders-2"} {
		if _, err := os.Stat(filepath.Join(dir, name, "stopped")); err != nil {
			t.Errorf("%s was not stopped with SIGTERM: %v", name, err)
		}
		if held, _, _ := flock.Held(filepath.Join(dir, ".runner", name+".lock")); held {
			t.Errorf("%s's agent still holds its lock", name)
		}
	}
	// Scale out again: the same name finds the same directory and port.
	r.Apply([]Want{{Set: "orders", Replicas: 2, Spec: s}})
	jobs = waitJobs(t, r, "orders", "orders-0", "orders-1")
	if jobs["orders-1"].Addr != addr {
		t.Errorf("orders-1 came back on %s, was %s", jobs["orders-1"].Addr, addr)
	}
	poll.Until(t, 5*time.Second, "orders-1's state directory to see its second start (kept across the scale-down)", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "orders-1", "starts"))
		return len(strings.Fields(string(b))) == 2
	})
	// A set no longer asked for stops all its jobs.
	r.Apply(nil)
	poll.Until(t, 10*time.Second, "every job stopped", func() bool {
		jobs, _ := r.Jobs("orders")
		return len(jobs) == 0 && len(runningJobs(r, "orders")) == 0
	})
	poll.Until(t, 5*time.Second, "the set's keyway_jobs series gone", func() bool {
		return testutil.CollectAndCount(reg, "keyway_jobs") == 0
	})
}

func TestRunnerAdoptsTheAgentsOfAnEarlierProcess(t *testing.T) {
	dir := t.TempDir()
	s := spec(dir)
	r1, stop1 := startRunner(t, dir, Options{})
	r1.Apply([]Want{{Set: "orders", Replicas: 2, Spec: s}})
	before := waitJobs(t, r1, "orders", "orders-0", "orders-1")
	waitLocked(t, dir, "orders-0", "orders-1")
	stop1() // the proxy restarts: its agents stay

	for name, j := range before {
		if held, _, _ := flock.Held(filepath.Join(dir, ".runner", name+".lock")); !held {
			t.Fatalf("%s's agent (pid %d) did not outlive its runner", name, j.AgentPid)
		}
	}
	r2, _ := startRunner(t, dir, Options{})
	r2.Apply([]Want{{Set: "orders", Replicas: 2, Spec: s}})
	after := waitJobs(t, r2, "orders", "orders-0", "orders-1")
	for name, j := range after {
		if j.AgentPid != before[name].AgentPid || !j.Adopted {
			t.Errorf("%s: pid %d adopted %v, want pid %d adopted", name, j.AgentPid, j.Adopted, before[name].AgentPid)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "orders-0", "starts"))
	if n := len(strings.Fields(string(b))); n != 1 {
		t.Errorf("orders-0 started %d times, want once (adopted, not duplicated)", n)
	}
	given(t, dir, "orders-1")
	// An adopted agent is stopped as a removal too.
	r2.Apply([]Want{{Set: "orders", Replicas: 1, Spec: s}})
	waitJobs(t, r2, "orders", "orders-0")
	if _, err := os.Stat(filepath.Join(dir, "orders-1", "stopped")); err != nil {
		t.Errorf("adopted orders-1 was not stopped with SIGTERM: %v", err)
	}
}

func TestOneRunnerPerStateDirectory(t *testing.T) {
	dir := t.TempDir()
	s := spec(dir)
	r1, stop1 := startRunner(t, dir, Options{})
	r2, _ := startRunner(t, dir, Options{})
	r1.Apply([]Want{{Set: "orders", Replicas: 2, Spec: s}})
	before := waitJobs(t, r1, "orders", "orders-0", "orders-1")
	waitLocked(t, dir, "orders-0", "orders-1")
	r2.Apply([]Want{{Set: "orders", Replicas: 2, Spec: s}})
	poll.Until(t, 5*time.Second, "the second runner sees the first hold the lock", func() bool {
		_, st := r2.Jobs("orders")
		return !st.Here && strings.Contains(st.Holder, fmt.Sprint(os.Getpid()))
	})
	if jobs, _ := r2.Jobs("orders"); len(jobs) != 0 {
		t.Fatalf("the second runner runs jobs too: %+v", jobs)
	}
	stop1()
	after := waitJobs(t, r2, "orders", "orders-0", "orders-1")
	for name, j := range after {
		if j.AgentPid != before[name].AgentPid {
			t.Errorf("%s: the runner that took over started pid %d, the agent was pid %d", name, j.AgentPid, before[name].AgentPid)
		}
	}
}

func TestRunnerRestartsAnAgentThatExitsWithBackoff(t *testing.T) {
	dir := t.TempDir()
	s := spec(dir)
	s.Env = []string{"FAKE_EXIT=3"}
	r, _ := startRunner(t, dir, Options{})
	r.Apply([]Want{{Set: "orders", Replicas: 1, Spec: s}})
	var j Job
	poll.Until(t, 5*time.Second, "the failing agent in backoff", func() bool {
		jobs, _ := r.Jobs("orders")
		if len(jobs) == 1 {
			j = jobs[0]
		}
		return j.State == "backoff"
	})
	if j.Restarts != 1 || !strings.Contains(j.LastExit, "exit status 3") || !strings.Contains(j.LastExit, "told to fail") || j.RetryAt.IsZero() {
		t.Errorf("job after one exit: %+v", j)
	}
	if r.Pending("orders") != 1 {
		t.Errorf("Pending = %d, want 1", r.Pending("orders"))
	}
}

func TestRunnerLeavesUnknownAgentsForAGrace(t *testing.T) {
	dir := t.TempDir()
	s := spec(dir)
	r1, stop1 := startRunner(t, dir, Options{})
	r1.Apply([]Want{{Set: "events", Replicas: 1, Spec: s}})
	waitJobs(t, r1, "events", "events-0")
	waitLocked(t, dir, "events-0")
	stop1()
	// The next process does not know the set yet (run-time state not
	// received): it adopts the agent and leaves it for the grace, then
	// stops it.
	r2, _ := startRunner(t, dir, Options{OrphanGrace: 300 * time.Millisecond})
	r2.Apply([]Want{{Set: "orders", Replicas: 0, Spec: s}})
	poll.Until(t, 5*time.Second, "the unknown agent stopped after the grace", func() bool {
		_, err := os.Stat(filepath.Join(dir, "events-0", "stopped"))
		return err == nil
	})
}

func TestSpecValidate(t *testing.T) {
	ok := spec("/var/lib/keyway/run")
	if err := ok.Validate(3); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	if err := DefaultSpec().Validate(3); err != nil {
		t.Fatalf("no run section: %v", err)
	}
	cases := map[string]func(*Spec){
		`command: required when run is set`:            func(s *Spec) { s.Command = nil; s.PortBase = 9000 },
		`command[1]: {nmae} is not a placeholder`:      func(s *Spec) { s.Command = []string{"p", "{nmae}"} },
		`env[0]: "X" is not NAME=value`:                func(s *Spec) { s.Env = []string{"X"} },
		`env[0]: KEYWAY_SET: the KEYWAY_ names`:        func(s *Spec) { s.Env = []string{"KEYWAY_SET=x"} },
		`host: "0.0.0.0" is an all-interfaces address`: func(s *Spec) { s.Host = "0.0.0.0" },
		`port_base: 65535 + 3 replicas passes`:         func(s *Spec) { s.PortBase = 65535 },
		`state_dir: "run" is relative`:                 func(s *Spec) { s.StateDir = "run" },
		`probe_interval: must be at least 10ms`:        func(s *Spec) { s.ProbeInterval = time.Millisecond },
		`max_restarts: must be between 1 and 1000`:     func(s *Spec) { s.MaxRestarts = 0 },
	}
	for want, mutate := range cases {
		s := spec("/var/lib/keyway/run")
		mutate(&s)
		err := s.Validate(3)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error containing %q, got %v", want, err)
		}
	}
}

func TestExpandAndOrdinals(t *testing.T) {
	v := vars{set: "orders", replica: "orders-2", host: "127.0.0.1", stateDir: "/s/orders-2", keyway: "/bin/keyway", ordinal: 2, port: 9102}
	got := v.expand("{keyway} replica --name {replica} --listen {addr} --data {state_dir} --set {set} #{ordinal} {port} {host} {x}")
	want := "/bin/keyway replica --name orders-2 --listen 127.0.0.1:9102 --data /s/orders-2 --set orders #2 9102 127.0.0.1 {x}"
	if got != want {
		t.Errorf("expand = %q, want %q", got, want)
	}
	for name, want := range map[string]int{"orders-0": 0, "orders-12": 12, "orders-x": -1, "orders-01": -1, "users-1": -1, "orders--1": -1} {
		if got := ordinalOf("orders", name); got != want {
			t.Errorf("ordinalOf(%q) = %d, want %d", name, got, want)
		}
	}
	if backoff(1) != time.Second || backoff(10) != 30*time.Second {
		t.Errorf("backoff: %v %v", backoff(1), backoff(10))
	}
	if !errors.Is(flock.ErrLocked, flock.ErrLocked) {
		t.Fatal()
	}
}

// An adopted agent that dies is started again after a backoff, counted as
// a restart, as a child of the runner would be.
func TestRunnerRestartsAnAdoptedAgentThatDies(t *testing.T) {
	dir := t.TempDir()
	s := spec(dir)
	r1, stop1 := startRunner(t, dir, Options{})
	r1.Apply([]Want{{Set: "orders", Replicas: 1, Spec: s}})
	before := waitJobs(t, r1, "orders", "orders-0")
	waitLocked(t, dir, "orders-0")
	stop1()
	r2, _ := startRunner(t, dir, Options{})
	r2.Apply([]Want{{Set: "orders", Replicas: 1, Spec: s}})
	if j := waitJobs(t, r2, "orders", "orders-0")["orders-0"]; !j.Adopted || j.AgentPid != before["orders-0"].AgentPid {
		t.Fatalf("not adopted: %+v", j)
	}
	if err := syscall.Kill(before["orders-0"].AgentPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var j Job
	poll.Until(t, 5*time.Second, "the adopted agent's exit noticed", func() bool {
		jobs, _ := r2.Jobs("orders")
		j = jobs[0]
		return j.Restarts == 1
	})
	if !strings.Contains(j.LastExit, "earlier proxy process") {
		t.Errorf("last exit %q", j.LastExit)
	}
	after := waitJobs(t, r2, "orders", "orders-0")["orders-0"]
	if after.AgentPid == before["orders-0"].AgentPid || after.Adopted {
		t.Errorf("not started again: %+v", after)
	}
}

// Free ports come from below the kernel's ephemeral range where it has
// one, so that no port-0 bind or outgoing connection takes a replica's
// port before the replica binds it.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	lo, ok := ephemeralLow()
	if !ok {
		t.Skip("no ephemeral port range to read (not Linux)")
	}
	for range 10 {
		p, err := freePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if p >= lo || p < lo-reservedSpan {
			t.Fatalf("freePort = %d, want within [%d, %d)", p, lo-reservedSpan, lo)
		}
		if !portFree("127.0.0.1", p) {
			t.Fatalf("port %d is not free", p)
		}
	}
}
