package membership

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
	"keyway/fleetauth"
)

// authNode builds (does not run) a node holding creds, on the clock now.
func authNode(t *testing.T, meta Meta, creds fleetauth.Credentials, now *time.Time, opts ...func(*Config, *Options)) *Node {
	t.Helper()
	cfg := DefaultConfig()
	cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
	o := Options{Credentials: &creds, Now: func() time.Time { return *now }}
	for _, f := range opts {
		f(&cfg, &o)
	}
	n, err := New(cfg, meta, o)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func rejectedCount(n *Node, reason string) float64 {
	return testutil.ToFloat64(n.metrics.rejected.WithLabelValues(reason))
}

// The message decoder: a command reaches its handler only signed with the
// key of the role the handler accepts, fresh, once.
func TestDispatchVerifiesSignatures(t *testing.T) {
	creds := fleetauth.Generate([]string{"orders", "users"})
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	proxyNow, rogueNow := now, now
	var reports []Rejection
	var mu sync.Mutex
	agent := authNode(t, Meta{Role: RoleReplica, Set: "orders", Replica: "orders-1", Addr: "127.0.0.1:1"}, creds.ForAgent("orders"), &now,
		func(_ *Config, o *Options) {
			o.OnReject = func(r Rejection) { mu.Lock(); reports = append(reports, r); mu.Unlock() }
		})
	proxy := authNode(t, Meta{Role: RoleProxy, ID: "p1"}, creds.ForProxy(), &proxyNow)
	rogue := authNode(t, Meta{Role: RoleReplica, Set: "users", Replica: "users-0", Addr: "127.0.0.1:2"}, creds.ForAgent("users"), &rogueNow)
	var got []Message
	agent.Handle(SetStopKind, RoleProxy, func(m Message) { got = append(got, m) })
	agent.Handle(ProcessEventKind, RoleReplica, func(m Message) { got = append(got, m) })
	cmd := SetStop{Set: "orders", Stop: true, Version: 7, By: "p1"}.Encode()

	// Signed by a proxy: taken, once.
	sealed := proxy.seal(agent.Name(), cmd)
	agent.dispatch(proxy.Name(), sealed)
	if len(got) != 1 || got[0].Signer.Role != fleetauth.RoleProxy || string(got[0].Body) != string(cmd) || got[0].Kind != SetStopKind {
		t.Fatalf("signed command: %+v", got)
	}
	agent.dispatch(proxy.Name(), sealed)
	if len(got) != 1 || rejectedCount(agent, RejectReplay) != 1 {
		t.Fatalf("a replay was taken (%d messages, %v replays)", len(got), rejectedCount(agent, RejectReplay))
	}
	cases := []struct {
		name, from, reason string
		msg                []byte
	}{
		{"unsigned", proxy.Name(), RejectUnsigned, cmd},
		{"another set's agent key", rogue.Name(), RejectWrongKey, rogue.seal(agent.Name(), cmd)},
		{"claiming to be the proxy", proxy.Name(), RejectBadSignature, rogue.seal(agent.Name(), cmd)},
		{"sent to another member", proxy.Name(), RejectBadSignature, proxy.seal("orders-2.x", cmd)},
		{"altered", proxy.Name(), RejectBadSignature, []byte(strings.Replace(string(proxy.seal(agent.Name(), cmd)), `"stop":true`, `"stop":false`, 1))},
		{"an unknown key", proxy.Name(), RejectUnknownKey, func() []byte {
			other := authNode(t, Meta{Role: RoleProxy}, fleetauth.Generate(nil), &proxyNow)
			other.name.Store(nameOf(proxy.Name()))
			return other.seal(agent.Name(), cmd)
		}()},
	}
	for _, tc := range cases {
		before := rejectedCount(agent, tc.reason)
		agent.dispatch(tc.from, tc.msg)
		if len(got) != 1 || rejectedCount(agent, tc.reason) != before+1 {
			t.Errorf("%s: taken or not counted as %s (%d messages)", tc.name, tc.reason, len(got))
		}
	}
	// The stamp window, both ways. (A node's stamps never go back: the
	// test turns its clock back as a restarted process's would be.)
	proxyNow = now.Add(-Window - time.Second)
	proxy.lastStamp.Store(0)
	agent.dispatch(proxy.Name(), proxy.seal(agent.Name(), cmd))
	proxyNow = now.Add(Window + time.Second)
	agent.dispatch(proxy.Name(), proxy.seal(agent.Name(), cmd))
	if len(got) != 1 || rejectedCount(agent, RejectStale) != 1 || rejectedCount(agent, RejectFuture) != 1 {
		t.Fatalf("stamps outside the window: %d messages, stale %v, future %v", len(got), rejectedCount(agent, RejectStale), rejectedCount(agent, RejectFuture))
	}
	proxyNow = now.Add(Window - time.Second) // a clock ahead, within the bound
	proxy.lastStamp.Store(0)
	agent.dispatch(proxy.Name(), proxy.seal(agent.Name(), cmd))
	if len(got) != 2 {
		t.Fatal("a stamp within the window was refused")
	}
	// An agent key's message goes to an agent-role handler, with its set.
	agent.dispatch(rogue.Name(), rogue.seal(agent.Name(), ProcessEvent{Set: "users"}.Encode()))
	if len(got) != 3 || got[2].Signer.Role != fleetauth.RoleAgent || got[2].Signer.Set != "users" {
		t.Fatalf("agent-signed message: %+v", got[len(got)-1])
	}
	// ...but not to a proxy-role one.
	before := rejectedCount(agent, RejectWrongKey)
	agent.dispatch(rogue.Name(), rogue.seal(agent.Name(), cmd))
	if len(got) != 3 || rejectedCount(agent, RejectWrongKey) != before+1 {
		t.Fatal("an agent key commanded an agent")
	}
	// A kind without a handler is dropped and counted.
	agent.dispatch(proxy.Name(), proxy.seal(agent.Name(), []byte(`{"kind":"nope"}`)))
	if rejectedCount(agent, RejectUnknownKind) != 1 {
		t.Fatal("unknown kind not counted")
	}
	// Reports: once per sender and reason per minute, with the count.
	mu.Lock()
	n := len(reports)
	mu.Unlock()
	agent.dispatch(proxy.Name(), cmd) // unsigned again, within the minute
	mu.Lock()
	if len(reports) != n {
		t.Fatalf("a second unsigned message from one sender within a minute was reported: %+v", reports[n:])
	}
	mu.Unlock()
	now = now.Add(time.Minute)
	proxyNow = now
	agent.dispatch(proxy.Name(), cmd)
	mu.Lock()
	defer mu.Unlock()
	last := reports[len(reports)-1]
	if len(reports) != n+1 || last.Reason != RejectUnsigned || last.Count != 2 || last.What != SetStopKind || last.Node != proxy.Name() {
		t.Fatalf("report after a minute: %+v", reports[n:])
	}
}

func nameOf(s string) *string { return &s }

// With signatures optional (a rolling upgrade from a version without
// them), an unsigned message is believed as that version did: from an
// alive member whose metadata says the role. Signed ones are checked.
func TestDispatchSignaturesOptional(t *testing.T) {
	creds := fleetauth.Generate([]string{"orders"})
	now := time.Now()
	agent := authNode(t, Meta{Role: RoleReplica, Set: "orders", Replica: "orders-1"}, creds.ForAgent("orders"), &now,
		func(c *Config, _ *Options) { c.Signatures = SignaturesOptional })
	var got int
	agent.Handle(SetStopKind, RoleProxy, func(Message) { got++ })
	cmd := SetStop{Set: "orders", Stop: true}.Encode()
	agent.mu.Lock()
	agent.members["old-proxy.1"] = &Member{Node: "old-proxy.1", Status: StatusAlive, Meta: Meta{Role: RoleProxy}}
	agent.members["old-agent.1"] = &Member{Node: "old-agent.1", Status: StatusAlive, Meta: Meta{Role: RoleReplica}}
	agent.mu.Unlock()
	agent.dispatch("old-proxy.1", cmd)
	agent.dispatch("old-agent.1", cmd)
	agent.dispatch("nobody.1", cmd)
	if got != 1 || rejectedCount(agent, RejectNotProxy) != 1 || rejectedCount(agent, RejectUnknownKey) != 1 {
		t.Fatalf("optional: %d taken, not_proxy %v, unknown %v", got, rejectedCount(agent, RejectNotProxy), rejectedCount(agent, RejectUnknownKey))
	}
	rogue := authNode(t, Meta{Role: RoleProxy}, fleetauth.Generate(nil), &now)
	rogue.name.Store(nameOf("old-proxy.1"))
	agent.dispatch("old-proxy.1", rogue.seal(agent.Name(), cmd))
	if got != 1 || rejectedCount(agent, RejectUnknownKey) != 2 {
		t.Fatal("optional signatures took a message signed with an unknown key")
	}
}

// Claims: a member's metadata is believed when signed with its role's
// key for its node name.
func TestClaimCheck(t *testing.T) {
	creds := fleetauth.Generate([]string{"orders", "users"})
	now := time.Now()
	proxyMeta := Meta{Role: RoleProxy, ID: "p1", Addr: "127.0.0.1:9901", Fingerprint: "orders:0123abcd"}
	orders1 := Meta{Role: RoleReplica, Set: "orders", Replica: "orders-1", Addr: "127.0.0.1:9001", State: balancer.StateReady}
	proxy := authNode(t, proxyMeta, creds.ForProxy(), &now)
	agent := authNode(t, orders1, creds.ForAgent("orders"), &now)
	usersAgent := authNode(t, Meta{Role: RoleReplica, Set: "users", Replica: "users-0"}, creds.ForAgent("users"), &now)
	optional := authNode(t, proxyMeta, creds.ForProxy(), &now, func(c *Config, _ *Options) { c.Signatures = SignaturesOptional })
	sign := func(n *Node, name string, m Meta) []byte {
		b, err := n.signMeta(name, m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	plain, _ := orders1.Encode()
	for _, tc := range []struct {
		name    string
		checker *Node
		node    string
		raw     []byte
		reason  string
		decoded Meta
	}{
		{"a replica's own claim", proxy, "orders-1.a", sign(agent, "orders-1.a", orders1), "", orders1},
		{"a proxy's claim", agent, "proxy-x.b", sign(proxy, "proxy-x.b", proxyMeta), "", proxyMeta},
		{"a claim copied to another node name", proxy, "orders-1.z", sign(agent, "orders-1.a", orders1), RejectBadSignature, orders1},
		{"another set's key", proxy, "orders-1.r", sign(usersAgent, "orders-1.r", orders1), RejectWrongKey, orders1},
		{"an agent key claiming role proxy", agent, "proxy-y.r", sign(agent, "proxy-y.r", proxyMeta), RejectWrongKey, proxyMeta},
		{"unsigned", proxy, "orders-1.u", plain, RejectUnsigned, orders1},
		{"unsigned, signatures optional", optional, "orders-1.u", plain, "", orders1},
		{"a key nobody issued", proxy, "orders-1.k", sign(authNode(t, orders1, fleetauth.Generate([]string{"orders"}).ForAgent("orders"), &now), "orders-1.k", orders1), RejectUnknownKey, orders1},
	} {
		m, err := DecodeMeta(tc.raw)
		if err != nil || m != tc.decoded {
			t.Errorf("%s: decoded %+v, %v; want %+v", tc.name, m, err, tc.decoded)
			continue
		}
		if reason, detail := tc.checker.claimCheck(tc.node, tc.raw, m); reason != tc.reason {
			t.Errorf("%s: %q (%s), want %q", tc.name, reason, detail, tc.reason)
		}
	}
	// A proxy serving many sets: the fingerprints give way to their
	// digest so that the signed claim fits; the claim still verifies.
	many := proxyMeta
	var fps []string
	for i := 0; i < 40; i++ {
		fps = append(fps, strings.Repeat("s", 8)+string(rune('a'+i%26))+string(rune('a'+i/26))+":0123abcd")
	}
	many.Fingerprint = strings.Join(fps, ",")
	raw := sign(proxy, "proxy-x.b", many)
	m, err := DecodeMeta(raw)
	if err != nil || len(raw) > MetaMaxSize || !strings.HasPrefix(m.Fingerprint, "#") {
		t.Fatalf("large proxy metadata: %d bytes, fingerprint %q, %v", len(raw), m.Fingerprint, err)
	}
	if reason, detail := agent.claimCheck("proxy-x.b", raw, m); reason != "" {
		t.Fatalf("digest claim: %s %s", reason, detail)
	}
}
