package integration

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// procEnv returns the environment of process pid as the kernel holds it
// (for an exec'd process: the environment of the last exec).
func procEnv(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Skipf("no /proc environ to read: %v", err)
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env
}

// TestRuntimeSysmonAwake: keyway proxy re-executes itself in place (the
// same PID, still serving) with GODEBUG keeping the runtime's monitor
// thread out of deep sleep, keeping what the operator put in GODEBUG;
// with server.runtime_deep_sleep (here by its environment variable) it
// runs as started.
func TestRuntimeSysmonAwake(t *testing.T) {
	skipShort(t)
	_, replica := StartReplicaProcess(t, "r0")
	cfg := WriteFile(t, t.TempDir(), "keyway.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
replica_sets:
  - name: orders
    replicas: 1
    key: [{header: X-Key}]
    static: [{name: r0, addr: %q}]
`, replica))
	t.Setenv("GODEBUG", "madvdontneed=1")
	for _, c := range []struct {
		deepSleep string
		want      string
	}{
		{"", "madvdontneed=1,schedtrace=2147483647"},
		{"true", "madvdontneed=1"},
	} {
		t.Run("deep_sleep="+c.deepSleep, func(t *testing.T) {
			t.Setenv("KEYWAY_SERVER_RUNTIME_DEEP_SLEEP", c.deepSleep)
			p := Start(t, "proxy", "proxy", "-c", cfg)
			addr := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
			if got := procEnv(t, p.Pid())["GODEBUG"]; got != c.want {
				t.Fatalf("GODEBUG of the running proxy (pid %d) = %q, want %q", p.Pid(), got, c.want)
			}
			accessPost(t, addr, "/ingest", "X-Key", "k1")
			if p.Exited() {
				t.Fatalf("the proxy exited:\n%s", p.tail(20))
			}
		})
	}
}
