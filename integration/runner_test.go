//go:build unix

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/flock"
	"keyway/internal/poll"
	"keyway/internal/slow"
)

// The local runner's tests: proxies whose set "orders" has a run section
// start one agent per replica (`keyway agent … -- CMD`), as separate
// processes that outlive the proxy. Every test registers a reaper first:
// it kills, at the end, every agent and replica process the test caused,
// whichever process started them.

// replicaCmd is the run command of the runner tests' replicas: a shell
// that notes each start in the replica's state directory (its working
// directory: the file boots gets the replica's PID), fails at once with
// code 3 while that directory holds a file named crash, and otherwise
// becomes the demo replica (exec: the replica's PID is the shell's).
var replicaCmd = []string{"/bin/sh", "-c",
	`test -f crash && exit 3; echo $$ >> boots; exec "$0" replica --name "$1" --listen "$2"`,
	"{keyway}", "{replica}", "{addr}"}

// runSection is a run section for "orders" with state directory dir and
// extra keys (YAML flow mapping entries, e.g. "max_restarts: 1").
func runSection(dir string, extra string) string {
	cmd, _ := json.Marshal(replicaCmd)
	s := fmt.Sprintf("{command: %s, state_dir: %q, drain_timeout: 10s, stop_grace: 5s", cmd, dir)
	if extra != "" {
		s += ", " + extra
	}
	return s + "}"
}

// runProxyYAML is a proxy configuration for the set "orders" of
// replicas replicas, with the run section run ("" for none: the proxy
// only routes the set), joining join.
func runProxyYAML(join []string, gossipPort, replicas int, run string) string {
	g := gossipYAML(join, "  ")
	if gossipPort != 0 {
		g = strings.Replace(g, "bind_port: 0", "bind_port: "+strconv.Itoa(gossipPort), 1)
	}
	s := fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
server: {drain_idle: 1s}
fleet: {interval: 200ms, disagreement_bound: 1s}
gossip:
  enabled: true
  %s
replica_sets:
  - name: orders
    replicas: %d
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 10s, idle: 30s}
`, g, replicas)
	if run != "" {
		s += "    run: " + run + "\n"
	}
	return s
}

// reaper kills, at the end of a test, the agents and replicas of its
// runners: the agents that hold a lock in its state directories, the
// processes they started, and every PID it saw in a jobs answer (a
// replica whose agent is gone). Agents and replicas each lead a process
// group of their own; the reaper kills the groups. It kills only keyway
// processes of this test run (the binary's path in their command line)
// where /proc tells.
type reaper struct {
	mu   sync.Mutex
	dirs []string
	pids map[int]bool
}

// newReaper returns a reaper for dir, registered for the test's end.
// Register it before the processes that start jobs, so that it runs after
// they are stopped (cleanups run last first).
func newReaper(t *testing.T, dir string) *reaper {
	r := &reaper{pids: map[int]bool{}}
	if dir != "" {
		r.dirs = append(r.dirs, dir)
	}
	t.Cleanup(func() {
		if n := r.reap(); n > 0 {
			t.Logf("reaper: killed %d leftover job processes", n)
		}
	})
	return r
}

// watch adds a state directory.
func (r *reaper) watch(dir string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirs = append(r.dirs, dir)
}

// saw records the PIDs of a jobs answer.
func (r *reaper) saw(st admin.JobsStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range st.Jobs {
		for _, pid := range []int{j.AgentPid, j.Pid} {
			if pid > 0 {
				r.pids[pid] = true
			}
		}
	}
}

// lockedAgents returns the PIDs of the agents that hold their locks in
// a state directory, by replica name.
func lockedAgents(dir string) map[string]int {
	out := map[string]int{}
	locks, _ := filepath.Glob(filepath.Join(dir, ".runner", "*.lock"))
	for _, path := range locks {
		held, b, err := flock.Held(path)
		if err != nil || !held {
			continue
		}
		var l struct {
			Pid     int    `json:"pid"`
			Replica string `json:"replica"`
		}
		if json.Unmarshal(b, &l) == nil && l.Pid > 0 {
			out[l.Replica] = l.Pid
		}
	}
	return out
}

func (r *reaper) reap() int {
	r.mu.Lock()
	pids := map[int]bool{}
	for pid := range r.pids {
		pids[pid] = true
	}
	for _, dir := range r.dirs {
		for _, pid := range lockedAgents(dir) {
			pids[pid] = true
		}
	}
	r.mu.Unlock()
	for pid := range children(pids) {
		pids[pid] = true
	}
	n := 0
	for pid := range pids {
		if !ours(pid) {
			continue
		}
		if pg, err := syscall.Getpgid(pid); err == nil && pg == pid {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// children returns the descendants of pids that /proc shows (none where
// there is no /proc).
func children(pids map[int]bool) map[int]bool {
	out := map[int]bool{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; read after ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	for changed := true; changed; {
		changed = false
		for pid, pp := range parent {
			if (pids[pp] || out[pp]) && !out[pid] && !pids[pid] {
				out[pid], changed = true, true
			}
		}
	}
	return out
}

// ours reports whether pid runs this test run's keyway binary (always
// true where /proc cannot tell).
func ours(pid int) bool {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), Binary)
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	if gone, _ := processGone(pid); gone {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: kill(pid, 0) succeeded
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// jobsOf returns a proxy's answer to GET /v1/replica_sets/orders/jobs;
// ok is false when it did not answer.
func jobsOf(adminAddr string) (st admin.JobsStatus, ok bool) {
	resp, err := http.Get("http://" + adminAddr + "/v1/replica_sets/orders/jobs")
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return st, resp.StatusCode == 200 && json.Unmarshal(b, &st) == nil
}

// job returns the job of replica name in st.
func job(st admin.JobsStatus, name string) (admin.Job, bool) {
	for _, j := range st.Jobs {
		if j.Replica == name {
			return j, true
		}
	}
	return admin.Job{}, false
}

// waitJobs waits until the proxy runs exactly n jobs of "orders", each
// running with its replica ready and its replica process's PID known,
// and returns them (the reaper notes their PIDs).
func waitJobs(t *testing.T, r *reaper, adminAddr string, n int, d time.Duration) admin.JobsStatus {
	t.Helper()
	var st admin.JobsStatus
	ok := poll.Within(d, func() bool {
		var got bool
		if st, got = jobsOf(adminAddr); !got {
			return false
		}
		r.saw(st)
		if !st.Here || len(st.Jobs) != n {
			return false
		}
		for i, j := range st.Jobs {
			if j.Replica != fmt.Sprintf("orders-%d", i) || j.State != "running" || j.ReplicaState != "ready" || j.Pid == 0 || j.AgentPid == 0 {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("%s: not %d running jobs with ready replicas within %s: %+v", adminAddr, n, d, st)
	}
	return st
}

// pidsOf returns a jobs answer's agent and replica PIDs by replica.
func pidsOf(st admin.JobsStatus) map[string][2]int {
	out := map[string][2]int{}
	for _, j := range st.Jobs {
		out[j.Replica] = [2]int{j.AgentPid, j.Pid}
	}
	return out
}

// cli runs a keyway command (the admin token comes from the
// environment) and returns its output; an error fails the test.
func cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(Binary, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("keyway %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// routesAgree sends every key through each proxy and asks each proxy's
// route API for the key's pick: it returns the owners when all agree and
// the owners are exactly orders-0 … orders-(n-1), else "" and what
// differed.
func routesAgree(t *testing.T, c *Client, keys []string, n int, proxies ...*ProxyProc) (map[string]string, string) {
	t.Helper()
	var first map[string]string
	for _, p := range proxies {
		got := c.Owners(t, p.Addr, keys, 8)
		if first == nil {
			first = got
		} else if fmt.Sprint(got) != fmt.Sprint(first) {
			return nil, p.Name + " answers keys from other replicas than " + proxies[0].Name
		}
		for _, k := range keys[:50] {
			var rt admin.RouteExplain
			resp, err := http.Get("http://" + p.Admin + "/v1/route?set=orders&key=" + k)
			if err != nil {
				return nil, err.Error()
			}
			err = json.NewDecoder(resp.Body).Decode(&rt)
			resp.Body.Close()
			if err != nil || rt.Pick != got[k] || rt.Owner != got[k] {
				return nil, fmt.Sprintf("%s: key %s answered by %s, route says owner %s pick %s", p.Name, k, got[k], rt.Owner, rt.Pick)
			}
		}
	}
	seen := map[string]bool{}
	for _, o := range first {
		seen[o] = true
	}
	var names []string
	for o := range seen {
		names = append(names, o)
	}
	slices.Sort(names)
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("orders-%d", i)
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		return nil, fmt.Sprintf("keys answered by %v, want %v", names, want)
	}
	return first, ""
}

// waitRoutes waits until routesAgree.
func waitRoutes(t *testing.T, c *Client, keys []string, n int, d time.Duration, proxies ...*ProxyProc) map[string]string {
	t.Helper()
	var owners map[string]string
	var why string
	if !poll.Within(d, func() bool { owners, why = routesAgree(t, c, keys, n, proxies...); return owners != nil }) {
		t.Fatalf("the proxies do not route every key to its owner among %d replicas within %s: %s", n, d, why)
	}
	return owners
}

// agentLog returns a job's agent log file's content.
func agentLog(dir, replica string) string {
	b, _ := os.ReadFile(filepath.Join(dir, ".runner", replica+".log"))
	return string(b)
}

// boots returns the replica PIDs noted in a replica's state directory,
// one per start.
func boots(dir, replica string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, replica, "boots"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// slowResult is how a slow request ended.
type slowResult struct {
	code    int
	replica string
	err     error
	end     time.Time
}

// sendSlow POSTs one request for key through a proxy that the demo
// replica holds for delay before it answers.
func sendSlow(proxyAddr, key string, delay time.Duration) slowResult {
	req, _ := http.NewRequest("POST", "http://"+proxyAddr+"/ingest?delay="+delay.String(), strings.NewReader("slow"))
	req.Header.Set("X-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return slowResult{err: err, end: time.Now()}
	}
	defer resp.Body.Close()
	var a Answer
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &a)
	return slowResult{code: resp.StatusCode, replica: a.Replica, end: time.Now()}
}

// inflightTo returns how many requests a proxy forwards to a replica of
// "orders" now.
func inflightTo(adminAddr, replica string) int64 {
	resp, err := http.Get("http://" + adminAddr + "/v1/replica_sets/orders/replicas")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var list struct {
		Replicas []admin.ReplicaStatus `json:"replicas"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return -1
	}
	for _, r := range list.Replicas {
		if r.Name == replica {
			return r.Inflight
		}
	}
	return -1
}

// post sends an empty POST to url and fails the test unless it answers
// 200.
func post(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: status %d", url, resp.StatusCode)
	}
}

// With real processes and 300 keyed POSTs a second through two proxies,
// scaling 3 → 5 → 2 → 5 starts and stops jobs and loses no request:
// after each step both proxies send every key to its owner; a scaled-in
// replica finishes the request in flight to it, and its agent waits for
// its drain probe (the job stays stopping while the replica says it holds
// work); a replica's state directory survives its scale-in, and the same
// name uses it again after a scale-out.
//
// Proxy A runs the jobs. Proxy B serves the same set without a run
// section: it learns the replicas from their agents' gossip as any proxy
// does. With the run section B would run jobs as well, either the same
// ones under another state directory (two processes per replica name) or,
// sharing A's directory, none (TestRunnerOneRunnerPerStateDir).
func TestRunnerScaleUnderLoad(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret") // inherited by the proxies and the CLI
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "run")
	r := newReaper(t, stateDir)
	a := StartProxyFile(t, "proxy-a", WriteFile(t, dir, "a.yaml", runProxyYAML(nil, 0, 3, runSection(stateDir, "drain_probe: /_drained"))))
	b := StartProxyFile(t, "proxy-b", WriteFile(t, dir, "b.yaml", runProxyYAML([]string{a.Gossip}, 0, 3, "")))
	start := time.Now()
	waitJobs(t, r, a.Admin, 3, 30*time.Second)
	t.Logf("3 jobs running, replicas ready, %s after the proxies started", time.Since(start).Round(time.Millisecond))
	if st, ok := jobsOf(b.Admin); !ok || st.Runs || st.Here || len(st.Jobs) != 0 {
		t.Fatalf("proxy B (no run section) reports jobs: %+v", st)
	}
	keys := Keys(200)
	c := NewClient()
	waitRoutes(t, c, keys, 3, 20*time.Second, a, b)

	var turn sync.Mutex
	n := 0
	load := StartLoad(func() string {
		turn.Lock()
		defer turn.Unlock()
		n++
		if n%2 == 0 {
			return a.Addr
		}
		return b.Addr
	}, keys, nil, 300)

	// 3 → 5: two jobs start, their keys move to them on both proxies.
	step := time.Now()
	cli(t, "scale", "--admin", a.Admin, "--set", "orders", "--replicas", "5")
	st := waitJobs(t, r, a.Admin, 5, 30*time.Second)
	owners := waitRoutes(t, c, keys, 5, 20*time.Second, a, b)
	t.Logf("scale 3 → 5: 5 replicas ready and every key on its owner on both proxies after %s", time.Since(step).Round(time.Millisecond))
	o4, _ := job(st, "orders-4")
	if got := boots(stateDir, "orders-4"); !slices.Equal(got, []int{o4.Pid}) {
		t.Fatalf("orders-4's state directory notes starts %v, want its one replica process %d", got, o4.Pid)
	}
	if o4.StateDir != filepath.Join(stateDir, "orders-4") {
		t.Fatalf("orders-4's state directory is %s, want %s", o4.StateDir, filepath.Join(stateDir, "orders-4"))
	}
	WriteFile(t, o4.StateDir, "marker", "kept")

	// 5 → 2 with work held by orders-4 and a slow request in flight to it.
	post(t, "http://"+o4.Addr+"/_pending?v=1")
	slowKey := ""
	for _, k := range keys {
		if owners[k] == "orders-4" {
			slowKey = k
			break
		}
	}
	slow := make(chan slowResult, 1)
	go func() { slow <- sendSlow(b.Addr, slowKey, 3*time.Second) }()
	poll.Until(t, 5*time.Second, "the slow request in flight to orders-4 through B", func() bool { return inflightTo(b.Admin, "orders-4") >= 1 })
	step = time.Now()
	cli(t, "scale", "--admin", a.Admin, "--set", "orders", "--replicas", "2")
	poll.Until(t, 10*time.Second, "orders-4's job stopping", func() bool {
		st, _ := jobsOf(a.Admin)
		j, ok := job(st, "orders-4")
		return ok && j.State == "stopping"
	})
	res := <-slow
	if res.err != nil || res.code != 200 || res.replica != "orders-4" || !res.end.After(step) {
		t.Fatalf("the request in flight to orders-4 when it was scaled in: %+v (scale at %s)", res, step.Format("15:04:05.000"))
	}
	t.Logf("the request in flight to orders-4 finished with 200 from it %s after the scale-in", res.end.Sub(step).Round(time.Millisecond))
	poll.Until(t, 20*time.Second, "orders-4's agent to wait for its drain probe", func() bool {
		return strings.Contains(agentLog(stateDir, "orders-4"), "drain probe: waiting for the replica's own work")
	})
	// While the replica says it holds work, its job stays: watched for 1.5s.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); <-time.After(100 * time.Millisecond) {
		st, _ := jobsOf(a.Admin)
		if j, ok := job(st, "orders-4"); !ok || j.State != "stopping" || lockedAgents(stateDir)["orders-4"] == 0 || !alive(o4.Pid) {
			t.Fatalf("orders-4 stopped while its drain probe said it held work: job %+v, agents %v", j, lockedAgents(stateDir))
		}
	}
	post(t, "http://"+o4.Addr+"/_pending?v=0")
	poll.Until(t, 20*time.Second, "orders-4's job gone once its work is done", func() bool {
		st, _ := jobsOf(a.Admin)
		_, ok := job(st, "orders-4")
		return !ok && lockedAgents(stateDir)["orders-4"] == 0 && !alive(o4.Pid) && !alive(o4.AgentPid)
	})
	if !strings.Contains(agentLog(stateDir, "orders-4"), "drain probe: the replica's own work is done") {
		t.Error("orders-4's agent did not log its drain probe's end")
	}
	waitJobs(t, r, a.Admin, 2, 30*time.Second)
	waitRoutes(t, c, keys, 2, 20*time.Second, a, b)
	if got := lockedAgents(stateDir); len(got) != 2 {
		t.Fatalf("agents holding locks after the scale-in to 2: %v", got)
	}
	t.Logf("scale 5 → 2: 2 replicas, every key on its owner on both proxies after %s", time.Since(step).Round(time.Millisecond))
	if b, err := os.ReadFile(filepath.Join(stateDir, "orders-4", "marker")); err != nil || string(b) != "kept" {
		t.Fatalf("orders-4's state directory after its scale-in: marker %q, %v", b, err)
	}

	// 2 → 5: orders-4 comes back in its own directory.
	step = time.Now()
	cli(t, "scale", "--admin", a.Admin, "--set", "orders", "--replicas", "5")
	st = waitJobs(t, r, a.Admin, 5, 30*time.Second)
	waitRoutes(t, c, keys, 5, 20*time.Second, a, b)
	t.Logf("scale 2 → 5: 5 replicas, every key on its owner on both proxies after %s", time.Since(step).Round(time.Millisecond))
	again, _ := job(st, "orders-4")
	if got := boots(stateDir, "orders-4"); !slices.Equal(got, []int{o4.Pid, again.Pid}) || again.StateDir != o4.StateDir {
		t.Fatalf("orders-4 after the scale-out: state directory %s notes starts %v, want [%d %d]", again.StateDir, got, o4.Pid, again.Pid)
	}
	if b, err := os.ReadFile(filepath.Join(again.StateDir, "marker")); err != nil || string(b) != "kept" {
		t.Fatalf("orders-4's marker after the scale-out: %q, %v", b, err)
	}

	total, failures := load.Stop()
	if failures != "" {
		t.Fatalf("requests failed while scaling: %s", failures)
	}
	if total < 300*5 {
		t.Errorf("only %d requests sent in the test's 4 steps", total)
	}
	t.Logf("%d requests through two proxies, none failed", total)
}

// setPhase returns the phase of "orders" on a proxy.
func setPhase(adminAddr string) string {
	resp, err := http.Get("http://" + adminAddr + "/v1/replica_sets/orders")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var st struct {
		Phase string `json:"phase"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st.Phase
}

// A replica whose command exits at once is restarted by its agent
// (run.max_restarts) and then given up: its lifecycle state is failed, in
// the jobs answer and the set's replicas, while its agent stays. Once the
// cause is gone, `keyway repair` starts it again, under the same agent.
func TestRunnerCrashLoopFailsAndRepairRevives(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "run")
	r := newReaper(t, stateDir)
	crash := filepath.Join(stateDir, "orders-1", "crash")
	if err := os.MkdirAll(filepath.Dir(crash), 0o700); err != nil {
		t.Fatal(err)
	}
	WriteFile(t, filepath.Dir(crash), "crash", "")
	a := StartProxyFile(t, "proxy", WriteFile(t, dir, "proxy.yaml",
		runProxyYAML(nil, 0, 2, runSection(stateDir, "max_restarts: 1, restart_window: 1m"))))

	var st admin.JobsStatus
	var j1 admin.Job
	poll.Until(t, 30*time.Second, "orders-1 failed and orders-0 ready", func() bool {
		st, _ = jobsOf(a.Admin)
		r.saw(st)
		j0, ok0 := job(st, "orders-0")
		var ok1 bool
		j1, ok1 = job(st, "orders-1")
		return ok0 && ok1 && j0.ReplicaState == "ready" && j1.ReplicaState == "failed"
	})
	if j1.State != "running" || j1.AgentPid == 0 || j1.Pid != 0 || j1.Restarts != 1 || !strings.Contains(j1.LastExit, "3") {
		t.Fatalf("orders-1 given up: job %+v; want its agent running, no replica process, 1 restart, last exit code 3", j1)
	}
	if state, _, in, _ := setReplica(t, a.Admin, "orders-1"); state != "failed" || in {
		t.Fatalf("the set shows orders-1 %s, in rotation %v; want failed, out", state, in)
	}
	if p := setPhase(a.Admin); p != "Degraded" {
		t.Errorf("phase with one of two replicas failed: %s, want Degraded", p)
	}
	if got := boots(stateDir, "orders-1"); len(got) != 0 {
		t.Fatalf("orders-1 started as a replica while it crashed: %v", got)
	}
	out := cli(t, "jobs", "--admin", a.Admin, "--set", "orders")
	if !strings.Contains(out, "failed") {
		t.Errorf("keyway jobs does not show orders-1 failed:\n%s", out)
	}

	if err := os.Remove(crash); err != nil {
		t.Fatal(err)
	}
	out = cli(t, "repair", "--admin", a.Admin, "--set", "orders")
	if !strings.Contains(out, "orders-1") {
		t.Errorf("keyway repair does not name the failed orders-1: %s", out)
	}
	start := time.Now()
	st = waitJobs(t, r, a.Admin, 2, 20*time.Second)
	t.Logf("repair: orders-1 ready %s after keyway repair", time.Since(start).Round(time.Millisecond))
	again, _ := job(st, "orders-1")
	if again.AgentPid != j1.AgentPid || again.AgentRestarts != 0 {
		t.Errorf("repair replaced orders-1's agent: %d (restarted %d times), was %d", again.AgentPid, again.AgentRestarts, j1.AgentPid)
	}
	if got := boots(stateDir, "orders-1"); !slices.Equal(got, []int{again.Pid}) {
		t.Errorf("orders-1 after the repair runs process %d; its state directory notes starts %v", again.Pid, got)
	}
	poll.Until(t, 10*time.Second, "phase Running after the repair", func() bool { return setPhase(a.Admin) == "Running" })
}
