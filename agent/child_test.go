package agent_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"keyway/agent"
	"keyway/balancer"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/membership"
)

// child is a fake replica process for the agent: the test ends it. With
// exitOnTerm SIGTERM ends it; SIGKILL always does. onSignal, if set, runs
// on every signal before it takes effect (to see the agent's state then).
type child struct {
	pid        int
	exitC      chan agent.Exit
	exitOnTerm bool
	onSignal   func(syscall.Signal)

	mu   sync.Mutex
	sigs []syscall.Signal
	done bool
}

func (c *child) Pid() int         { return c.pid }
func (c *child) Wait() agent.Exit { return <-c.exitC }

func (c *child) Signal(sig syscall.Signal) error {
	if c.onSignal != nil {
		c.onSignal(sig)
	}
	c.mu.Lock()
	c.sigs = append(c.sigs, sig)
	c.mu.Unlock()
	switch {
	case sig == syscall.SIGKILL:
		c.exit(agent.Exit{Code: -1, Signal: "SIGKILL"})
	case sig == syscall.SIGTERM && c.exitOnTerm:
		c.exit(agent.Exit{Code: 0})
	}
	return nil
}

func (c *child) exit(e agent.Exit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.done = true
		c.exitC <- e
	}
}

func (c *child) signals() []syscall.Signal {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sigs)
}

// children starts a child per start, pids 500, 501, …
type children struct {
	mu         sync.Mutex
	argv       []string
	all        []*child
	exitOnTerm bool
	onSignal   func(syscall.Signal)
}

func (cs *children) start(argv []string) (agent.Process, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.argv = argv
	c := &child{pid: 500 + len(cs.all), exitC: make(chan agent.Exit, 1), exitOnTerm: cs.exitOnTerm, onSignal: cs.onSignal}
	cs.all = append(cs.all, c)
	return c, nil
}

func (cs *children) count() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.all)
}

func (cs *children) last() *child {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.all[len(cs.all)-1]
}

// startSupervising is startAgent for an agent that supervises fake
// children.
func startSupervising(t *testing.T, cfg agent.Config, cs *children) *running {
	t.Helper()
	return runAgent(t, cfg, cs.start)
}

// auditProxy is a gossip member with role proxy that keeps every replica
// process event it receives.
type auditProxy struct {
	*membership.Node
	mu     sync.Mutex
	events []membership.ProcessEvent
}

func startAuditProxy(t *testing.T, join ...string) *auditProxy {
	t.Helper()
	log, _ := testLogger(t)
	p := &auditProxy{}
	n, err := membership.New(gossipConfig(join...), membership.Meta{Role: membership.RoleProxy, Addr: "audit"}, membership.Options{
		Logger: log.Named("proxy"),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.Handle(membership.ProcessEventKind, membership.RoleReplica, func(m membership.Message) {
		if e, err := membership.DecodeProcessEvent(m.Body); err == nil {
			p.mu.Lock()
			p.events = append(p.events, e)
			p.mu.Unlock()
		}
	})
	p.Node = n
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	<-n.Started()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// seen lists the events received, in Seq order, as "event" or
// "event:reason".
func (p *auditProxy) seen() []string {
	p.mu.Lock()
	evs := slices.Clone(p.events)
	p.mu.Unlock()
	// In the agent's order: packets may arrive out of it.
	slices.SortFunc(evs, func(a, b membership.ProcessEvent) int { return int(a.Seq) - int(b.Seq) })
	var out []string
	for _, e := range evs {
		s := e.Event
		if e.Reason != "" {
			s += ":" + e.Reason
		}
		out = append(out, s)
	}
	return out
}

// stateAt returns the state the proxy sees for node, or "".
func stateAt(n *membership.Node, node string) string {
	for _, m := range n.Members() {
		if m.Node == node {
			return m.Meta.State.String()
		}
	}
	return ""
}

func superviseConfig(replicaAddr string, join ...string) agent.Config {
	cfg := testConfig(replicaAddr, join...)
	cfg.Command = []string{"orders-pipeline", "--port", "9001"}
	cfg.Supervise.BackoffMin, cfg.Supervise.BackoffMax = 10*time.Millisecond, 20*time.Millisecond
	cfg.Supervise.MaxRestarts, cfg.Supervise.Window = 2, time.Minute
	cfg.Supervise.StopGrace = 5 * time.Second
	return cfg
}

// The agent runs the command, advertises recovering while the process is
// down, starting once it runs again, failed after giving up, and starting
// again after Repair; every start, exit, restart and the give-up reach a
// proxy as messages and are counted.
func TestSupervisedProcessStates(t *testing.T) {
	px := startAuditProxy(t)
	rep := startReplica(t, "ok")
	cs := &children{exitOnTerm: true}
	cfg := superviseConfig(rep.addr, px.GossipAddr())
	cfg.Drain.Timeout = 100 * time.Millisecond // this proxy sends no drain reports
	a := startSupervising(t, cfg, cs)
	sees := func(state string) {
		t.Helper()
		poll.Until(t, 10*time.Second, "the proxy to see "+state, func() bool { return stateAt(px.Node, a.Name()) == state })
	}
	sees("ready")
	if got := strings.Join(cs.argv, " "); got != "orders-pipeline --port 9001" {
		t.Fatalf("command %q", got)
	}

	// A crash: recovering while down, restarted after the backoff,
	// starting, and ready again once probed.
	cs.last().exit(agent.Exit{Code: -1, Signal: "SIGKILL"})
	want := []string{"starting>ready", "ready>recovering", "recovering>starting", "starting>ready"}
	poll.Until(t, 10*time.Second, "transitions "+strings.Join(want, " "), func() bool { return slices.Equal(transitions(a.logs), want) })
	if cs.count() != 2 {
		t.Fatalf("%d starts, want 2", cs.count())
	}
	sees("ready")

	// Two more quick exits: the second restart (max_restarts 2 within the
	// window) is the last; the third exit gives up.
	cs.last().exit(agent.Exit{Code: 1})
	poll.Until(t, 10*time.Second, "the second restart", func() bool { return cs.count() == 3 })
	cs.last().exit(agent.Exit{Code: 1})
	sees("failed")
	if a.State() != balancer.StateFailed {
		t.Fatalf("state %s", a.State())
	}
	if code, body := get(t, a.base+"/readyz"); code != 503 || body != "not ready: failed\n" {
		t.Fatalf("/readyz when failed: %d %q", code, body)
	}
	if cs.count() != 3 {
		t.Fatalf("%d starts after giving up, want 3", cs.count())
	}
	for name, want := range map[string]float64{
		"keyway_agent_child_starts_total": 3, "keyway_agent_child_restarts_total": 2,
		"keyway_agent_child_gave_up_total": 1, "keyway_agent_child_running": 0,
	} {
		if v := testutilValue(t, a.reg, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if v := metric(t, a.reg, "keyway_agent_child_exits_total", "reason", "signal"); v != 1 {
		t.Errorf("exits by signal: %v", v)
	}
	if v := metric(t, a.reg, "keyway_agent_child_exits_total", "reason", "exit_code"); v != 2 {
		t.Errorf("exits with a code: %v", v)
	}
	want = []string{"start", "exit:signal", "restart", "start", "exit:exit_code", "restart", "start", "exit:exit_code", "give_up"}
	if !poll.Within(10*time.Second, func() bool { return len(px.seen()) >= len(want) }) {
		for _, e := range a.logs.FilterMessage("replica process event not sent").All() {
			t.Log(e.ContextMap())
		}
		t.Fatalf("events at the proxy: %v, want %v", px.seen(), want)
	}
	// The first start, before the agent knew the proxy, was held for it.
	if got := px.seen(); !slices.Equal(got, want) {
		t.Fatalf("events at the proxy: %v, want %v", got, want)
	}

	// Repair: a fresh budget, the process again, ready again.
	if err := a.Repair(); err != nil {
		t.Fatal(err)
	}
	sees("ready")
	if cs.count() != 4 {
		t.Fatalf("%d starts after the repair, want 4", cs.count())
	}
	if err := a.Repair(); !errors.Is(err, agent.ErrNotFailed) {
		t.Fatalf("repair when not failed: %v", err)
	}
	poll.Until(t, 10*time.Second, "the proxy to receive the repair", func() bool {
		s := px.seen()
		return len(s) >= 2 && s[len(s)-2] == "repair" && s[len(s)-1] == "start"
	})

	// A stop is not a crash: SIGTERM, the process exits, no restart.
	if err := a.stop(t, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if cs.count() != 4 || !slices.Equal(cs.last().signals(), []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("%d starts, last signals %v", cs.count(), cs.last().signals())
	}
	if v := metric(t, a.reg, "keyway_agent_child_exits_total", "reason", "stop"); v != 1 {
		t.Errorf("exits by stop: %v", v)
	}
	if err := a.Repair(); !errors.Is(err, agent.ErrNotRunning) {
		t.Fatalf("repair after Run: %v", err)
	}
}

// testutilValue returns the value of the unlabelled metric name, or -1.
func testutilValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.Gauge != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// On shutdown the process is signalled only once every proxy reports the
// replica drained, and the agent advertises stopped only once the process
// has exited; a process that ignores SIGTERM gets SIGKILL after
// supervise.stop_grace.
func TestSupervisedStopsAfterDrain(t *testing.T) {
	for _, ignoresTerm := range []bool{false, true} {
		name := "exits on SIGTERM"
		if ignoresTerm {
			name = "ignores SIGTERM"
		}
		t.Run(name, func(t *testing.T) {
			p := startFakeProxy(t, "p1")
			rep := startReplica(t, "ok")
			cfg := superviseConfig(rep.addr, p.GossipAddr())
			cfg.Supervise.StopGrace = 200 * time.Millisecond
			var a *running
			var mu sync.Mutex
			var statesAtSignal []string
			cs := &children{exitOnTerm: !ignoresTerm, onSignal: func(sig syscall.Signal) {
				mu.Lock()
				defer mu.Unlock()
				drained := len(a.logs.FilterMessage("replica drained").All()) == 1
				statesAtSignal = append(statesAtSignal, sig.String()+"@"+a.State().String()+map[bool]string{true: " drained", false: ""}[drained])
			}}
			a = startSupervising(t, cfg, cs)
			poll.Until(t, 10*time.Second, "the proxy to see the agent ready", func() bool {
				m, ok := p.member(a.Name())
				return ok && m.Meta.State == balancer.StateReady
			})
			p.inflight.Store(2)
			a.cancel()
			poll.Until(t, 10*time.Second, "5 accepted reports", func() bool {
				return metric(t, a.reg, "keyway_agent_drain_reports_total", "result", "accepted") >= 5
			})
			if a.State() != balancer.StateDraining || len(cs.last().signals()) != 0 {
				t.Fatalf("while a proxy has 2 in flight: state %s, signals %v; want draining and none", a.State(), cs.last().signals())
			}
			p.inflight.Store(0)
			if err := a.stop(t, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			got := strings.Join(statesAtSignal, ", ")
			mu.Unlock()
			want := "terminated@draining drained"
			if ignoresTerm {
				want += ", killed@draining drained"
			}
			if got != want {
				t.Fatalf("signals: %s, want %s", got, want)
			}
			killedLogs := len(a.logs.FilterMessage("replica process still running after supervise.stop_grace; sending SIGKILL").All())
			if killedLogs != map[bool]int{true: 1, false: 0}[ignoresTerm] {
				t.Fatalf("%d SIGKILL warnings", killedLogs)
			}
			// The order in the log: drained, process stopped, then stopped
			// advertised.
			var order []string
			for _, e := range a.logs.All() {
				switch e.Message {
				case "replica drained", "stopping replica process", "replica process exited":
					order = append(order, e.Message)
				case "replica state changed":
					if e.ContextMap()["to"] == "stopped" {
						order = append(order, "stopped")
					}
				}
			}
			if w := []string{"replica drained", "stopping replica process", "replica process exited", "stopped"}; !slices.Equal(order, w) {
				t.Fatalf("order %v, want %v", order, w)
			}
		})
	}
}

// Without a command the agent supervises nothing: no process metrics, and
// Repair says so.
func TestNoCommandNoSupervision(t *testing.T) {
	seed := startNode(t, membership.Meta{Role: membership.RoleProxy, Addr: "seed"})
	rep := startReplica(t, "ok")
	a := startAgent(t, testConfig(rep.addr, seed.GossipAddr()))
	if err := a.Repair(); !errors.Is(err, agent.ErrNotSupervising) {
		t.Fatalf("Repair: %v", err)
	}
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "keyway_agent_child_") {
			t.Errorf("metric %s without a command", mf.GetName())
		}
	}
}

// A proxy learns from the gossip metadata whether an agent supervises its
// replica's process: a rolling restart or a repair refuses at once when
// it cannot restart a replica.
func TestAgentAdvertisesSupervision(t *testing.T) {
	slow.Skip(t)
	p := startFakeProxy(t, "p1")
	sup := startSupervising(t, superviseConfig(startReplica(t, "ok").addr, p.GossipAddr()), &children{exitOnTerm: true})
	plain := startAgent(t, testConfig(startReplica(t, "ok").addr, p.GossipAddr()))
	for _, tc := range []struct {
		a          *running
		supervised bool
	}{{sup, true}, {plain, false}} {
		if m := tc.a.Meta(); m.Supervised != tc.supervised || !m.SupervisionKnown {
			t.Fatalf("%s advertises supervised=%v known=%v, want %v and known", tc.a.Name(), m.Supervised, m.SupervisionKnown, tc.supervised)
		}
		poll.Until(t, 10*time.Second, "the proxy to see "+tc.a.Name()+"'s supervision", func() bool {
			m, ok := p.member(tc.a.Name())
			return ok && m.Meta.SupervisionKnown && m.Meta.Supervised == tc.supervised
		})
	}
	// State changes keep the flags.
	poll.Until(t, 10*time.Second, "the supervised agent ready, still supervised", func() bool {
		m, ok := p.member(sup.Name())
		return ok && m.Meta.State == balancer.StateReady && m.Meta.Supervised
	})
}

// A process that exits while the replica drains is not restarted: the
// replica is going away.
func TestSupervisedNoRestartWhileDraining(t *testing.T) {
	p := startFakeProxy(t, "p1")
	rep := startReplica(t, "ok")
	cs := &children{exitOnTerm: true}
	a := startSupervising(t, superviseConfig(rep.addr, p.GossipAddr()), cs)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", func() bool {
		m, ok := p.member(a.Name())
		return ok && m.Meta.State == balancer.StateReady
	})
	p.inflight.Store(1)
	a.cancel()
	poll.Until(t, 10*time.Second, "draining", func() bool { return a.State() == balancer.StateDraining })
	cs.last().exit(agent.Exit{Code: 1})
	poll.Until(t, 10*time.Second, "the exit to be handled", func() bool {
		return len(a.logs.FilterMessage("replica process exited").All()) == 1
	})
	// A round trip through the supervisor: the exit has been handled
	// completely, restart or not.
	if err := a.Repair(); !errors.Is(err, agent.ErrNotRunning) {
		t.Fatalf("Repair while draining: %v, want ErrNotRunning", err)
	}
	if n := len(a.logs.FilterMessage("replica process restart scheduled").All()); n != 0 || cs.count() != 1 {
		t.Fatalf("%d restarts scheduled, %d starts while draining; want 0 and 1", n, cs.count())
	}
	if a.State() != balancer.StateDraining {
		t.Fatalf("state %s after the exit while draining", a.State())
	}
	p.inflight.Store(0)
	if err := a.stop(t, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if len(cs.last().signals()) != 0 {
		t.Fatalf("the exited process was signalled: %v", cs.last().signals())
	}
}

// Process events from before the agent knew any proxy (the first start,
// as gossip joins) are held and sent to the first proxy that appears.
func TestProcessEventsHeldForTheFirstProxy(t *testing.T) {
	seed := startNode(t, membership.Meta{Role: membership.RoleReplica, Set: "other", Replica: "seed", Addr: "127.0.0.1:1"})
	rep := startReplica(t, "ok")
	cfg := superviseConfig(rep.addr, seed.GossipAddr())
	cfg.Drain.Timeout = 100 * time.Millisecond
	a := startSupervising(t, cfg, &children{exitOnTerm: true})
	poll.Until(t, 10*time.Second, "the agent to be ready", func() bool { return a.State() == balancer.StateReady })
	px := startAuditProxy(t, seed.GossipAddr())
	poll.Until(t, 10*time.Second, "the proxy to receive the first start", func() bool { return slices.Equal(px.seen(), []string{"start"}) })
}

// A proxy that joins later (another proxy, or a new process of one after
// an upgrade or a restart) gets the current process's events, from its
// last start on, and the proxies that had them get none again.
func TestProcessEventsCatchUpALaterProxy(t *testing.T) {
	first := startAuditProxy(t)
	rep := startReplica(t, "ok")
	cs := &children{exitOnTerm: true}
	cfg := superviseConfig(rep.addr, first.GossipAddr())
	cfg.Drain.Timeout = 100 * time.Millisecond
	a := startSupervising(t, cfg, cs)
	poll.Until(t, 10*time.Second, "the first proxy to see the agent ready", func() bool { return stateAt(first.Node, a.Name()) == "ready" })
	cs.last().exit(agent.Exit{Code: -1, Signal: "SIGKILL"})
	want := []string{"start", "exit:signal", "restart", "start"}
	poll.Until(t, 10*time.Second, "the first proxy to see the restart", func() bool { return slices.Equal(first.seen(), want) })

	later := startAuditProxy(t, first.GossipAddr())
	poll.Until(t, 10*time.Second, "the later proxy to receive the current start", func() bool { return len(later.seen()) > 0 })
	later.mu.Lock()
	got := slices.Clone(later.events)
	later.mu.Unlock()
	if len(got) != 1 || got[0].Event != "start" || got[0].Seq != 4 || got[0].Pid != cs.last().Pid() {
		t.Fatalf("the later proxy got %+v, want the one start of process %d (seq 4)", got, cs.last().Pid())
	}
	if seen := first.seen(); !slices.Equal(seen, want) {
		t.Fatalf("the first proxy got events again: %v", seen)
	}
}
