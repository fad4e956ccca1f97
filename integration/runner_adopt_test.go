//go:build unix

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/testnet"
)

// waitAdopted waits until a proxy reports n running jobs of "orders",
// each adopted (started by an earlier proxy process), with its replica
// ready and its PIDs known, and returns them.
func waitAdopted(t *testing.T, r *reaper, adminAddr string, n int, d time.Duration) admin.JobsStatus {
	t.Helper()
	var st admin.JobsStatus
	ok := poll.Within(d, func() bool {
		var got bool
		if st, got = jobsOf(adminAddr); !got || !st.Here || len(st.Jobs) != n {
			return false
		}
		r.saw(st)
		for _, j := range st.Jobs {
			if !j.Adopted || j.State != "running" || j.ReplicaState != "ready" || j.AgentPid == 0 || j.Pid == 0 {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("%s: not %d adopted jobs with ready replicas within %s: %+v", adminAddr, n, d, st)
	}
	return st
}

// agentProcs returns the PIDs of the live agent processes of a state
// directory, from /proc (nil, false where there is none): the processes
// whose command line runs `agent -c STATE_DIR/.runner/…`.
func agentProcs(stateDir string) ([]int, bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	var out []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 3 && args[1] == "agent" && args[2] == "-c" && strings.HasPrefix(args[3], filepath.Join(stateDir, ".runner")+"/") && alive(pid) {
			out = append(out, pid)
		}
	}
	return out, true
}

// checkSameJobs fails the test unless after has the jobs of before, with
// the same agent and replica PIDs, each process alive, and the state
// directory exactly their agents.
func checkSameJobs(t *testing.T, stateDir, what string, before, after admin.JobsStatus) {
	t.Helper()
	if b, a := pidsOf(before), pidsOf(after); fmt.Sprint(b) != fmt.Sprint(a) {
		t.Fatalf("%s: the jobs' [agent, replica] PIDs were %v, now %v", what, b, a)
	}
	locked := lockedAgents(stateDir)
	for _, j := range after.Jobs {
		if !alive(j.AgentPid) || !alive(j.Pid) || locked[j.Replica] != j.AgentPid {
			t.Fatalf("%s: %s's agent %d (alive %v, holds the lock: %v) or replica %d (alive %v) not running", what, j.Replica,
				j.AgentPid, alive(j.AgentPid), locked[j.Replica], j.Pid, alive(j.Pid))
		}
	}
	if len(locked) != len(after.Jobs) {
		t.Fatalf("%s: %d agents hold locks, want %d: %v", what, len(locked), len(after.Jobs), locked)
	}
	if procs, ok := agentProcs(stateDir); ok && len(procs) != len(after.Jobs) {
		t.Fatalf("%s: %d agent processes run for the state directory, want %d: %v", what, len(procs), len(after.Jobs), procs)
	}
	for _, j := range after.Jobs {
		if j.AgentRestarts != 0 {
			t.Fatalf("%s: %s's agent was started again: %+v", what, j.Replica, j)
		}
	}
}

// A binary upgrade (SIGUSR2) of the proxy that runs the jobs, under 300
// keyed POSTs a second, loses no request and leaves every agent and
// replica process running: the new process adopts them (same PIDs) once
// the old one has let go of the state directory. A plain restart (SIGTERM,
// then a new process with the same file) adopts them as well: still
// exactly one agent per replica. The runner's proxy joins another proxy
// (which runs nothing), as a fleet's proxies do.
func TestRunnerUpgradeAndRestartAdoptJobs(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	b := StartProxyFile(t, "proxy-b", WriteFile(t, t.TempDir(), "b.yaml", runProxyYAML(nil, 0, 3, "")))
	upgradeAndRestart(t, []string{b.Gossip})
}

// The same with the runner's proxy alone: its agents join it, and it
// joins nobody.
func TestRunnerUpgradeAloneAdoptsJobs(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	upgradeAndRestart(t, nil)
}

func upgradeAndRestart(t *testing.T, join []string) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "run")
	r := newReaper(t, stateDir)
	pidFile := filepath.Join(dir, "proxy.pid")
	cfg := WriteFile(t, dir, "proxy.yaml", runProxyYAML(join, testnet.FreePort(t), 3, runSection(stateDir, "")))
	a := StartLogged(t, "proxy", "proxy", "-c", cfg, "--pid-file", pidFile)
	killUpgraded(t, pidFile, a)
	addr := a.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	adminAddr := a.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	before := waitJobs(t, r, adminAddr, 3, 30*time.Second)
	poll.Until(t, 10*time.Second, "the PID file", func() bool { return readPID(pidFile) == a.Pid() })

	keys := Keys(200)
	c := NewClient()
	owners := c.Owners(t, addr, keys, 8)
	load := StartLoad(func() string { return addr }, keys, owners, 300)
	poll.Until(t, 10*time.Second, "300 requests before the upgrade", func() bool { n, _ := load.Counts(); return n >= 300 })
	if err := syscall.Kill(a.Pid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 70*time.Second, "the new process to serve (PID file)", func() bool { p := readPID(pidFile); return p != 0 && p != a.Pid() })
	poll.Until(t, 20*time.Second, "the old process to exit", a.Exited)
	upgraded := readPID(pidFile)
	start := time.Now()
	after := waitAdopted(t, r, adminAddr, 3, 20*time.Second)
	t.Logf("upgrade: the new process adopted the 3 jobs %s after the old one exited", time.Since(start).Round(time.Millisecond))
	checkSameJobs(t, stateDir, "after the upgrade", before, after)
	sent, _ := load.Counts()
	poll.Until(t, 10*time.Second, "300 requests after the adoption", func() bool { n, _ := load.Counts(); return n >= sent+300 })
	total, failures := load.Stop()
	if failures != "" {
		t.Fatalf("requests lost across the upgrade: %s", failures)
	}
	t.Logf("%d requests across the upgrade, none failed, every key answered by its owner", total)

	// A plain restart: SIGTERM, then a new process with the same file.
	if err := syscall.Kill(upgraded, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the upgraded process to exit", func() bool { return !alive(upgraded) })
	for _, j := range after.Jobs {
		if !alive(j.AgentPid) || !alive(j.Pid) {
			t.Fatalf("%s's processes stopped with the proxy: agent %d, replica %d", j.Replica, j.AgentPid, j.Pid)
		}
	}
	restarted := StartProxyFile(t, "proxy-restarted", cfg)
	start = time.Now()
	again := waitAdopted(t, r, restarted.Admin, 3, 30*time.Second)
	t.Logf("restart: the new process adopted the 3 jobs %s after it started", time.Since(start).Round(time.Millisecond))
	checkSameJobs(t, stateDir, "after the restart", before, again)
	if got := c.Owners(t, restarted.Addr, keys, 8); fmt.Sprint(got) != fmt.Sprint(owners) {
		t.Fatal("the restarted proxy routes keys to other replicas")
	}
}

// Two proxies on one machine with the same run section and state
// directory: the first runs the jobs, the second routes the set and runs
// nothing (its jobs answer names the holder), and there is one agent per
// replica. When the first dies (SIGKILL) the second takes the state
// directory over and adopts the agents: the same processes.
func TestRunnerOneRunnerPerStateDir(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "run")
	r := newReaper(t, stateDir)
	run := runSection(stateDir, "")
	a := StartProxyFile(t, "proxy-a", WriteFile(t, dir, "a.yaml", runProxyYAML(nil, 0, 3, run)))
	before := waitJobs(t, r, a.Admin, 3, 30*time.Second)
	b := StartProxyFile(t, "proxy-b", WriteFile(t, dir, "b.yaml", runProxyYAML([]string{a.Gossip}, 0, 3, run)))
	b.WaitLine(t, logField("another process runs the jobs of this state directory; this proxy routes only, and takes over when it stops", "holder"), 20*time.Second)
	b.WaitRotation(t, 3, 20*time.Second)
	st, ok := jobsOf(b.Admin)
	if !ok || !st.Runs || st.Here || st.Holder != fmt.Sprintf("pid %d", a.Pid()) || len(st.Jobs) != 0 || st.StateDir != stateDir {
		t.Fatalf("the second proxy's jobs answer: %+v; want runs, not here, holder pid %d, no jobs", st, a.Pid())
	}
	if out := cli(t, "jobs", "--admin", b.Admin, "--set", "orders"); !strings.Contains(out, fmt.Sprintf("run by another process on this host (pid %d)", a.Pid())) {
		t.Errorf("keyway jobs on the second proxy:\n%s", out)
	}
	if st, _ := jobsOf(a.Admin); len(st.Jobs) != 3 || !st.Here {
		t.Fatalf("the first proxy's jobs after the second started: %+v", st)
	}
	checkSameJobs(t, stateDir, "with two proxies", before, before)

	a.Kill(t)
	start := time.Now()
	after := waitAdopted(t, r, b.Admin, 3, 30*time.Second)
	t.Logf("the second proxy adopted the 3 jobs %s after the first was killed", time.Since(start).Round(time.Millisecond))
	checkSameJobs(t, stateDir, "after the takeover", before, after)
	if st, _ := jobsOf(b.Admin); st.Holder != "" {
		t.Errorf("the second proxy still names a holder after the takeover: %+v", st)
	}
	keys := Keys(100)
	if _, why := routesAgree(t, NewClient(), keys, 3, b); why != "" {
		t.Fatalf("after the takeover: %s", why)
	}
}
