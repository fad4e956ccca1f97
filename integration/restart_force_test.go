package integration

import (
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
)

// keyway restart against agents that supervise no process (no -- CMD) is
// refused at once, naming the replicas, the reason and the fix, instead
// of waiting out its step timeout; nothing is drained and no restart is
// recorded. A repair with nothing failed is refused too.
func TestRestartRefusedWithoutCommand(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	px := StartProxy(t, "proxy-a", nil, 2)
	for i := range 2 {
		StartReplica(t, fmt.Sprintf("orders-%d", i), []string{px.Gossip})
	}
	px.WaitRotation(t, 2, 30*time.Second)
	poll.Until(t, 10*time.Second, "both agents saying they supervise no process", func() bool {
		ms, _, err := (&admin.Client{Addr: px.Admin}).Members()
		n := 0
		for _, m := range ms {
			if m.Replica != "" && m.Supervised != nil && !*m.Supervised {
				n++
			}
		}
		return err == nil && n == 2
	})

	start := time.Now()
	out, err := exec.Command(Binary, "restart", "--admin", px.Admin, "--set", "orders", "--step-timeout", "30s").CombinedOutput()
	took := time.Since(start)
	want := "restart orders refused: orders-0, orders-1 run without -- CMD: their agents supervise no process, so keyway cannot restart them; " +
		"restart the replicas yourself, or run the agents with -- CMD (HTTP 409)"
	if err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("keyway restart: %v\n%s\nwant %q", err, out, want)
	}
	if took > 10*time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if _, _, err := (&admin.Client{Addr: px.Admin}).RestartStatus("orders"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Fatalf("a refused restart left a record: %v", err)
	}
	px.WaitRotation(t, 2, time.Second) // nothing was drained

	out, err = exec.Command(Binary, "repair", "--admin", px.Admin, "--set", "orders").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "repair orders refused: nothing to repair") {
		t.Fatalf("keyway repair: %v\n%s", err, out)
	}
	t.Logf("keyway restart refused after %s:\n%s", took.Round(time.Millisecond), out)
}

// keyway restart --force of a supervised replica that holds a request
// that never ends (its demo replica in hang mode): the replica is taken
// out of rotation and restarted without waiting for that request, which
// fails; the restart is recorded and audited as forced.
func TestRestartForceSkipsAHangingDrain(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	// A long request timeout: the hanging request stays in flight for the
	// whole restart.
	cfg := WriteFile(t, t.TempDir(), "proxy-a.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
gossip:
  enabled: true
  %s
replica_sets:
  - name: orders
    replicas: 1
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 2m, idle: 30s}
`, gossipYAML(nil, "  ")))
	px := StartProxyFile(t, "proxy-a", cfg)
	rep := StartSupervisedReplica(t, "orders-0", []string{px.Gossip}, "--supervise.stop_grace", "2s")
	px.WaitRotation(t, 1, 30*time.Second)

	resp, err := http.Post("http://"+rep.Addr+"/_mode?v=hang", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	hung := make(chan error, 1)
	go func() {
		code, _, err := NewClient().Send(px.Addr, "k1")
		if err == nil {
			err = fmt.Errorf("status %d", code)
		}
		hung <- err
	}()
	poll.Until(t, 10*time.Second, "the request in flight to orders-0", func() bool {
		s, _, err := (&admin.Client{Addr: px.Admin}).Set("orders")
		return err == nil && len(s.Replicas) == 1 && s.Replicas[0].FleetInflight == 1
	})

	start := time.Now()
	out, err := exec.Command(Binary, "restart", "--admin", px.Admin, "--set", "orders", "--force", "--step-timeout", "60s").CombinedOutput()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("keyway restart --force: %v\n%s", err, out)
	}
	for _, want := range []string{"forced: no wait for requests in flight", "forced: out of rotation here; not waiting for 1 requests in flight here",
		"started", "ready", "rolling restart of orders done"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("keyway restart --force printed no %q:\n%s", want, out)
		}
	}
	if took > 30*time.Second {
		t.Errorf("the forced restart took %v", took)
	}
	select {
	case err := <-hung:
		t.Logf("the hanging request ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the hanging request is still in flight after the forced restart")
	}
	poll.Until(t, 10*time.Second, "orders-0's second process", func() bool { return len(rep.ChildPids()) == 2 })
	px.WaitRotation(t, 1, 10*time.Second)

	st, _, err := (&admin.Client{Addr: px.Admin}).RestartStatus("orders")
	if err != nil || st.State != "done" || !st.Force || st.Mark {
		t.Fatalf("restart status: %+v %v", st, err)
	}
	var evs struct {
		Events []map[string]any `json:"events"`
	}
	stacktest.GetJSON(t, "http://"+px.Admin+"/v1/events?kind=admin_action", &evs)
	forced := slices.ContainsFunc(evs.Events, func(e map[string]any) bool {
		return e["action"] == "restart" && e["force"] == true && e["result"] == nil
	})
	if !forced {
		t.Fatalf("no admin_action restart with force true in %v", evs.Events)
	}
	t.Logf("forced restart of a replica holding a hanging request: %s\n%s", took.Round(time.Millisecond),
		regexp.MustCompile(`(?m)^`).ReplaceAllString(string(out), "  "))
}
