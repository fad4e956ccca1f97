package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
)

// StartAgentIn starts an agent for the replica name of set at addr.
func StartAgentIn(t testing.TB, set, name, addr string, join []string) *Proc {
	t.Helper()
	cfg := WriteFile(t, t.TempDir(), name+"-agent.yaml", fmt.Sprintf(`replica: {set: %s, name: %s, addr: "%s"}
probe: {path: /readyz, interval: 100ms, timeout: 500ms, rise: 2, fall: 2}
drain: {timeout: 10s}
listen: "127.0.0.1:0"
log: {level: info, format: json}
gossip:
  %s`, set, name, addr, gossipYAML(join, "  ")))
	return Start(t, name+"-agent", "agent", "-c", cfg)
}

// usersSpec creates the set users: every request to /ingest is its.
const usersSpec = `{"name": "users", "match": {"path_prefix": "/ingest"}, "replicas": 3, "key": [{"header": "X-Key"}],
 "timeouts": {"connect": "500ms", "request": "5s", "idle": "30s"}}`

// rotation returns a proxy's replicas of set in rotation.
func rotation(p *ProxyProc, set string) float64 {
	return Metric(p.Admin, "keyway_rotation_replicas", map[string]string{"set": set})
}

func setPhase(t testing.TB, p *ProxyProc, set string) string {
	t.Helper()
	c := &admin.Client{Addr: p.Admin}
	st, _, err := c.Set(set)
	if err != nil {
		return "error: " + err.Error()
	}
	return st.Phase
}

// A set created at run time through one proxy is served identically by a
// second proxy and by a third started afterwards; deleting it with
// replicas running is refused naming them; stopped, it answers 503 on
// every proxy (also one restarted meanwhile), its agents stop their
// replicas, and started again every key goes back to its owner; stopped
// once more, it can be deleted, everywhere.
func TestRunTimeSetFleetWide(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	t.Setenv("KEYWAY_ACTOR", "ops-alice")
	a := StartProxy(t, "proxy-a", nil, 3)
	b := StartProxy(t, "proxy-b", []string{a.Gossip}, 3)
	var agents []*Proc
	for i := range 3 {
		name := fmt.Sprintf("users-%d", i)
		_, addr := StartReplicaProcess(t, name)
		agents = append(agents, StartAgentIn(t, "users", name, addr, []string{a.Gossip}))
	}
	ca := &admin.Client{Addr: a.Admin, Token: "s3cret", Actor: "ops-alice", Timeout: 10 * time.Second}
	cb := &admin.Client{Addr: b.Admin, Token: "s3cret", Actor: "ops-bob", Timeout: 10 * time.Second}

	res, _, err := ca.CreateSet([]byte(usersSpec))
	if err != nil {
		t.Fatal(err)
	}
	if res.Set != "users" || res.Scope != admin.ScopeFleet || !strings.HasPrefix(res.By, "ops-alice (127.0.0.1:") {
		t.Fatalf("create: %+v", res)
	}
	for _, p := range []*ProxyProc{a, b} {
		poll.Until(t, 30*time.Second, p.Name+": users in rotation", func() bool { return rotation(p, "users") == 3 })
	}
	// Once proxy-b has the set, a second create through it is refused (two
	// creates at the same moment through two proxies: the last writer wins).
	if _, _, err := cb.CreateSet([]byte(usersSpec)); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a second create through the other proxy: %v", err)
	}
	keys := Keys(300)
	cl := NewClient()
	ownersA := cl.Owners(t, a.Addr, keys, 4)
	if ownersB := cl.Owners(t, b.Addr, keys, 4); !sameOwners(ownersA, ownersB) {
		t.Fatal("proxy-b routes the created set differently from proxy-a")
	}
	// A proxy started afterwards learns it from the others.
	c := StartProxy(t, "proxy-c", []string{b.Gossip}, 3)
	poll.Until(t, 30*time.Second, "proxy-c: users in rotation", func() bool { return rotation(c, "users") == 3 })
	if ownersC := cl.Owners(t, c.Addr, keys, 4); !sameOwners(ownersA, ownersC) {
		t.Fatal("proxy-c, started after the create, routes the set differently")
	}
	if got := stacktest.Get("http://" + c.Admin + "/readyz"); !strings.Contains(got, "ready") || strings.Contains(got, "not") {
		t.Fatalf("proxy-c readyz: %q", got)
	}
	// Who created it, and through which proxy, is in every proxy's audit trail.
	fa, _, err := ca.Fleet()
	if err != nil || fa.Self == "" {
		t.Fatalf("proxy-a's node name: %+v %v", fa, err)
	}
	for _, p := range []*ProxyProc{a, b, c} {
		ev := lastEvent(t, p.Admin, "runtime_change")
		if ev["set"] != "users" || ev["action"] != "create" || !strings.HasPrefix(fmt.Sprint(ev["by"]), "ops-alice") ||
			ev["via"] != fa.Self {
			t.Fatalf("%s: runtime_change event %v", p.Name, ev)
		}
	}

	// Delete with replicas running: 400 naming them.
	if _, raw, err := cb.DeleteSet("users"); err == nil || !strings.Contains(string(raw), "users-0 (ready)") || !strings.Contains(err.Error(), "keyway stop --set users") {
		t.Fatalf("delete with running replicas: %v %s; want a 400 naming users-0 (ready) and the fix", err, raw)
	}

	// Stop through b: 503 with Retry-After on every proxy, phase Stopped,
	// the agents end stopped.
	if res, _, err := cb.PatchSet("users", admin.SetPatch{Stop: ptrTo(true)}); err != nil || res.Action != "stop" || res.Stopped == nil || !*res.Stopped {
		t.Fatalf("stop: %+v %v", res, err)
	}
	for _, p := range []*ProxyProc{a, b, c} {
		poll.Until(t, 10*time.Second, p.Name+": users answers 503", func() bool {
			code, hdr := post(p.Addr, "k1")
			return code == 503 && hdr.Get("Retry-After") == "10"
		})
		if ph := setPhase(t, p, "users"); ph != "Stopped" {
			t.Fatalf("%s: phase %s after the stop", p.Name, ph)
		}
	}
	poll.Until(t, 30*time.Second, "every users agent stopped", func() bool {
		n := 0
		for _, m := range members(t, a.Admin) {
			if m.Set == "users" && m.State == "stopped" && m.Status == "alive" {
				n++
			}
		}
		return n == 3
	})
	// A proxy restarted while the others run comes back with the set stopped.
	a.Term(t, 10*time.Second)
	a2 := StartProxy(t, "proxy-a2", []string{b.Gossip}, 3)
	poll.Until(t, 20*time.Second, "proxy-a2: users answers 503", func() bool {
		code, _ := post(a2.Addr, "k1")
		return code == 503 && setPhase(t, a2, "users") == "Stopped"
	})

	// Start through the restarted proxy: every key back on its owner, everywhere.
	ca2 := &admin.Client{Addr: a2.Admin, Token: "s3cret", Timeout: 10 * time.Second}
	if res, _, err := ca2.PatchSet("users", admin.SetPatch{Stop: ptrTo(false)}); err != nil || res.Action != "start" {
		t.Fatalf("start: %+v %v", res, err)
	}
	for _, p := range []*ProxyProc{a2, b, c} {
		poll.Until(t, 30*time.Second, p.Name+": users back in rotation", func() bool { return rotation(p, "users") == 3 })
		if owners := cl.Owners(t, p.Addr, keys, 4); !sameOwners(ownersA, owners) {
			t.Fatalf("%s: keys moved across the stop and start", p.Name)
		}
	}

	// Stop again, wait for the agents, delete: gone on every proxy.
	if _, _, err := cb.PatchSet("users", admin.SetPatch{Stop: ptrTo(true)}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "delete accepted once the replicas stopped", func() bool {
		_, _, err := cb.DeleteSet("users")
		return err == nil
	})
	for _, p := range []*ProxyProc{a2, b, c} {
		poll.Until(t, 10*time.Second, p.Name+": users gone", func() bool {
			_, _, err := (&admin.Client{Addr: p.Admin}).Set("users")
			return err != nil && strings.Contains(err.Error(), "unknown replica set")
		})
	}
	// The agents keep running, stopped.
	for _, ag := range agents {
		if ag.Exited() {
			t.Fatalf("%s exited after its set was stopped and deleted", ag.Name)
		}
	}
}

// A proxy with runtime.state_dir keeps the run-time state across a
// restart of the whole fleet (here, its only proxy), and export writes the
// sets as the file would declare them.
func TestRunTimeStateDirSurvivesAFullRestart(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	_, raddr := StartReplicaProcess(t, "static-0")
	state := t.TempDir()
	cfg := WriteFile(t, t.TempDir(), "p.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
runtime: {state_dir: %q}
gossip:
  enabled: true
  %s
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: %q}]
`, state, gossipYAML(nil, "  "), raddr))
	p := StartProxyFile(t, "proxy", cfg)
	cl := &admin.Client{Addr: p.Admin, Token: "s3cret", Timeout: 10 * time.Second}
	spec := fmt.Sprintf(`{"name": "users", "match": {"path_prefix": "/ingest"}, "static": [{"name": "u-0", "addr": %q}]}`, raddr)
	if _, _, err := cl.CreateSet([]byte(spec)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cl.Scale("orders", 4); err != nil {
		t.Fatal(err)
	}
	if code, _ := post(p.Addr, "k"); code != 200 {
		t.Fatalf("users before the restart: %d", code)
	}
	if _, err := os.Stat(filepath.Join(state, "runtime.json")); err != nil {
		t.Fatal(err)
	}
	p.Term(t, 10*time.Second)

	p2 := StartProxyFile(t, "proxy-again", cfg)
	st, _, err := (&admin.Client{Addr: p2.Admin}).Set("users")
	if err != nil || st.Source != "runtime" {
		t.Fatalf("users after the restart: %+v %v", st, err)
	}
	if o, _, err := (&admin.Client{Addr: p2.Admin}).Set("orders"); err != nil || o.Declared != 4 || o.Runtime == nil {
		t.Fatalf("orders after the restart: %+v %v", o, err)
	}
	if code, _ := post(p2.Addr, "k"); code != 200 {
		t.Fatalf("users after the restart: %d", code)
	}
	// export gives the replica_sets a file would need to say the same.
	y, err := (&admin.Client{Addr: p2.Admin}).Export()
	if err != nil {
		t.Fatal(err)
	}
	file, err := config.LoadBytes("export.yaml", append([]byte("listen: \"127.0.0.1:0\"\n"), y...), config.WithEnv(nil))
	if err != nil {
		t.Fatalf("the export does not load as a configuration: %v\n%s", err, y)
	}
	if len(file.ReplicaSets) != 2 || file.ReplicaSets[0].Replicas != 4 || file.ReplicaSets[1].Name != "users" {
		t.Fatalf("export: %+v", file.ReplicaSets)
	}
}

func ptrTo[T any](v T) *T { return &v }

// lastEvent returns the newest audit event of a kind on a proxy.
func lastEvent(t testing.TB, adminAddr, kind string) map[string]any {
	t.Helper()
	var evs struct {
		Events []map[string]any `json:"events"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/events?kind="+kind+"&limit=1", &evs)
	if len(evs.Events) == 0 {
		t.Fatalf("no %s event on %s", kind, adminAddr)
	}
	return evs.Events[0]
}

func sameOwners(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// post sends one keyed request to /ingest and returns the status and the
// response headers.
func post(addr, key string) (int, http.Header) {
	req, _ := http.NewRequest("POST", "http://"+addr+"/ingest", strings.NewReader("x"))
	req.Header.Set("X-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

func members(t testing.TB, adminAddr string) []admin.MemberInfo {
	t.Helper()
	ms, _, err := (&admin.Client{Addr: adminAddr}).Members()
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// Supervising agents stop their processes when their set is stopped
// (drained first, no restart, no failed) and start new ones when it is
// started; every key goes back to its owner.
func TestStopStartSupervisedSet(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	a := StartProxy(t, "proxy-a", nil, 2)
	var reps []*SupervisedProc
	for i := range 2 {
		reps = append(reps, StartSupervisedReplica(t, fmt.Sprintf("orders-%d", i), []string{a.Gossip}))
	}
	a.WaitRotation(t, 2, 30*time.Second)
	keys := Keys(200)
	cl := NewClient()
	before := cl.Owners(t, a.Addr, keys, 4)
	ca := &admin.Client{Addr: a.Admin, Token: "s3cret", Timeout: 10 * time.Second}

	start := time.Now()
	if _, _, err := ca.PatchSet("orders", admin.SetPatch{Stop: ptrTo(true)}); err != nil {
		t.Fatal(err)
	}
	if code, hdr := post(a.Addr, "k"); code != 503 || hdr.Get("Retry-After") != "10" {
		t.Fatalf("right after the stop: %d %v", code, hdr)
	}
	poll.Until(t, 30*time.Second, "both processes stopped and both replicas stopped", func() bool {
		n := 0
		for _, r := range reps {
			if len(r.Logs("replica process exited")) == 1 {
				n++
			}
		}
		stopped := 0
		for _, m := range members(t, a.Admin) {
			if m.Set == "orders" && m.State == "stopped" {
				stopped++
			}
		}
		return n == 2 && stopped == 2
	})
	stopTook := time.Since(start)
	for _, r := range reps {
		if ex := r.Logs("replica process exited"); ex[0]["reason"] != "stop" {
			t.Fatalf("%s exited with %v, want reason stop", r.Name, ex[0])
		}
		if len(r.ChildPids()) != 1 || r.Exited() {
			t.Fatalf("%s: %d processes started, agent exited %v; want 1 and running", r.Name, len(r.ChildPids()), r.Exited())
		}
	}
	start = time.Now()
	if _, _, err := ca.PatchSet("orders", admin.SetPatch{Stop: ptrTo(false)}); err != nil {
		t.Fatal(err)
	}
	a.WaitRotation(t, 2, 30*time.Second)
	startTook := time.Since(start)
	for _, r := range reps {
		if n := len(r.ChildPids()); n != 2 {
			t.Fatalf("%s: %d processes started, want 2", r.Name, n)
		}
	}
	if after := cl.Owners(t, a.Addr, keys, 4); !sameOwners(before, after) {
		t.Fatal("keys moved across a stop and a start")
	}
	if ph := setPhase(t, a, "orders"); ph != "Running" {
		t.Fatalf("phase after the start: %s", ph)
	}
	t.Logf("stop → both supervised replicas stopped: %s; start → both back in rotation: %s", stopTook.Round(time.Millisecond), startTook.Round(time.Millisecond))
}
