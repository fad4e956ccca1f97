package agent_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/membership"
)

// An admin_drain command from a proxy holds the replica draining, for every
// proxy to see, while its probes keep passing; undrain advertises ready
// again. A command for another replica is ignored.
func TestAdminDrainCommand(t *testing.T) {
	slow.Skip(t)
	p := startFakeProxy(t, "p1")
	p.silent.Store(true)
	rep := startReplica(t, "ok")
	a := startAgent(t, testConfig(rep.addr, p.GossipAddr()))
	seen := func(want balancer.State) func() bool {
		return func() bool {
			m, ok := p.member(a.Name())
			return ok && m.Status == membership.StatusAlive && m.Meta.State == want
		}
	}
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", seen(balancer.StateReady))

	other := membership.AdminDrain{Set: "orders", Replica: "orders-9", Drain: true, By: p.Name()}
	if err := p.Send(a.Name(), other.Encode()); err != nil {
		t.Fatal(err)
	}
	drain := membership.AdminDrain{Set: "orders", Replica: "orders-0", Drain: true, By: p.Name()}
	if err := p.Send(a.Name(), drain.Encode()); err != nil {
		t.Fatal(err)
	}
	_ = p.Members()
	poll.Until(t, 10*time.Second, "the proxy to see the agent draining", seen(balancer.StateDraining))
	if !a.Held() {
		t.Fatal("Held() false after a drain command")
	}
	if m, _ := p.member(a.Name()); !m.Meta.Held {
		t.Fatal("the proxy sees the agent draining without the Held flag: a restart would come back undrained")
	}
	probes := rep.requests.Load()
	poll.Until(t, 5*time.Second, "probes to go on while held", func() bool { return rep.requests.Load() >= probes+5 })
	if s := a.State(); s != balancer.StateDraining {
		t.Fatalf("state %s while held with passing probes, want draining", s)
	}
	if code, _ := get(t, a.base+"/readyz"); code != 503 {
		t.Fatalf("/readyz while held: %d, want 503", code)
	}

	undrain := membership.AdminDrain{Set: "orders", Replica: "orders-0", Drain: false, By: p.Name()}
	if err := p.Send(a.Name(), undrain.Encode()); err != nil {
		t.Fatal(err)
	}
	_ = p.Members()
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready again", seen(balancer.StateReady))
	if a.Held() {
		t.Fatal("Held() true after undrain")
	}
	if m, _ := p.member(a.Name()); m.Meta.Held {
		t.Fatal("the Held flag is still advertised after undrain")
	}
	want := []string{"starting>ready", "ready>draining", "draining>ready"}
	got := transitions(a.logs)
	if len(got) != len(want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("transitions %v, want %v", got, want)
		}
	}
}

// A command that arrives while the agent drains on SIGTERM changes no
// state, but its Held flag still reaches the proxies: they remember it
// for the replica's next incarnation.
func TestAdminDrainCommandWhileShuttingDown(t *testing.T) {
	p := startFakeProxy(t, "p1")
	rep := startReplica(t, "ok")
	a := startAgent(t, testConfig(rep.addr, p.GossipAddr()))
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", func() bool {
		m, ok := p.member(a.Name())
		return ok && m.Status == membership.StatusAlive && m.Meta.State == balancer.StateReady
	})
	p.inflight.Store(2) // the drain waits for this proxy
	a.cancel()          // SIGTERM
	poll.Until(t, 10*time.Second, "the proxy to see the agent draining", func() bool {
		m, _ := p.member(a.Name())
		return m.Meta.State == balancer.StateDraining
	})
	for _, drain := range []bool{true, false} {
		cmd := membership.AdminDrain{Set: "orders", Replica: "orders-0", Drain: drain, By: p.Name()}
		if err := p.Send(a.Name(), cmd.Encode()); err != nil {
			t.Fatal(err)
		}
		_ = p.Members()
		poll.Until(t, 10*time.Second, fmt.Sprintf("the proxy to see held=%v during the shutdown", drain), func() bool {
			m, _ := p.member(a.Name())
			return m.Meta.Held == drain && m.Meta.State == balancer.StateDraining
		})
	}
	p.inflight.Store(0)
}

// An admin_drain command from a member that is not a proxy (another
// replica's agent, say) is rejected, logged and counted; the agent keeps
// advertising what its probes say.
func TestAdminDrainCommandFromNonProxyRejected(t *testing.T) {
	p := startFakeProxy(t, "p1")
	p.silent.Store(true)
	rep := startReplica(t, "ok")
	cfg := testConfig(rep.addr, p.GossipAddr())
	cfg.Drain.Timeout = 0 // the silent proxy would hold the shutdown
	a := startAgent(t, cfg)
	other := startNode(t, membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "orders-1", Addr: "127.0.0.1:1", State: balancer.StateReady}, p.GossipAddr())
	poll.Until(t, 10*time.Second, "the other replica and the proxy to see the agent ready", func() bool {
		m, ok := p.member(a.Name())
		o, ook := other.member(a.Name())
		return ok && ook && m.Meta.State == balancer.StateReady && o.Status == membership.StatusAlive
	})
	poll.Until(t, 10*time.Second, "the agent to see the other replica", func() bool {
		return aliveReplicas(t, a.reg) == 2 // itself and the other
	})

	drain := membership.AdminDrain{Set: "orders", Replica: "orders-0", Drain: true, By: p.Name()}
	if err := other.Send(a.Name(), drain.Encode()); err != nil {
		t.Fatal(err)
	}
	_ = other.Members()
	poll.Until(t, 10*time.Second, "the command to be counted as rejected", func() bool {
		return metric(t, a.reg, "keyway_gossip_rejected_total", "reason", "not_proxy") == 1
	})
	if a.Held() {
		t.Fatal("a replica's agent drained this one")
	}
	if s := a.State(); s != balancer.StateReady {
		t.Fatalf("state %s after a rejected command, want ready", s)
	}
	warned := a.logs.FilterMessageSnippet("gossip: refused").FilterField(zap.String("from", other.Name())).FilterField(zap.String("reason", "not_proxy")).FilterField(zap.String("what", "admin_drain"))
	if warned.Len() != 1 {
		t.Fatalf("%d rejection warnings naming %s, want 1", warned.Len(), other.Name())
	}

	// The proxy still may.
	if err := p.Send(a.Name(), drain.Encode()); err != nil {
		t.Fatal(err)
	}
	_ = p.Members()
	poll.Until(t, 10*time.Second, "the proxy's command to hold the drain", a.Held)
	if n := metric(t, a.reg, "keyway_gossip_rejected_total", "reason", "not_proxy"); n != 1 {
		t.Fatalf("rejected %v commands after the proxy's, want still 1", n)
	}
}

// aliveReplicas reads keyway_gossip_members{role="replica",status="alive"}
// from reg: the replicas a node sees alive, itself included.
func aliveReplicas(t *testing.T, reg prometheus.Gatherer) float64 {
	t.Helper()
	return aliveMembers(t, reg, "replica")
}

// aliveMembers returns keyway_gossip_members{role, status="alive"}.
func aliveMembers(t *testing.T, reg prometheus.Gatherer, role string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "keyway_gossip_members" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["role"] == role && labels["status"] == "alive" {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}
