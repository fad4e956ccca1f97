package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/membership"
	"keyway/runstate"
)

// gossipProxy is a running proxy node with gossip on and the fleet ID id,
// joined to join (none: it starts the cluster), serving the static set
// orders. stop ends it (also at the end of the test).
type gossipProxy struct {
	*ProxyNode
	stop func()
}

func startGossipProxy(t *testing.T, id string, join ...string) *gossipProxy {
	t.Helper()
	seeds := "[]"
	if len(join) > 0 {
		seeds = `["` + strings.Join(join, `", "`) + `"]`
	}
	cfg, err := config.LoadBytes("test.yaml", []byte(fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: ""}
fleet: {id: %q, interval: 100ms}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast, join: %s}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:1"}]
`, id, seeds)), config.WithEnv(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewProxy(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-n.GossipStarted():
	case err := <-done:
		t.Fatalf("proxy %s stopped at start: %v", id, err)
	}
	p := &gossipProxy{ProxyNode: n}
	stopped := false
	p.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("proxy %s: Run: %v", id, err)
			}
		}
	}
	t.Cleanup(p.stop)
	return p
}

// sees reports whether p sees exactly these alive gossip nodes of proxies.
func (p *gossipProxy) sees(nodes ...*gossipProxy) bool {
	var got, want []string
	for _, m := range p.node.Members() {
		if m.Status == membership.StatusAlive && m.Meta.Role == membership.RoleProxy {
			got = append(got, m.Node)
		}
	}
	for _, n := range nodes {
		want = append(want, n.node.Name())
	}
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(got, want)
}

func hasStep(st admin.RestartStatus, step string) bool {
	return slices.ContainsFunc(st.Steps, func(s admin.RestartStep) bool { return s.Step == step })
}

// A rolling restart belongs to its owner's fleet ID. While the owner
// upgrades its binary (an old and a new process, one ID) nothing is
// handed over: the other proxy, lowest ID in the fleet, does not take it
// over, and the new process does not run it while the old one is alive.
// Once the old process is gone, the new one resumes it ("resumed", not
// "takeover"), and the owner stays the ID. The fleet view of the other
// proxy shows one peer with two processes, agreeing; run-time records
// name the proxy that wrote them by its ID.
func TestRestartOwnedByIDResumedAfterAnUpgrade(t *testing.T) {
	other := startGossipProxy(t, "edge-a")
	old := startGossipProxy(t, "edge-b", other.GossipAddr())
	poll.Until(t, 10*time.Second, "two proxies in gossip", func() bool {
		return other.sees(other, old) && old.sees(other, old)
	})

	// edge-b's old process runs a restart of orders (claimed here, as
	// StartRestart does; its replica is done but the restart not yet
	// finished).
	if !old.restarts.claim("orders") {
		t.Fatal("orders' restart already claimed")
	}
	if _, err := old.updateRestart(nil, "orders", "ops", func(st *admin.RestartStatus, _ bool) error {
		*st = admin.RestartStatus{Set: "orders", State: "running", Owner: old.node.ID(), OwnerNode: old.node.Name(), By: "ops",
			Replicas: []string{"orders-0"}, Current: "orders-0", StepTimeout: "1m", Started: time.Now(),
			Steps: []admin.RestartStep{{Time: time.Now(), Replica: "orders-0", Step: "ready"}}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st, _ := old.restartStatus("orders"); st.Owner != "edge-b" {
		t.Fatalf("the restart's owner is %q, want the fleet ID edge-b", st.Owner)
	}

	upgraded := startGossipProxy(t, "edge-b", other.GossipAddr())
	all := []*gossipProxy{other, old, upgraded}
	poll.Until(t, 10*time.Second, "three proxy processes in gossip, the restart record on each", func() bool {
		for _, p := range all {
			if st, ok := p.restartStatus("orders"); !p.sees(all...) || !ok || st.State != "running" {
				return false
			}
		}
		return true
	})
	if got := other.aliveProxies(); !slices.Equal(got, []string{"edge-a", "edge-b"}) {
		t.Fatalf("alive proxies %v, want the IDs [edge-a edge-b]", got)
	}
	// Every check of every process, while both processes of edge-b live:
	// nothing changes hands.
	ctx := context.Background()
	for range 3 {
		for _, p := range all {
			p.checkRestarts(ctx)
		}
	}
	for _, p := range all {
		st, _ := p.restartStatus("orders")
		if st.Owner != "edge-b" || st.OwnerNode != old.node.Name() || hasStep(st, "takeover") || hasStep(st, "resumed") {
			t.Fatalf("during the upgrade, %s shows the restart %+v: it changed hands", p.node.Name(), st)
		}
	}
	// The other proxy follows one peer, edge-b, with both processes.
	poll.Until(t, 10*time.Second, "edge-a's fleet view: one peer edge-b, two processes, agreeing", func() bool {
		f := other.view.Fleet()
		return f.Self == "edge-a" && f.Agree && len(f.Proxies) == 1 && f.Proxies[0].ID == "edge-b" &&
			slices.Equal(f.Proxies[0].Nodes, sortedNodes(old, upgraded)) && len(f.Sets) == 1 && len(f.Sets[0].Peers) == 1 && f.Sets[0].Peers[0].ID == "edge-b"
	})

	// The old process drains and leaves: the new one resumes the restart.
	old.stop()
	poll.Until(t, 10*time.Second, "the new process resumes the restart and finishes it", func() bool {
		upgraded.checkRestarts(ctx)
		st, _ := upgraded.restartStatus("orders")
		return st.State == "done"
	})
	poll.Until(t, 10*time.Second, "edge-a shows the restart done", func() bool {
		st, _ := other.restartStatus("orders")
		return st.State == "done"
	})
	for _, p := range []*gossipProxy{other, upgraded} {
		st, _ := p.restartStatus("orders")
		if st.Owner != "edge-b" || st.OwnerNode != upgraded.node.Name() || !hasStep(st, "resumed") || hasStep(st, "takeover") {
			t.Fatalf("%s shows the restart %+v; want it resumed by edge-b's new process %s, not taken over", p.node.Name(), st, upgraded.node.Name())
		}
	}

	// Run-time records name the proxy by its ID, whichever process wrote
	// them.
	ch, err := setAdmin{upgraded.ProxyNode}.PatchSet("orders", admin.SetPatch{Replicas: new(2)}, admin.Write{Ctx: context.Background(), Who: admin.Actor{Name: "ops"}})
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := upgraded.rt.Get(runstate.KindSet, "orders"); ch.Via != "edge-b" || rec.Origin != "edge-b" || rec.Via != "edge-b" {
		t.Fatalf("a change through edge-b's new process: via %q, record %+v; want via and origin edge-b", ch.Via, rec)
	}
}

func sortedNodes(ps ...*gossipProxy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.node.Name())
	}
	slices.Sort(out)
	return out
}
