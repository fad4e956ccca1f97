package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/fleetauth"
	"keyway/internal/poll"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// The adversary suite: members inside the gossip cluster try every attack
// on the fleet's trust (docs/membership.md, "Threat model") against real
// proxies and agents. Two rogues, built from keyway's own membership
// package as an attacker would:
//
//   - "outsider" holds the gossip key only (on loopback the tests run
//     without one: it reaches the gossip port) and claims role proxy;
//   - "neighbour" is a compromised host of the set users: it holds users'
//     agent key, and claims orders-1 at its own address.
//
// Both write run-time records (stop users with the highest version, create
// users at the rogue's address), command agents (drain orders-1, stop
// users, restart orders-1, repair), send fleet views voting orders-1 out,
// and claim orders-1. Every attempt is refused and counted; routing,
// run-time state and agents stay as they were; the operators' own
// commands still work through both proxies; an old genuine command,
// replayed, is refused; and a member holding the proxy key can write no
// version an operator's next write does not beat.
func TestAdversaries(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret") // inherited by the proxies
	usersSet := `  - name: users
    replicas: 1
    match: {path_prefix: /users/}
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 5s, idle: 30s}
`
	a := StartProxyWith(t, "proxy-a", nil, 3, usersSet)
	var reps []*ReplicaProc
	for i := range 3 {
		reps = append(reps, StartReplica(t, fmt.Sprintf("orders-%d", i), []string{a.Gossip}))
	}
	usersProc, usersAddr := StartReplicaProcess(t, "users-0")
	usersAgent := StartAgentOf(t, "users", "users-0", usersAddr, []string{a.Gossip})
	b := StartProxyWith(t, "proxy-b", []string{a.Gossip}, 3, usersSet)
	_ = usersProc
	proxies := []*ProxyProc{a, b}
	for _, p := range proxies {
		p.WaitRotation(t, 3, 30*time.Second)
		poll.Until(t, 30*time.Second, p.Name+": users-0 in rotation", func() bool { return rotationOf(p.Admin, "users") == 1 })
	}
	orders1 := reps[1]

	// Where a hijack would send traffic: every request reaching it fails
	// the test.
	var hijacked atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hijacked.Add(1)
		fmt.Fprint(w, `{"replica":"evil"}`)
	}))
	t.Cleanup(evil.Close)
	evilAddr := strings.TrimPrefix(evil.URL, "http://")

	// What must not change: owners of keys through both proxies, the
	// run-time state, the agents.
	keys := Keys(300)
	c := NewClient()
	owners := c.Owners(t, a.Addr, keys, 4)
	before := map[string]string{}
	for _, p := range proxies {
		before[p.Name] = runtimeRecords(t, p.Admin)
	}

	creds := Credentials
	neighbourCreds := fleetauth.Credentials{Proxy: creds.Public().Proxy,
		Agents: map[string]fleetauth.KeyList{"orders": creds.ForAgent("users").Agents["users"]}}
	outsider := startRogue(t, "outsider", membership.Meta{Role: membership.RoleProxy, ID: "proxy-evil", Addr: evilAddr}, nil, a.Gossip)
	neighbour := startRogue(t, "neighbour", membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "orders-1",
		Addr: evilAddr, State: balancer.StateReady}, &neighbourCreds, a.Gossip)

	targets := fleetNodes(t, outsider, orders1.Addr, usersAddr)
	rejected := func(addr, reason string) float64 {
		return Metric(addr, "keyway_gossip_rejected_total", map[string]string{"reason": reason})
	}
	agentHTTP := map[string]string{
		"orders-1": orders1.Agent.WaitLine(t, logField("agent started", "http"), 10*time.Second)[1],
		"users-0":  usersAgent.WaitLine(t, logField("agent started", "http"), 10*time.Second)[1],
	}
	type rogueReason struct {
		node   *rogueNode
		reason string
	}
	rogues := []rogueReason{{outsider, membership.RejectUnsigned}, {neighbour, membership.RejectWrongKey}}
	for _, r := range rogues {
		base := map[string]float64{}
		for _, p := range proxies {
			base[p.Admin] = rejected(p.Admin, r.reason)
		}
		for _, h := range agentHTTP {
			base[h] = rejected(h, r.reason)
		}
		sent := attack(t, r.node, targets, evilAddr)
		for _, p := range proxies {
			poll.Until(t, 15*time.Second, fmt.Sprintf("%s to refuse and count %s's %d messages (%s)", p.Name, r.node.Name(), sent.proxy, r.reason), func() bool {
				return rejected(p.Admin, r.reason)-base[p.Admin] >= float64(sent.proxy)
			})
		}
		for name, h := range agentHTTP {
			poll.Until(t, 15*time.Second, fmt.Sprintf("%s's agent to refuse and count %s's %d commands (%s)", name, r.node.Name(), sent.agent[name], r.reason), func() bool {
				return rejected(h, r.reason)-base[h] >= float64(sent.agent[name])
			})
		}
	}
	// The claims: refused on both proxies, each rogue audited once per
	// reason.
	for _, p := range proxies {
		poll.Until(t, 15*time.Second, p.Name+" to refuse both rogues' claims", func() bool {
			ms := members(t, p.Admin)
			return ms[outsider.Name()] == membership.RejectUnsigned && ms[neighbour.Name()] == membership.RejectWrongKey
		})
		audited := refusedEvents(t, p.Admin)
		for _, r := range rogues {
			if n := audited[r.node.Name()+" "+r.reason]; n != 1 {
				t.Errorf("%s: %d gossip_refused events for %s (%s) within the minute, want 1", p.Name, n, r.node.Name(), r.reason)
			}
		}
	}

	// Nothing changed.
	for _, p := range proxies {
		if got := runtimeRecords(t, p.Admin); got != before[p.Name] {
			t.Errorf("%s: the run-time state changed under attack:\n before %s\n after  %s", p.Name, before[p.Name], got)
		}
		if n := rotationOf(p.Admin, "users"); n != 1 {
			t.Errorf("%s: users has %v replicas in rotation, want 1", p.Name, n)
		}
		if n := p.InRotation(); n != 3 {
			t.Errorf("%s: orders has %v replicas in rotation, want 3", p.Name, n)
		}
		for k, owner := range c.Owners(t, p.Addr, keys, 4) {
			if owner != owners[k] {
				t.Fatalf("%s: key %s went to %s, was %s", p.Name, k, owner, owners[k])
			}
		}
		if code := sendPath(t, p.Addr, "/users/x", "u-1"); code != 200 {
			t.Errorf("%s: /users/ answered %d", p.Name, code)
		}
	}
	if n := hijacked.Load(); n != 0 {
		t.Fatalf("%d requests reached the rogue's address", n)
	}
	if n := len(orders1.Agent.Logs("admin drain command")) + len(orders1.Agent.Logs("restart command")); n != 0 {
		t.Fatalf("orders-1's agent took %d rogue commands", n)
	}
	if n := len(usersAgent.Logs("set command")); n != 0 {
		t.Fatalf("users-0's agent took %d rogue set commands", n)
	}

	// The operators' commands still work, through either proxy: a drain
	// through one and its undrain through the other, a stop through one
	// and its start through the other.
	drain := "/v1/replica_sets/orders/replicas/orders-1/"
	operate := func(step string, first, second *ProxyProc) {
		t.Helper()
		if code, body := adminPost(t, first.Admin, drain+"drain", "s3cret"); code != 202 {
			t.Fatalf("%s: drain through %s: %d %v", step, first.Name, code, body)
		}
		for _, p := range proxies {
			p.WaitRotation(t, 2, 15*time.Second)
		}
		if code, body := adminPost(t, second.Admin, drain+"undrain", "s3cret"); code != 202 {
			t.Fatalf("%s: undrain through %s: %d %v", step, second.Name, code, body)
		}
		for _, p := range proxies {
			p.WaitRotation(t, 3, 15*time.Second)
		}
		patchSet(t, second.Admin, "users", `{"stop":true}`)
		for _, p := range proxies {
			poll.Until(t, 15*time.Second, step+": "+p.Name+": users stopped", func() bool { return rotationOf(p.Admin, "users") == 0 })
		}
		patchSet(t, first.Admin, "users", `{"stop":false}`)
		for _, p := range proxies {
			poll.Until(t, 30*time.Second, step+": "+p.Name+": users started", func() bool { return rotationOf(p.Admin, "users") == 1 })
		}
	}
	operate("after the attacks", a, b)

	// A genuine command, signed with the proxy key, as an eavesdropper
	// would have captured it: taken once (it is genuine), refused when
	// replayed, and refused when old.
	proxyKeys, err := creds.ForProxy().Keyring(fleetauth.As{Role: fleetauth.RoleProxy})
	if err != nil {
		t.Fatal(err)
	}
	cmd := []byte(`{"kind":"admin_drain","set":"orders","replica":"orders-1","drain":true,"by":"captured"}`)
	captured, _ := proxyKeys.SignMessage(outsider.Name(), targets.agents["orders-1"], time.Now().UnixMicro(), cmd)
	if err := outsider.SendReliable(targets.agents["orders-1"], captured); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.WaitRotation(t, 2, 15*time.Second)
	}
	if code, body := adminPost(t, b.Admin, drain+"undrain", "s3cret"); code != 202 {
		t.Fatalf("undrain through B: %d %v", code, body)
	}
	for _, p := range proxies {
		p.WaitRotation(t, 3, 15*time.Second)
	}
	h := agentHTTP["orders-1"]
	replays, stale := rejected(h, membership.RejectReplay), rejected(h, membership.RejectStale)
	if err := outsider.SendReliable(targets.agents["orders-1"], captured); err != nil {
		t.Fatal(err)
	}
	old, _ := proxyKeys.SignMessage(outsider.Name(), targets.agents["orders-1"], time.Now().Add(-2*membership.Window).UnixMicro(), cmd)
	if err := outsider.SendReliable(targets.agents["orders-1"], old); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the replayed and the old command to be refused", func() bool {
		return rejected(h, membership.RejectReplay) == replays+1 && rejected(h, membership.RejectStale) == stale+1
	})
	for _, p := range proxies {
		if n := p.InRotation(); n != 3 {
			t.Fatalf("%s: %v orders replicas in rotation after the replay, want 3", p.Name, n)
		}
	}

	// A member with the proxy key can do what an operator can, and no
	// more persists: a record versioned far ahead (the highest version, or
	// an hour ahead) is refused by every proxy, and the operators' next
	// write wins as ever.
	future := func(version uint64) []byte {
		return []byte(fmt.Sprintf(`{"kind":"runtime_records","node":%q,"digest":"z","records":[{"set":"users","version":%d,"origin":"zzz","stopped":true,"action":"stop","by":"rogue","at":%q}]}`,
			outsider.Name(), version, time.Now().UTC().Format(time.RFC3339Nano)))
	}
	hourAhead := uint64(time.Now().Add(time.Hour).UnixMilli()) << 16
	refusedFuture := func(p *ProxyProc) float64 {
		return Metric(p.Admin, "keyway_runtime_refused_total", map[string]string{"reason": "future"})
	}
	for _, p := range proxies {
		node := ""
		for _, m := range outsider.Members() {
			if m.Meta.Addr == p.Admin && m.Meta.Role == membership.RoleProxy {
				node = m.Node
			}
		}
		base := refusedFuture(p)
		for _, v := range []uint64{1<<64 - 1, hourAhead} {
			signed, _ := proxyKeys.SignMessage(outsider.Name(), node, time.Now().UnixMicro(), future(v))
			if err := outsider.SendReliable(node, signed); err != nil {
				t.Fatal(err)
			}
		}
		poll.Until(t, 15*time.Second, p.Name+" to refuse both records from the future", func() bool { return refusedFuture(p)-base >= 2 })
	}
	for _, p := range proxies {
		if got := runtimeRecords(t, p.Admin); strings.Contains(got, "rogue") {
			t.Fatalf("%s: a record from the future persisted: %s", p.Name, got)
		}
	}
	operate("after the forged records", b, a)

	// The rogues leave; the genuine orders-1 was never locked out.
	outsider.Leave()
	neighbour.Leave()
	for _, p := range proxies {
		for k, owner := range c.Owners(t, p.Addr, keys, 4) {
			if owner != owners[k] {
				t.Fatalf("%s: after the rogues left, key %s went to %s, was %s", p.Name, k, owner, owners[k])
			}
		}
	}
}

// rogueNode is a gossip member the test runs in-process.
type rogueNode struct {
	*membership.Node
	leave func()
}

func (r *rogueNode) Leave() { r.leave() }

// startRogue runs a gossip member with meta, signing with creds (nil:
// nothing), joined to join, until the test ends.
func startRogue(t *testing.T, name string, meta membership.Meta, creds *fleetauth.Credentials, join string) *rogueNode {
	t.Helper()
	cfg := membership.DefaultConfig()
	cfg.BindAddr, cfg.BindPort, cfg.Profile = "127.0.0.1", 0, "fast"
	cfg.Join = []string{join}
	n, err := membership.New(cfg, meta, membership.Options{Logger: zap.NewNop(), Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-n.Joined():
	case err := <-done:
		t.Fatalf("rogue %s: %v", name, err)
	case <-time.After(15 * time.Second):
		t.Fatalf("rogue %s did not join", name)
	}
	leave := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(leave)
	return &rogueNode{Node: n, leave: leave}
}

// fleet is the gossip node names of the proxies and of the agents of
// orders-1 and users-0 (at their genuine addresses).
type fleetTargets struct {
	proxies []string
	agents  map[string]string
}

func fleetNodes(t *testing.T, r *rogueNode, orders1, users0 string) fleetTargets {
	t.Helper()
	var f fleetTargets
	poll.Until(t, 15*time.Second, "the rogue to see the fleet", func() bool {
		f = fleetTargets{agents: map[string]string{}}
		for _, m := range r.Members() {
			if m.Status != membership.StatusAlive || m.Self {
				continue
			}
			switch {
			case m.Meta.Role == membership.RoleProxy:
				f.proxies = append(f.proxies, m.Node)
			case m.Meta.Addr == orders1:
				f.agents["orders-1"] = m.Node
			case m.Meta.Addr == users0:
				f.agents["users-0"] = m.Node
			}
		}
		return len(f.proxies) == 2 && len(f.agents) == 2
	})
	return f
}

type sentCounts struct {
	proxy int            // to each proxy
	agent map[string]int // by replica
}

// attack sends every forged message of the suite from r: to each proxy,
// run-time records (users stopped at the highest version; users created
// at the rogue's address), a fleet view voting orders-1 out, an undrain
// and a repair; to the agents, a drain, a restart, a repair of orders-1
// and a stop of users. Reliable sends: every message arrives.
func attack(t *testing.T, r *rogueNode, f fleetTargets, evilAddr string) sentCounts {
	t.Helper()
	at := time.Now().UTC().Format(time.RFC3339Nano)
	toProxies := []string{
		fmt.Sprintf(`{"kind":"runtime_records","node":%q,"digest":"x","records":[{"set":"users","version":18446744073709551615,"origin":"zzz","stopped":true,"action":"stop","by":"rogue","at":%q}]}`, r.Name(), at),
		fmt.Sprintf(`{"kind":"runtime_records","node":%q,"digest":"y","records":[{"set":"users","version":18446744073709551614,"origin":"zzz","spec":{"name":"users","replicas":1,"match":{"path_prefix":"/users/"},"key":[{"header":"X-Key"}],"static":[{"name":"users-0","addr":%q}]},"action":"create","by":"rogue","at":%q}]}`, r.Name(), evilAddr, at),
		fmt.Sprintf(`{"kind":"proxy_state","node":%q,"id":"proxy-evil","boot":1,"seq":1,"sets":[{"set":"orders","digest":"x","votes":[{"replica":"orders-1","reason":"5xx","age_ms":60000}]}]}`, r.Name()),
		`{"kind":"admin_drain","set":"orders","replica":"orders-1","drain":false,"by":"rogue"}`,
		`{"kind":"repair","set":"orders","by":"rogue"}`,
	}
	toAgents := map[string][]string{
		"orders-1": {
			`{"kind":"admin_drain","set":"orders","replica":"orders-1","drain":true,"by":"rogue"}`,
			`{"kind":"restart_replica","set":"orders","replica":"orders-1","by":"rogue"}`,
			`{"kind":"repair","set":"orders","by":"rogue"}`,
		},
		"users-0": {`{"kind":"set_stop","set":"users","stop":true,"version":18446744073709551615,"by":"rogue"}`},
	}
	out := sentCounts{proxy: len(toProxies), agent: map[string]int{}}
	for _, p := range f.proxies {
		for _, m := range toProxies {
			if err := r.SendReliable(p, []byte(m)); err != nil {
				t.Fatalf("send to %s: %v", p, err)
			}
		}
	}
	for rep, msgs := range toAgents {
		for _, m := range msgs {
			if err := r.SendReliable(f.agents[rep], []byte(m)); err != nil {
				t.Fatalf("send to %s: %v", rep, err)
			}
		}
		out.agent[rep] = len(msgs)
	}
	return out
}

// runtimeRecords is the proxy's run-time records, as JSON.
func runtimeRecords(t *testing.T, adminAddr string) string {
	t.Helper()
	var rt struct {
		Records json.RawMessage `json:"records"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/runtime", &rt)
	return string(rt.Records)
}

// members maps the proxy's members' node names to why their claim is
// refused ("" when believed).
func members(t *testing.T, adminAddr string) map[string]string {
	t.Helper()
	var ms struct {
		Members []struct {
			Node    string `json:"node"`
			Refused string `json:"refused"`
		} `json:"members"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/members", &ms)
	out := map[string]string{}
	for _, m := range ms.Members {
		out[m.Node] = m.Refused
	}
	return out
}

// refusedEvents counts the proxy's gossip_refused audit events by
// "member reason".
func refusedEvents(t *testing.T, adminAddr string) map[string]int {
	t.Helper()
	var evs struct {
		Events []map[string]any `json:"events"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/events?kind=gossip_refused&limit=1000", &evs)
	out := map[string]int{}
	for _, e := range evs.Events {
		out[fmt.Sprint(e["member"])+" "+fmt.Sprint(e["reason"])]++
	}
	return out
}

// sendPath sends a keyed request for path through a proxy and returns
// the status.
func sendPath(t *testing.T, proxyAddr, path, key string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+proxyAddr+path, strings.NewReader("x"))
	req.Header.Set("X-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// patchSet PATCHes a set through a proxy's admin API with the test token.
func patchSet(t *testing.T, adminAddr, set, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPatch, "http://"+adminAddr+"/v1/replica_sets/"+set, bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("PATCH %s %s: %d %s", set, body, resp.StatusCode, b)
	}
}
