package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// TestRouteExplainsWhoAnswers checks the admin API's route explanation
// against the proxy itself: for hundreds of keys, GET /v1/route names the
// replica that then answers a request carrying that key, or says that
// keyway answers itself (and with what), under failover next and strict
// and the fail_open all-down policy, with replicas drained, ejected by
// passive health checks and stopped.
func TestRouteExplainsWhoAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		failover string
		allDown  string
		// ejectAll ejects every replica that is still in rotation after the
		// drain and the stop, so that none is left.
		ejectAll bool
	}{
		"next":      {failover: "next", allDown: "fail_closed"},
		"strict":    {failover: "strict", allDown: "fail_closed"},
		"fail_open": {failover: "next", allDown: "fail_open", ejectAll: true},
		"all_down":  {failover: "next", allDown: "fail_closed", ejectAll: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			checkRouteExplanations(t, tc.failover, tc.allDown, tc.ejectAll)
		})
	}
}

func checkRouteExplanations(t *testing.T, failover, allDown string, ejectAll bool) {
	yml := fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast}
health:
  all_down: %s
  # One 5xx ejects a replica for longer than the test; every replica may
  # be ejected.
  passive: {enabled: true, consecutive_failures: 1, count: [5xx], base_ejection: 10m, max_ejection: 10m, max_ejected_share: 1, interval: 20ms}
replica_sets:
  - name: orders
    replicas: 4
    failover: %s
    retries: {attempts: 2}
`, allDown, failover)
	cfg, err := config.LoadBytes("route.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	stk := stacktest.StartProxy(t, cfg, stacktest.Opts{Gossip: true})
	reps := make([]*stacktest.Replica, 4)
	nodes := make([]*membership.Node, 4)
	for i := range reps {
		name := fmt.Sprintf("orders-%d", i)
		reps[i] = stacktest.StartReplica(t, name)
		nodes[i], _ = stacktest.StartGossipReplica(t, stk.Gossip, membership.Meta{Set: "orders", Replica: name, Addr: reps[i].Addr, State: balancer.StateReady})
	}
	waitInRotation(t, stk.Admin, 4)

	route := func(key string) admin.RouteExplain {
		var ex admin.RouteExplain
		stacktest.GetJSON(t, "http://"+stk.Admin+"/v1/route?set=orders&key="+url.QueryEscape(key), &ex)
		return ex
	}
	send := func(key string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+stk.Proxy+"/ingest", nil)
		req.Header.Set("X-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// eject makes a replica answer 5xx to one request it owns, which
	// ejects it; it answers normally again afterwards, so that a request
	// fail_open sends it is answered.
	eject := func(i, inRotation int) {
		t.Helper()
		reps[i].Failing.Store(true)
		defer reps[i].Failing.Store(false)
		for k := 0; ; k++ {
			if k == 1000 {
				t.Fatalf("no key of 1000 is owned by orders-%d", i)
			}
			key := fmt.Sprintf("eject-%d", k)
			if route(key).Owner == reps[i].Name {
				if code, _ := send(key); code != http.StatusInternalServerError {
					t.Fatalf("orders-%d, failing, answered %d", i, code)
				}
				break
			}
		}
		waitInRotation(t, stk.Admin, inRotation)
	}
	setState := func(i int, s balancer.State, inRotation int) {
		t.Helper()
		if err := nodes[i].UpdateMeta(func(m *membership.Meta) { m.State = s }, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		waitInRotation(t, stk.Admin, inRotation)
	}

	setState(1, balancer.StateDraining, 3) // drained
	eject(2, 2)                            // ejected
	setState(3, balancer.StateStopped, 1)  // stopped (still on the ring)
	if ejectAll {
		eject(0, 0)
	}

	picked := map[string]int{}
	for k := range 300 {
		key := fmt.Sprintf("order-%d", k)
		ex := route(key)
		code, body := send(key)
		switch {
		case ex.Pick != "":
			// The replica answers with its name (and 200, or 500 when it
			// is the one still failing).
			if body != ex.Pick {
				t.Fatalf("key %s: /v1/route picks %s (owner %s), but %s answered (%d); candidates %+v", key, ex.Pick, ex.Owner, strings.TrimSpace(body), code, ex.Candidates)
			}
			picked[ex.Pick]++
		default:
			if code != http.StatusServiceUnavailable {
				t.Fatalf("key %s: /v1/route says keyway answers itself, but the request got %d %s (owner %s)", key, code, body, ex.Owner)
			}
			if ex.Answer == "" || !strings.Contains(body, ex.Answer) {
				t.Fatalf("key %s: /v1/route says keyway answers %q, the request got %d %s", key, ex.Answer, code, body)
			}
			picked[""]++
		}
	}
	t.Logf("failover %s, all_down %s: picks %v", failover, allDown, picked)
	// Every scenario exercises both outcomes (a replica answers, keyway
	// answers itself), except failover next with a replica left in
	// rotation, where every key is answered.
	if picked[""] == 0 && (failover == "strict" || ejectAll) {
		t.Errorf("no key was answered by keyway itself: the scenario does not test it")
	}
	if picked[""] == 300 && !(ejectAll && allDown == "fail_closed") {
		t.Errorf("no key reached a replica: the scenario does not test picks")
	}
}

// waitInRotation polls the admin API until the set "orders" has n
// replicas in rotation.
func waitInRotation(t *testing.T, adminAddr string, n int) {
	t.Helper()
	poll.Until(t, 15*time.Second, fmt.Sprintf("%d replicas of orders in rotation", n), func() bool {
		var st admin.SetStatus
		stacktest.GetJSON(t, "http://"+adminAddr+"/v1/replica_sets/orders", &st)
		return st.InRotation == n
	})
}
