package agent_test

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"keyway/agent"
	"keyway/balancer"
	"keyway/internal/poll"
	"keyway/membership"
)

// The probe of a real scripted replica drives the lifecycle: starting
// stays starting while the replica fails, rise passes make it ready,
// timeouts and 503s make it recovering after fall failures, passes bring it
// back; /readyz, /healthz and the state metric follow. Without any proxy in
// the cluster, shutdown drains at once.
func TestProbeDrivesLifecycle(t *testing.T) {
	seed := startNode(t, membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "seed", Addr: "127.0.0.1:1"})
	rep := startReplica(t, "fail")
	a := startAgent(t, testConfig(rep.addr, seed.GossipAddr()))

	state := func(want balancer.State) func() bool { return func() bool { return a.State() == want } }

	// Starting, and staying so: rise+2 failed probes later it is still starting.
	poll.Until(t, 5*time.Second, "4 probes", func() bool { return rep.requests.Load() >= 4 })
	if s := a.State(); s != balancer.StateStarting {
		t.Fatalf("state %s after failing probes, want starting", s)
	}
	if code, body := get(t, a.base+"/readyz"); code != 503 || body != "not ready: starting\n" {
		t.Fatalf("/readyz while starting: %d %q", code, body)
	}
	if code, body := get(t, a.base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}

	rep.mode.Store("ok")
	poll.Until(t, 5*time.Second, "ready", state(balancer.StateReady))
	if code, body := get(t, a.base+"/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz when ready: %d %q", code, body)
	}
	poll.Until(t, 5*time.Second, "the seed to see it ready", func() bool {
		m, ok := seed.member(a.Name())
		return ok && m.Meta.State == balancer.StateReady && m.Meta.Addr == rep.addr && m.Meta.Set == "orders" && m.Meta.Replica == "orders-0"
	})

	// Timeouts count as failures.
	rep.mode.Store("hang")
	poll.Until(t, 5*time.Second, "recovering after timeouts", state(balancer.StateRecovering))
	if code, body := get(t, a.base+"/readyz"); code != 503 || body != "not ready: recovering\n" {
		t.Fatalf("/readyz when recovering: %d %q", code, body)
	}
	rep.mode.Store("ok")
	poll.Until(t, 5*time.Second, "ready again", state(balancer.StateReady))
	rep.mode.Store("fail")
	poll.Until(t, 5*time.Second, "recovering after 503s", state(balancer.StateRecovering))

	// /metrics: exactly one state is 1; the names pass promlint.
	code, body := get(t, a.base+"/metrics")
	if code != 200 || !strings.Contains(body, `keyway_agent_state{state="recovering"} 1`) || !strings.Contains(body, `keyway_agent_state{state="ready"} 0`) ||
		!strings.Contains(body, "keyway_gossip_members") || !strings.Contains(body, `keyway_agent_info{replica="orders-0",set="orders"} 1`) {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "keyway_agent_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	if v := metric(t, a.reg, "keyway_agent_probes_total", "result", "fail"); v < 6 {
		t.Errorf("probes_total{result=fail} = %v, want at least 6", v)
	}

	// No proxy in the cluster: drained at once.
	start := time.Now()
	if err := a.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("cancel (SIGTERM) to Run returned, no proxy in the cluster: %s", time.Since(start))
	if s := a.State(); s != balancer.StateStopped {
		t.Fatalf("state after Run: %s", s)
	}
	want := []string{"starting>ready", "ready>recovering", "recovering>ready", "ready>recovering", "recovering>draining", "draining>stopped"}
	if got := transitions(a.logs); !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	drained := a.logs.FilterMessage("replica drained").All()
	if len(drained) != 1 || drained[0].ContextMap()["proxies"] != int64(0) {
		t.Fatalf("drained log: %+v", drained)
	}
	// The seed saw a graceful leave, not a crash, and no removal.
	poll.Until(t, 5*time.Second, "the seed to see it leave", func() bool {
		m, ok := seed.member(a.Name())
		return ok && m.Status == membership.StatusLeft
	})
	if m, _ := seed.member(a.Name()); m.Meta.Remove {
		t.Fatal("Remove set without drain.remove")
	}
}

// The drain waits for every live proxy: the agent stays draining while one
// proxy still has requests in flight, stops once both report none, and
// advertises Remove only with drain.remove.
func TestDrainWaitsForProxies(t *testing.T) {
	for _, remove := range []bool{false, true} {
		name := "restart"
		if remove {
			name = "remove"
		}
		t.Run(name, func(t *testing.T) {
			p1 := startFakeProxy(t, "p1")
			p2 := startFakeProxy(t, "p2", p1.GossipAddr())
			rep := startReplica(t, "ok")
			cfg := testConfig(rep.addr, p1.GossipAddr())
			cfg.Drain.Remove = remove
			a := startAgent(t, cfg)
			for _, p := range []*fakeProxy{p1, p2} {
				poll.Until(t, 10*time.Second, "proxies to see the agent ready", func() bool {
					m, ok := p.member(a.Name())
					return ok && m.Status == membership.StatusAlive && m.Meta.State == balancer.StateReady
				})
			}
			accepted := func() float64 { return metric(t, a.reg, "keyway_agent_drain_reports_total", "result", "accepted") }

			p2.inflight.Store(3)
			start := time.Now()
			a.cancel()
			if !remove {
				// Both proxies have reported several times since the drain
				// began (p2 with 3 in flight): still draining.
				poll.Until(t, 10*time.Second, "10 accepted reports", func() bool { return accepted() >= 10 })
				if s := a.State(); s != balancer.StateDraining {
					t.Fatalf("state %s while a proxy reports 3 in flight, want draining", s)
				}
				if code, body := get(t, a.base+"/readyz"); code != 503 || body != "not ready: draining\n" {
					t.Fatalf("/readyz while draining: %d %q", code, body)
				}
				if v := metric(t, a.reg, "keyway_agent_state", "state", "draining"); v != 1 {
					t.Fatalf("keyway_agent_state{state=draining} = %v", v)
				}
				t.Logf("still draining after %s and %v reports", time.Since(start), accepted())
			}
			released := time.Now()
			p2.inflight.Store(0)
			if err := a.stop(t, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			t.Logf("remove=%v: cancel (SIGTERM) to Run returned %s, %s after the last proxy reported 0 in flight", remove, time.Since(start), time.Since(released))
			if a.State() != balancer.StateStopped {
				t.Fatalf("state %s", a.State())
			}
			if n := len(a.logs.FilterMessage("drain timed out; proxies may still be sending").All()); n != 0 {
				t.Fatal("the drain timed out")
			}
			drained := a.logs.FilterMessage("replica drained").All()
			if len(drained) != 1 || drained[0].ContextMap()["proxies"] != int64(2) {
				t.Fatalf("drained log: %+v", drained)
			}
			// Leaving for good waits for every proxy to see stopped; a
			// restart does not.
			confirmed := len(a.logs.FilterMessage("every proxy sees the replica stopped").All())
			unconfirmed := len(a.logs.FilterMessage("leaving before every proxy confirmed the stopped state; those may keep the replica's partitions until gossip.forget_after").All())
			if want := map[bool]int{true: 1, false: 0}[remove]; confirmed != want || unconfirmed != 0 {
				t.Fatalf("remove=%v: stopped confirmed %d times, unconfirmed %d; want %d and 0", remove, confirmed, unconfirmed, want)
			}
			for _, p := range []*fakeProxy{p1, p2} {
				poll.Until(t, 10*time.Second, "proxies to see the agent leave", func() bool {
					m, ok := p.member(a.Name())
					return ok && m.Status == membership.StatusLeft
				})
				m, _ := p.member(a.Name())
				if m.Meta.State != balancer.StateStopped || m.Meta.Remove != remove {
					t.Fatalf("proxy's view after leave: state %s remove %v, want stopped remove %v", m.Meta.State, m.Meta.Remove, remove)
				}
			}
		})
	}
}

// A proxy that never reports holds the drain until drain.timeout, and the
// log names it.
func TestDrainTimesOut(t *testing.T) {
	p1 := startFakeProxy(t, "p1")
	p2 := startFakeProxy(t, "p2", p1.GossipAddr())
	p2.silent.Store(true)
	rep := startReplica(t, "ok")
	cfg := testConfig(rep.addr, p1.GossipAddr())
	cfg.Drain.Timeout = time.Second
	a := startAgent(t, cfg)
	poll.Until(t, 10*time.Second, "p2 to see the agent", func() bool { _, ok := p2.member(a.Name()); return ok })
	poll.Until(t, 10*time.Second, "the agent to see p2", func() bool {
		for _, m := range p1.Members() {
			if m.Node == p2.Name() && m.Status == membership.StatusAlive {
				return true
			}
		}
		return false
	})
	start := time.Now()
	if err := a.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("cancel (SIGTERM) to Run returned with a silent proxy and drain.timeout 1s: %s", took)
	if took < time.Second {
		t.Fatalf("stopped after %s, before drain.timeout", took)
	}
	if p1.sent.Load() == 0 {
		t.Fatal("p1 never reported")
	}
	e := a.logs.FilterMessage("drain timed out; proxies may still be sending").All()
	if len(e) != 1 {
		t.Fatalf("want one drain timeout log, got %d", len(e))
	}
	pending := e[0].ContextMap()["pending"]
	if want := []any{p2.Name() + "=no report"}; !slices.Equal(pending.([]any), want) {
		t.Fatalf("pending %v, want %v", pending, want)
	}
	if a.State() != balancer.StateStopped {
		t.Fatalf("state %s", a.State())
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := agent.New(agent.DefaultConfig(), agent.Options{}); err == nil || !strings.Contains(err.Error(), "replica.addr: required") {
		t.Fatalf("New with the default config: %v", err)
	}
	cfg := testConfig("127.0.0.1:9", "127.0.0.1:7946")
	cfg.Replica.Name = ""
	if _, err := agent.New(cfg, agent.Options{Hostname: func() (string, error) { return "bad host", nil }}); err == nil || !strings.Contains(err.Error(), "host name") {
		t.Fatalf("New with an invalid host name: %v", err)
	}
	a, err := agent.New(cfg, agent.Options{Hostname: func() (string, error) { return "orders-7", nil }})
	if err != nil || a.Meta().Replica != "orders-7" || a.Meta().State != balancer.StateStarting || a.Meta().Role != membership.RoleReplica {
		t.Fatalf("New with the host name as replica name: %v %+v", err, a.Meta())
	}
	if err := a.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "Attach") {
		t.Fatalf("Run without a gossip member: %v", err)
	}
}

// With a fixed gossip port and a specific bind address, the agent
// advertises that port (memberlist alone would advertise port 0:
// membership fills in the bound port) and peers reach it.
func TestFixedGossipPortIsAdvertised(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	seed := startNode(t, membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "seed", Addr: "127.0.0.1:1"})
	rep := startReplica(t, "ok")
	cfg := testConfig(rep.addr, seed.GossipAddr())
	cfg.Gossip.BindPort = port
	a := startAgent(t, cfg)
	want := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if got := a.GossipAddr(); got != want {
		t.Fatalf("advertised %s, want %s", got, want)
	}
	poll.Until(t, 10*time.Second, "the seed to see the agent ready at its port", func() bool {
		m, ok := seed.member(a.Name())
		return ok && m.Gossip == want && m.Meta.State == balancer.StateReady
	})
}
