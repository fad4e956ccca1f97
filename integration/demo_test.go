//go:build unix

package integration

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/slow"
)

// `keyway demo` runs its replicas as real processes through the local
// runner, and the operator's commands act on them: scale starts a fourth
// replica and stops it again, restart replaces every replica process
// (the agents stay), repair revives a replica whose agent gave up on it
// (killed more often than demo.yaml's max_restarts). When the demo stops,
// every agent and replica process stops with it.
func TestDemoScaleRestartRepair(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	r := newReaper(t, "")
	d := Start(t, "demo", "demo", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--gossip-bind-port", "0")
	addr := d.WaitLine(t, regexp.MustCompile(`proxy on http://(\S+),`), 20*time.Second)[1]
	adminAddr := d.WaitLine(t, regexp.MustCompile(`admin on http://(\S+) `), 20*time.Second)[1]
	tokenFile := d.WaitLine(t, regexp.MustCompile(`admin token for this run \(.*\): (\S+)`), 20*time.Second)[1]
	st := waitJobs(t, r, adminAddr, 3, 30*time.Second)
	r.watch(st.StateDir)
	seen := map[int]bool{} // every agent and replica PID of the run
	note := func(st admin.JobsStatus) {
		for _, j := range st.Jobs {
			seen[j.AgentPid], seen[j.Pid] = true, true
		}
	}
	note(st)
	keyway := func(args ...string) string {
		t.Helper()
		return cli(t, append(args, "--admin", adminAddr, "--set", "orders")...)
	}
	rotation := func(n int) {
		t.Helper()
		poll.Until(t, 20*time.Second, fmt.Sprintf("%d replicas in rotation", n), func() bool {
			return Metric(adminAddr, "keyway_rotation_replicas", map[string]string{"set": "orders"}) == float64(n)
		})
	}
	keys := Keys(100)
	c := NewClient()

	// Scale out to 4 and back to 3.
	keyway("scale", "--replicas", "4", "--token-file", tokenFile)
	st = waitJobs(t, r, adminAddr, 4, 30*time.Second)
	note(st)
	rotation(4)
	if owners := c.Owners(t, addr, keys, 4); !strings.Contains(fmt.Sprint(owners), "orders-3") {
		t.Fatalf("no key answered by the new orders-3: %v", owners)
	}
	o3, _ := job(st, "orders-3")
	keyway("scale", "--replicas", "3", "--token-file", tokenFile)
	poll.Until(t, 30*time.Second, "orders-3's job and processes gone", func() bool {
		st, _ := jobsOf(adminAddr)
		_, ok := job(st, "orders-3")
		return !ok && !alive(o3.AgentPid) && !alive(o3.Pid)
	})
	st = waitJobs(t, r, adminAddr, 3, 30*time.Second)
	rotation(3)
	for k, o := range c.Owners(t, addr, keys, 4) {
		if o == "orders-3" {
			t.Fatalf("key %s answered by orders-3 after the scale-in", k)
		}
	}
	t.Log("scale: 3 → 4 → 3")

	// Restart: new replica processes under the same agents.
	out := keyway("restart", "--token-file", tokenFile)
	if !strings.Contains(out, "rolling restart of orders done") {
		t.Fatalf("keyway restart:\n%s", out)
	}
	restarted := waitJobs(t, r, adminAddr, 3, 30*time.Second)
	note(restarted)
	for _, j := range restarted.Jobs {
		was, _ := job(st, j.Replica)
		if j.AgentPid != was.AgentPid || j.Pid == was.Pid || alive(was.Pid) {
			t.Fatalf("%s after the restart: agent %d (was %d), replica %d (was %d, alive %v)", j.Replica, j.AgentPid, was.AgentPid, j.Pid, was.Pid, alive(was.Pid))
		}
	}
	rotation(3)
	t.Logf("restart: every replica process replaced, all back in rotation\n%s", out)

	// Repair: orders-1's replica killed until its agent gives up.
	killed := 0
	for range 8 {
		st, _ := jobsOf(adminAddr)
		j, _ := job(st, "orders-1")
		if j.ReplicaState == "failed" {
			break
		}
		kill(t, j.Pid, syscall.SIGKILL)
		killed++
		poll.Until(t, 20*time.Second, "orders-1's replica started again, or given up", func() bool {
			st, _ := jobsOf(adminAddr)
			n, _ := job(st, "orders-1")
			note(st)
			return n.ReplicaState == "failed" || (n.Pid != 0 && n.Pid != j.Pid)
		})
	}
	st, _ = jobsOf(adminAddr)
	if j, _ := job(st, "orders-1"); j.ReplicaState != "failed" || j.Pid != 0 || !strings.Contains(j.LastExit, "SIGKILL") {
		t.Fatalf("orders-1 after %d kills: %+v; want failed, no process, killed", killed, j)
	}
	rotation(2)
	out = keyway("repair", "--token-file", tokenFile)
	if !strings.Contains(out, "orders-1") {
		t.Errorf("keyway repair does not name orders-1: %s", out)
	}
	repaired := waitJobs(t, r, adminAddr, 3, 30*time.Second)
	note(repaired)
	rotation(3)
	t.Logf("repair: orders-1 failed after %d kills, back after keyway repair", killed)

	// The demo stops its jobs with it.
	d.Term(t, 60*time.Second)
	delete(seen, 0)
	for pid := range seen {
		if alive(pid) {
			t.Errorf("process %d of the demo's jobs outlived it", pid)
		}
	}
	if _, err := os.Stat(st.StateDir); !os.IsNotExist(err) {
		t.Errorf("the demo's state directory %s after it stopped: %v", st.StateDir, err)
	}
}
