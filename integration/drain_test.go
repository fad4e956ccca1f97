package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"keyway/internal/poll"
)

// setReplica returns one replica of "orders" as a proxy's admin API shows it.
func setReplica(t testing.TB, adminAddr, name string) (state, reason string, inRotation, ok bool) {
	resp, err := http.Get("http://" + adminAddr + "/v1/replica_sets/orders")
	if err != nil {
		return "", "", false, false
	}
	defer resp.Body.Close()
	var st struct {
		Replicas []struct {
			Name       string `json:"name"`
			State      string `json:"state"`
			Reason     string `json:"reason"`
			InRotation bool   `json:"in_rotation"`
		} `json:"replicas"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return "", "", false, false
	}
	for _, r := range st.Replicas {
		if r.Name == name {
			return r.State, r.Reason, r.InRotation, true
		}
	}
	return "", "", false, false
}

func adminPost(t testing.TB, adminAddr, path, token string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+adminAddr+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// A drain issued on proxy A's admin API reaches the replica's agent by
// gossip: proxy B takes the replica out of rotation too (state draining),
// its keys go through B to their stand-ins, and an undrain on A brings it
// back on both proxies.
func TestDrainOnOneProxyStopsTrafficFromAnother(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret") // inherited by the proxies
	a, reps := cluster(t, 3)
	b := StartProxy(t, "proxy-b", []string{a.Gossip}, 3)
	b.WaitRotation(t, 3, 30*time.Second)

	keys := Keys(2000)
	c := NewClient()
	before := c.Owners(t, b.Addr, keys, 8)
	victim := reps[1].Name
	owned := 0
	for _, k := range keys {
		if before[k] == victim {
			owned++
		}
	}
	if owned == 0 {
		t.Fatalf("no key owned by %s", victim)
	}

	path := fmt.Sprintf("/v1/replica_sets/orders/replicas/%s/", victim)
	if code, body := adminPost(t, a.Admin, path+"drain", ""); code != 401 {
		t.Fatalf("drain without a token: %d %v", code, body)
	}
	code, body := adminPost(t, a.Admin, path+"drain", "s3cret")
	if code != 202 || body["scope"] != "gossip" || body["action"] != "drain" {
		t.Fatalf("drain on A: %d %v", code, body)
	}
	start := time.Now()
	for _, p := range []*ProxyProc{a, b} {
		poll.Until(t, 15*time.Second, p.Name+" to see "+victim+" draining and out of rotation", func() bool {
			state, _, in, ok := setReplica(t, p.Admin, victim)
			return ok && state == "draining" && !in
		})
		p.WaitRotation(t, 2, 15*time.Second)
	}
	t.Logf("drain on A: out of rotation on A and B after %s", time.Since(start))
	poll.Until(t, 10*time.Second, "B to name the operator drain", func() bool {
		_, reason, _, _ := setReplica(t, b.Admin, victim)
		return reason == "state draining (operator drain)"
	})

	during := c.Owners(t, b.Addr, keys, 8)
	moved := 0
	for _, k := range keys {
		switch {
		case during[k] == victim:
			t.Fatalf("key %s went through B to the drained %s", k, victim)
		case before[k] == victim:
			moved++
		case during[k] != before[k]:
			t.Fatalf("key %s of %s moved to %s during the drain of %s", k, before[k], during[k], victim)
		}
	}
	t.Logf("%d keys of %s went through B to their stand-ins; the others stayed", moved, victim)

	// It stays drained (its probes keep passing): watched for a second.
	for end := time.Now().Add(time.Second); time.Now().Before(end); <-time.After(100 * time.Millisecond) {
		if state, _, in, _ := setReplica(t, b.Admin, victim); state != "draining" || in {
			t.Fatalf("B shows %s %s in rotation %v while it should stay drained", victim, state, in)
		}
	}

	code, body = adminPost(t, a.Admin, path+"undrain", "s3cret")
	if code != 202 || body["scope"] != "gossip" || body["action"] != "undrain" {
		t.Fatalf("undrain on A: %d %v", code, body)
	}
	for _, p := range []*ProxyProc{a, b} {
		poll.Until(t, 15*time.Second, p.Name+" to see "+victim+" ready and in rotation", func() bool {
			state, _, in, ok := setReplica(t, p.Admin, victim)
			return ok && state == "ready" && in
		})
		p.WaitRotation(t, 3, 15*time.Second)
	}
	after := c.Owners(t, b.Addr, keys, 8)
	for _, k := range keys {
		if after[k] != before[k] {
			t.Fatalf("key %s: %s before the drain, %s after the undrain", k, before[k], after[k])
		}
	}
	t.Logf("undrain: every key back on its owner through B")
}

// An operator drain outlives the replica's agent: the agent crashes and
// comes back under the same name, and the proxies drain the new
// incarnation again — it gets no request — until an undrain.
func TestOperatorDrainSurvivesAgentRestart(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	a, reps := cluster(t, 3)
	b := StartProxy(t, "proxy-b", []string{a.Gossip}, 3)
	b.WaitRotation(t, 3, 30*time.Second)
	victim := reps[2]
	path := fmt.Sprintf("/v1/replica_sets/orders/replicas/%s/", victim.Name)
	if code, body := adminPost(t, a.Admin, path+"drain", "s3cret"); code != 202 {
		t.Fatalf("drain: %d %v", code, body)
	}
	for _, p := range []*ProxyProc{a, b} {
		p.WaitRotation(t, 2, 15*time.Second)
	}

	victim.Agent.Kill(t) // a crash: no graceful leave
	served := Stats(t, victim.Addr)
	victim.Agent = StartAgent(t, victim.Name, victim.Addr, []string{a.Gossip})
	// The new incarnation is drained again on both proxies; watch that it
	// never enters rotation meanwhile.
	deadline := time.Now().Add(20 * time.Second)
	for _, p := range []*ProxyProc{a, b} {
		for {
			state, _, in, ok := setReplica(t, p.Admin, victim.Name)
			if in {
				t.Fatalf("%s put the restarted %s in rotation during its operator drain", p.Name, victim.Name)
			}
			if ok && state == "draining" && len(victim.Agent.Logs("admin drain command")) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s not drained again within 20s (state %q)", p.Name, victim.Name, state)
			}
			<-time.After(20 * time.Millisecond)
		}
	}
	if n := len(a.Logs("replica restarted during an operator drain: draining it again")) + len(b.Logs("replica restarted during an operator drain: draining it again")); n == 0 {
		t.Error("no proxy logged the drain it sent again")
	}
	c := NewClient()
	c.Owners(t, b.Addr, Keys(500), 4)
	after := Stats(t, victim.Addr)
	for k, n := range after {
		if n != served[k] {
			t.Fatalf("key %s reached the drained %s after its restart", k, victim.Name)
		}
	}
	// Undrain ends it for good.
	if code, body := adminPost(t, b.Admin, path+"undrain", "s3cret"); code != 202 {
		t.Fatalf("undrain: %d %v", code, body)
	}
	for _, p := range []*ProxyProc{a, b} {
		p.WaitRotation(t, 3, 15*time.Second)
	}
}

// Scale-in with drain.remove: the leaving agent waits until every proxy
// sees it stopped, so both proxies drop it from the ring at once (not
// after forget_after) and agree on every key again.
func TestScaleInRemoveReachesEveryProxy(t *testing.T) {
	skipShort(t)
	a, _ := cluster(t, 3)
	b := StartProxy(t, "proxy-b", []string{a.Gossip}, 3)
	b.WaitRotation(t, 3, 30*time.Second)
	t.Setenv("KEYWAY_AGENT_DRAIN_REMOVE", "true") // inherited by the next agent only
	extra := StartReplica(t, "orders-3", []string{a.Gossip})
	ring := func(p *ProxyProc) float64 {
		return Metric(p.Admin, "keyway_ring_replicas", map[string]string{"set": "orders"})
	}
	for _, p := range []*ProxyProc{a, b} {
		poll.Until(t, 20*time.Second, p.Name+" to put orders-3 on the ring", func() bool { return ring(p) == 4 })
	}
	start := time.Now()
	extra.Agent.Term(t, 20*time.Second)
	for _, p := range []*ProxyProc{a, b} {
		poll.Until(t, 10*time.Second, p.Name+" to drop orders-3 from the ring", func() bool { return ring(p) == 3 })
	}
	t.Logf("SIGTERM to both proxies dropping orders-3 from the ring: %s (forget_after is 1m)", time.Since(start))
	if len(extra.Agent.Logs("every proxy sees the replica stopped")) != 1 {
		t.Error("the leaving agent did not see every proxy confirm its stopped state")
	}
	keys := Keys(2000)
	c := NewClient()
	oa, ob := c.Owners(t, a.Addr, keys, 4), c.Owners(t, b.Addr, keys, 4)
	for _, k := range keys {
		if oa[k] != ob[k] || oa[k] == "orders-3" {
			t.Fatalf("key %s: proxy A → %s, proxy B → %s after the scale-in", k, oa[k], ob[k])
		}
	}
}
