package membership

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"keyway/balancer"

	"keyway/internal/metricstest"
	"keyway/internal/poll"
)

const membersHead = `# HELP keyway_gossip_members Gossip members this node knows, by role and status (alive, dead, left), itself included.
# TYPE keyway_gossip_members gauge
`

const replicasHead = `# HELP keyway_gossip_replicas Replica members alive in gossip, by the lifecycle state they advertise (starting, ready, draining, recovering, stopped, failed).
# TYPE keyway_gossip_replicas gauge
`

// membersExposition is the exposition of keyway_gossip_members and
// keyway_gossip_replicas with the given non-zero series ("proxy/alive",
// "replica/dead", ... and "ready", "draining", ...): every other series
// reads 0.
func membersExposition(nonZero map[string]int) string {
	var b strings.Builder
	b.WriteString(membersHead)
	for _, r := range []string{"proxy", "replica"} {
		for _, s := range []string{"alive", "dead", "left"} {
			fmt.Fprintf(&b, "keyway_gossip_members{role=%q,status=%q} %d\n", r, s, nonZero[r+"/"+s])
		}
	}
	b.WriteString(replicasHead)
	for _, st := range []string{"draining", "failed", "ready", "recovering", "starting", "stopped"} {
		fmt.Fprintf(&b, "keyway_gossip_replicas{state=%q} %d\n", st, nonZero[st])
	}
	return b.String()
}

var memberFamilies = []string{"keyway_gossip_members", "keyway_gossip_replicas"}

// observe counts members by role and status, and alive replicas by
// state; every series exists, 0 when nobody matches.
func TestMembersGauges(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := newMetrics(reg, func() int { return 0 })
	mem := func(role Role, st balancer.State, status Status) Member {
		return Member{Meta: Meta{Role: role, State: st}, Status: status}
	}
	m.observe([]Member{
		mem(RoleProxy, balancer.StateUnknown, StatusAlive),
		mem(RoleProxy, balancer.StateUnknown, StatusDead),
		mem(RoleReplica, balancer.StateReady, StatusAlive),
		mem(RoleReplica, balancer.StateReady, StatusAlive),
		mem(RoleReplica, balancer.StateDraining, StatusAlive),
		mem(RoleReplica, balancer.StateReady, StatusDead),
		mem(RoleReplica, balancer.StateStopped, StatusLeft),
	})
	want := membersExposition(map[string]int{
		"proxy/alive": 1, "proxy/dead": 1, "replica/alive": 3, "replica/dead": 1, "replica/left": 1,
		"ready": 2, "draining": 1,
	})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), memberFamilies...); err != nil {
		t.Fatal(err)
	}
	m.observe([]Member{mem(RoleProxy, balancer.StateUnknown, StatusAlive)})
	want = membersExposition(map[string]int{"proxy/alive": 1})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), memberFamilies...); err != nil {
		t.Fatal(err)
	}
	lint(t, reg)
}

func lint(t *testing.T, reg prometheus.Gatherer) {
	t.Helper()
	metricstest.Lint(t, reg)
}

// waitExposition polls reg until the named families read want.
func waitExposition(t *testing.T, what string, reg prometheus.Gatherer, want string, names ...string) {
	t.Helper()
	var err error
	if !poll.Within(15*time.Second, func() bool {
		err = testutil.GatherAndCompare(reg, strings.NewReader(want), names...)
		return err == nil
	}) {
		t.Fatalf("%s: %v", what, err)
	}
}

func loopbackConfig() Config {
	c := DefaultConfig()
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.Profile = "fast"
	c.PushPullInterval = time.Second
	return c
}

// runNode runs n until the test ends (or stop is called) and waits until
// it is bound.
func runNode(t *testing.T, n *Node) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-n.Started():
	case err := <-done:
		cancel()
		t.Fatalf("node did not start: %v", err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// A proxy's gossip metrics over real loopback gossip: the health score
// (-1 before Run, then memberlist's score), and a replica counted by its
// advertised state as it becomes ready, drains and leaves.
func TestGossipMetricsLive(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	proxy, err := New(loopbackConfig(), Meta{Role: RoleProxy, Addr: "127.0.0.1:1"}, Options{Logger: zap.NewNop(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	const scoreHead = `# HELP keyway_gossip_health_score memberlist's awareness (Lifeguard) score of this node: 0 is healthy; higher means it has been missing probe acks and may itself be slow or degraded (its probe timeouts are stretched accordingly); -1 while gossip is not running.
# TYPE keyway_gossip_health_score gauge
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(scoreHead+"keyway_gossip_health_score -1\n"), "keyway_gossip_health_score"); err != nil {
		t.Fatalf("before Run: %v", err)
	}
	runNode(t, proxy)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "keyway_gossip_health_score" {
			// memberlist's awareness is 0 when healthy and at most
			// AwarenessMaxMultiplier-1 (7 by default).
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v < 0 || v > 7 {
				t.Fatalf("health score %v while running", v)
			}
		}
	}
	waitExposition(t, "the proxy alone", reg, membersExposition(map[string]int{"proxy/alive": 1}), memberFamilies...)

	rcfg := loopbackConfig()
	rcfg.Join = []string{proxy.GossipAddr()}
	replica, err := New(rcfg, Meta{Role: RoleReplica, Set: "orders", Replica: "orders-0", Addr: "127.0.0.1:2", State: balancer.StateStarting}, Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	stopReplica := runNode(t, replica)
	waitExposition(t, "replica starting", reg, membersExposition(map[string]int{"proxy/alive": 1, "replica/alive": 1, "starting": 1}), memberFamilies...)
	for _, st := range []balancer.State{balancer.StateReady, balancer.StateDraining, balancer.StateStopped} {
		if err := replica.UpdateMeta(func(m *Meta) { m.State = st }, time.Second); err != nil {
			t.Fatal(err)
		}
		waitExposition(t, "replica "+st.String(), reg, membersExposition(map[string]int{"proxy/alive": 1, "replica/alive": 1, st.String(): 1}), memberFamilies...)
	}
	// A graceful leave after advertising stopped: left.
	stopReplica()
	waitExposition(t, "replica left", reg, membersExposition(map[string]int{"proxy/alive": 1, "replica/left": 1}), memberFamilies...)
	lint(t, reg)
}
