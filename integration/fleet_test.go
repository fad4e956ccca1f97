package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// fleet is two in-process proxy nodes joined by gossip, with three test
// replicas of "orders" advertised by gossip members.
type fleet struct {
	a, b *stacktest.Stack
	reps []*stacktest.Replica
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
		stacktest.StartGossipReplica(t, f.a.Gossip, membership.Meta{Set: "orders", Replica: name, Addr: r.Addr, State: balancer.StateReady})
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
