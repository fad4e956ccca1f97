package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// fleet is two in-process proxy nodes joined by gossip, with three test
// replicas of "orders" advertised by gossip members.
type fleet struct {
	a, b    *stacktest.Stack
	reps    []*stacktest.Replica
	members []*membership.Node // the replicas' gossip members
	leave   []func()
}

func startFleet(t *testing.T, health string) *fleet {
	t.Helper()
	yml := func(join string) string {
		j := "[]"
		if join != "" {
			j = `["` + join + `"]`
		}
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast, join: %s, push_pull_interval: 2s, rejoin_interval: 5s}
fleet: {interval: 200ms, disagreement_bound: 1s}
health:
%s
replica_sets:
  - name: orders
    replicas: 3
    retries: {attempts: 2}
`, j, health)
	}
	load := func(s string) config.Config {
		cfg, err := config.LoadBytes("fleet.yaml", []byte(s), config.WithEnv(func(string) (string, bool) { return "", false }))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	f := &fleet{}
	f.a = stacktest.StartProxy(t, load(yml("")), stacktest.Opts{Gossip: true})
	f.b = stacktest.StartProxy(t, load(yml(f.a.Gossip)), stacktest.Opts{Gossip: true})
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		r := stacktest.StartReplica(t, name)
		f.reps = append(f.reps, r)
		n, leave := stacktest.StartGossipReplica(t, f.a.Gossip, membership.Meta{Set: "orders", Replica: name, Addr: r.Addr, State: balancer.StateReady})
		f.members, f.leave = append(f.members, n), append(f.leave, leave)
	}
	for _, s := range []*stacktest.Stack{f.a, f.b} {
		waitInRotation(t, s.Admin, 3)
	}
	poll.Until(t, 10*time.Second, "the two proxies hear each other's views", func() bool {
		return len(fleetOf(t, f.a.Admin).Proxies) == 1 && len(fleetOf(t, f.b.Admin).Proxies) == 1
	})
	return f
}

func fleetOf(t *testing.T, adminAddr string) admin.FleetStatus {
	t.Helper()
	var fs admin.FleetStatus
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/fleet", &fs)
	return fs
}

func pickOf(t *testing.T, adminAddr, key string) string {
	t.Helper()
	var ex admin.RouteExplain
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/route?set=orders&key="+url.QueryEscape(key), &ex)
	return ex.Pick
}

// sendVia sends one keyed request through a proxy, with extra headers,
// and returns the status.
func sendVia(t *testing.T, proxyAddr, key string, hdr ...string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+proxyAddr+"/ingest", nil)
	req.Header.Set("X-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// An ejection seen by one proxy reaches the other: B, idle, diverts the
// same partitions as A, and lets the replica back when A does.
func TestFleetEjectionReachesEveryProxy(t *testing.T) {
	slow.Skip(t)
	f := startFleet(t, "  passive: {enabled: true, consecutive_failures: 2, count: [5xx], base_ejection: 3s, interval: 50ms}")
	victim := f.reps[1]
	key := ""
	for i := 0; key == ""; i++ {
		if i == 1000 {
			t.Fatal("no key of 1000 is owned by orders-1")
		}
		if k := fmt.Sprintf("k-%d", i); pickOf(t, f.a.Admin, k) == victim.Name {
			key = k
		}
	}
	victim.Failing.Store(true)
	for range 2 {
		if code := sendVia(t, f.a.Proxy, key); code != 500 {
			t.Fatalf("the failing replica answered %d through A", code)
		}
	}
	victim.Failing.Store(false)
	start := time.Now()
	poll.Until(t, 10*time.Second, "A ejects orders-1", func() bool { return pickOf(t, f.a.Admin, key) != victim.Name })
	ejected := time.Since(start)
	poll.Until(t, 10*time.Second, "B diverts orders-1's keys too", func() bool { return pickOf(t, f.b.Admin, key) != victim.Name })
	reached := time.Since(start)
	fb := fleetOf(t, f.b.Admin)
	if len(fb.Sets) != 1 || len(fb.Sets[0].Held) != 1 || fb.Sets[0].Held[0].Replica != victim.Name {
		t.Fatalf("B's fleet view: %+v", fb.Sets)
	}
	poll.Until(t, 10*time.Second, "A and B agree", func() bool { return fleetOf(t, f.a.Admin).Agree && fleetOf(t, f.b.Admin).Agree })
	agreed := time.Since(start)
	for i := range 300 {
		k := fmt.Sprintf("order-%d", i)
		if pa, pb := pickOf(t, f.a.Admin, k), pickOf(t, f.b.Admin, k); pa != pb {
			t.Fatalf("key %s: A picks %s, B %s", k, pa, pb)
		}
	}
	// The proxies' own clocks (one machine): A's ejected event to B's
	// fleet_hold event.
	lag := eventTime(t, f.b.Admin, "fleet_hold").Sub(eventTime(t, f.a.Admin, "ejected"))
	if lag < 0 {
		t.Fatalf("B held orders-1 out before A ejected it (%v)", lag)
	}
	t.Logf("convergence after an ejection: B held out the replica A ejected %v after A's ejection (audit timestamps); observed by polling: A ejected %v after the second 5xx, B diverted within %v of that, digests equal within %v",
		lag, ejected.Round(time.Millisecond), (reached - ejected).Round(time.Millisecond), (agreed - ejected).Round(time.Millisecond))

	// The ejection ends on A (base_ejection 3s): B lets orders-1 back.
	poll.Until(t, 15*time.Second, "B lets orders-1 back", func() bool { return pickOf(t, f.b.Admin, key) == victim.Name })
	poll.Until(t, 10*time.Second, "A and B agree again", func() bool { return fleetOf(t, f.a.Admin).Agree && fleetOf(t, f.b.Admin).Agree })
}

// One proxy with a broken path to a replica cannot take it out of the
// fleet: B, which sends the replica traffic successfully, vetoes A's
// vote. A keeps diverting that replica's keys on its own (to the same next
// replica the fleet would use), and both report the disagreement.
func TestFleetBrokenPathIsVetoed(t *testing.T) {
	slow.Skip(t)
	f := startFleet(t, "  passive: {enabled: true, consecutive_failures: 2, count: [5xx], base_ejection: 1m, max_ejection: 1m, interval: 50ms}")
	victim := f.reps[2]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k-%d", i); pickOf(t, f.a.Admin, k) == victim.Name {
			key = k
		}
	}
	// B keeps sending the victim's keys, successfully.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 20000; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			req, _ := http.NewRequest("GET", "http://"+f.b.Proxy+"/ingest", nil)
			req.Header.Set("X-Key", key)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
	defer func() { close(stop); <-done }()
	poll.Until(t, 5*time.Second, "B's traffic reaches the victim", func() bool { return victim.Requests() > 2 })

	// A's path is broken: the victim fails A's requests (X-Fail).
	for range 2 {
		if code := sendVia(t, f.a.Proxy, key, "X-Fail", "1"); code != 500 {
			t.Fatalf("the victim answered A's request with %d", code)
		}
	}
	poll.Until(t, 10*time.Second, "A ejects the victim locally", func() bool { return pickOf(t, f.a.Admin, key) != victim.Name })
	poll.Until(t, 10*time.Second, "A reports that B disagrees", func() bool {
		fa := fleetOf(t, f.a.Admin)
		return !fa.Agree && len(fa.Sets[0].Peers) == 1 && fa.Sets[0].Peers[0].DisagreeingSeconds > 1
	})
	// B never held it out: its traffic still reaches the victim, and the
	// fleet holds nothing.
	if p := pickOf(t, f.b.Admin, key); p != victim.Name {
		t.Fatalf("B picks %s for the victim's key: A's broken path drained a healthy replica from the fleet", p)
	}
	fb := fleetOf(t, f.b.Admin)
	if len(fb.Sets[0].Held) != 0 || fb.Agree {
		t.Fatalf("B's fleet view: %+v", fb)
	}
	// The disagreement outlasted fleet.disagreement_bound (1s): audited.
	var evs struct {
		Events []map[string]any `json:"events"`
	}
	poll.Until(t, 10*time.Second, "a fleet_disagreement audit event on A", func() bool {
		stacktest.GetJSON(t, "http://"+f.a.Admin+"/v1/events?kind=fleet_disagreement", &evs)
		return len(evs.Events) > 0
	})
}

// eventTime is the time of the newest audit event of a kind on a proxy.
func eventTime(t *testing.T, adminAddr, kind string) time.Time {
	t.Helper()
	var evs struct {
		Events []struct {
			TS time.Time `json:"ts"`
		} `json:"events"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/events?kind="+kind+"&limit=1", &evs)
	if len(evs.Events) == 0 {
		t.Fatalf("no %s event on %s", kind, adminAddr)
	}
	return evs.Events[0].TS
}

// A rolling restart of every replica, as agents do it (draining, stopped
// and gone, a new incarnation starting, then ready), under traffic through
// both proxies: how long do the two proxies' routing digests differ? They
// learn each change by gossip at slightly different moments; the windows
// are measured by sampling both proxies' digests.
func TestFleetRollingRestartDisagreementWindows(t *testing.T) {
	slow.Skip(t)
	f := startFleet(t, "  passive: {enabled: true, consecutive_failures: 3, count: [connect, 5xx], base_ejection: 2s, interval: 50ms}")
	var (
		mu      sync.Mutex
		windows []time.Duration
		open    time.Time
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	var sent, failed atomic.Int64
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for i := 0; i < 100000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			px := f.a.Proxy
			if i%2 == 1 {
				px = f.b.Proxy
			}
			req, _ := http.NewRequest("GET", "http://"+px+"/ingest", nil)
			req.Header.Set("X-Key", fmt.Sprintf("roll-%d", i))
			sent.Add(1)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				failed.Add(1)
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failed.Add(1)
			}
		}
	}()
	go func() {
		defer close(sampled)
		for i := 0; i < 100000; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			da, db := digestOf(f.a.Admin), digestOf(f.b.Admin)
			now := time.Now()
			mu.Lock()
			switch {
			case da != db && open.IsZero():
				open = now
			case da == db && !open.IsZero():
				windows = append(windows, now.Sub(open))
				open = time.Time{}
			}
			mu.Unlock()
		}
	}()
	for i, r := range f.reps {
		name := fmt.Sprintf("orders-%d", i)
		old := f.members[i]
		if err := old.UpdateMeta(func(m *membership.Meta) { m.State = balancer.StateDraining }, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		waitInRotation(t, f.a.Admin, 2)
		f.leave[i]()
		n, leave := stacktest.StartGossipReplica(t, f.a.Gossip, membership.Meta{Set: "orders", Replica: name, Addr: r.Addr, State: balancer.StateStarting})
		f.members[i], f.leave[i] = n, leave
		if err := n.UpdateMeta(func(m *membership.Meta) { m.State = balancer.StateReady }, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		for _, s := range []*stacktest.Stack{f.a, f.b} {
			waitInRotation(t, s.Admin, 3)
		}
	}
	poll.Until(t, 10*time.Second, "A and B agree after the rolling restart", func() bool { return digestOf(f.a.Admin) == digestOf(f.b.Admin) })
	close(stop)
	<-sampled
	<-loadDone
	if failed.Load() > 0 {
		t.Fatalf("%d of %d requests failed during the rolling restart", failed.Load(), sent.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	var total, longest time.Duration
	for _, w := range windows {
		total += w
		longest = max(longest, w)
	}
	t.Logf("rolling restart of 3 replicas under %d requests through both proxies (all 200): %d disagreement windows between the two proxies' digests, longest %v, %v in all (sampled every 5ms)", sent.Load(), len(windows), longest, total)
	if longest > 5*time.Second {
		t.Fatalf("the proxies disagreed for %v in one stretch", longest)
	}
}

// digestOf is a proxy's routing digest of "orders", or "" when it cannot
// be read.
func digestOf(adminAddr string) string {
	resp, err := http.Get("http://" + adminAddr + "/v1/fleet")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var fs admin.FleetStatus
	if json.NewDecoder(resp.Body).Decode(&fs) != nil || len(fs.Sets) == 0 {
		return ""
	}
	return fs.Sets[0].Digest
}

// A request in flight through one proxy shows in the other's
// fleet_inflight of that replica: a drain can be watched fleet-wide.
func TestFleetInflightIsSummed(t *testing.T) {
	slow.Skip(t)
	f := startFleet(t, "  passive: {enabled: false}")
	victim := f.reps[0]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k-%d", i); pickOf(t, f.a.Admin, k) == victim.Name {
			key = k
		}
	}
	done := make(chan int, 1)
	go func() { done <- sendVia(t, f.b.Proxy, key, "X-Hang", "1") }()
	replica := func(adminAddr string) admin.ReplicaStatus {
		var st admin.SetStatus
		stacktest.GetJSON(t, "http://"+adminAddr+"/v1/replica_sets/orders", &st)
		for _, r := range st.Replicas {
			if r.Name == victim.Name {
				return r
			}
		}
		t.Fatalf("no %s in %+v", victim.Name, st)
		return admin.ReplicaStatus{}
	}
	poll.Until(t, 10*time.Second, "A to count B's request in flight", func() bool {
		r := replica(f.a.Admin)
		return r.Inflight == 0 && r.FleetInflight == 1 && r.FleetProxies == 2
	})
	if r := replica(f.b.Admin); r.Inflight != 1 || r.FleetInflight != 1 {
		t.Fatalf("B's own view of its request in flight: %+v", r)
	}
	victim.Unblock()
	if code := <-done; code != 200 {
		t.Fatalf("the held request got %d", code)
	}
	poll.Until(t, 10*time.Second, "A to see nothing in flight", func() bool { return replica(f.a.Admin).FleetInflight == 0 })
}

// A repair asked of one proxy lifts the health holds of every proxy: a
// replica A ejected for 10 minutes (and B holds out on A's evidence) is
// back in rotation on both at once when B is asked.
func TestRepairLiftsHoldsOnEveryProxy(t *testing.T) {
	slow.Skip(t)
	t.Setenv(admin.TokenEnv, "s3cret")
	f := startFleet(t, "  passive: {enabled: true, consecutive_failures: 1, count: [5xx], base_ejection: 10m, max_ejection: 10m, interval: 50ms}")
	victim := f.reps[1]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k-%d", i); pickOf(t, f.a.Admin, k) == victim.Name {
			key = k
		}
	}
	// A ejects it; B holds it out on A's evidence.
	if code := sendVia(t, f.a.Proxy, key, "X-Fail", "1"); code != 500 {
		t.Fatalf("the failing replica answered %d", code)
	}
	for _, s := range []*stacktest.Stack{f.a, f.b} {
		poll.Until(t, 10*time.Second, "the replica out of rotation", func() bool { return pickOf(t, s.Admin, key) != victim.Name })
	}
	req, _ := http.NewRequest("POST", "http://"+f.b.Admin+"/v1/replica_sets/orders/repair", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var res admin.RepairResult
	err = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusAccepted || len(res.Agents) != 3 || res.Proxies != 1 || len(res.Reset) != 0 {
		t.Fatalf("repair: %d %+v %v", resp.StatusCode, res, err)
	}
	start := time.Now()
	for _, s := range []*stacktest.Stack{f.a, f.b} {
		poll.Until(t, 10*time.Second, "the replica back in rotation", func() bool { return pickOf(t, s.Admin, key) == victim.Name })
	}
	t.Logf("repair through B: the replica ejected for 10m was back on both proxies %v after the answer", time.Since(start).Round(time.Millisecond))
	if code := sendVia(t, f.a.Proxy, key); code != 200 {
		t.Fatalf("after the repair the replica answered %d through A", code)
	}
	poll.Until(t, 10*time.Second, "a repair audit event on A, from B", func() bool {
		var evs struct {
			Events []map[string]any `json:"events"`
		}
		stacktest.GetJSON(t, "http://"+f.a.Admin+"/v1/events?kind=admin_action", &evs)
		for _, e := range evs.Events {
			if e["action"] == "repair" && e["by"] != nil {
				return true
			}
		}
		return false
	})
}
