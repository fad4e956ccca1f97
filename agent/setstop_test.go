package agent_test

import (
	"context"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/agent"
	"keyway/balancer"
	"keyway/internal/poll"
	"keyway/membership"
)

// setProxy is a gossip member with role proxy that behaves like a real
// proxy towards set stops: every 50ms it sends the set's wanted mode
// (membership.SetStop) to every alive agent of set orders whose SetStopped
// flag differs, and a drain report to every replica it sees draining (with
// the in-flight count the test controls) or stopped (StoppedSeen, nothing
// in flight). It commands nothing until want is called.
type setProxy struct {
	*gossipNode
	inflight  atomic.Int64
	commanded atomic.Bool
	stop      atomic.Bool
	version   atomic.Uint64
	commands  atomic.Int64 // set commands sent
}

func startSetProxy(t *testing.T, join ...string) *setProxy {
	t.Helper()
	p := &setProxy{gossipNode: startNode(t, membership.Meta{Role: membership.RoleProxy, Addr: "setproxy"}, join...)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			p.round()
		}
	}()
	// Registered after startNode's cleanup, so it runs first: the loop
	// stops before the node does.
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// want sets what the set wants, as of version.
func (p *setProxy) want(stop bool, version uint64) {
	p.stop.Store(stop)
	p.version.Store(version)
	p.commanded.Store(true)
}

func (p *setProxy) round() {
	for _, m := range p.Members() {
		if m.Meta.Role != membership.RoleReplica || m.Status != membership.StatusAlive {
			continue
		}
		if stop := p.stop.Load(); p.commanded.Load() && m.Meta.Set == "orders" && m.Meta.SetStopped != stop {
			cmd := membership.SetStop{Set: "orders", Stop: stop, Version: p.version.Load(), By: p.Name()}
			if p.Send(m.Node, cmd.Encode()) == nil {
				p.commands.Add(1)
			}
			// Take the node's lock at once, as fakeProxy does: it orders
			// Send's reads before the gossip update the command triggers.
			_ = p.Members()
		}
		var rep membership.DrainReport
		switch m.Meta.State {
		case balancer.StateDraining:
			rep = membership.DrainReport{DrainingSeen: true, Inflight: p.inflight.Load()}
		case balancer.StateStopped:
			rep = membership.DrainReport{DrainingSeen: true, StoppedSeen: true}
		default:
			continue
		}
		rep.Set, rep.Replica, rep.Boot = m.Meta.Set, m.Meta.Replica, m.Meta.Boot
		_ = p.Send(m.Node, rep.Encode())
		_ = p.Members()
	}
}

// sees reports whether the proxy sees the agent node alive in state with
// the SetStopped flag setStopped.
func (p *setProxy) sees(node string, state balancer.State, setStopped bool) func() bool {
	return func() bool {
		m, ok := p.member(node)
		return ok && m.Status == membership.StatusAlive && m.Meta.State == state && m.Meta.SetStopped == setStopped
	}
}

// send sends one set command from the proxy.
func (p *setProxy) send(t *testing.T, to string, stop bool, version uint64) {
	t.Helper()
	cmd := membership.SetStop{Set: "orders", Stop: stop, Version: version, By: p.Name()}
	if err := p.Send(to, cmd.Encode()); err != nil {
		t.Fatal(err)
	}
	_ = p.Members()
}

// logged counts the agent's log entries with this message.
func (r *running) logged(msg string) int { return r.logs.FilterMessage(msg).Len() }

// running reports whether Run has not returned.
func (r *running) running() bool {
	select {
	case err := <-r.done:
		r.done <- err
		return false
	default:
		return true
	}
}

// wantTransitions fails unless the agent's transitions are exactly want.
func wantTransitions(t *testing.T, r *running, want ...string) {
	t.Helper()
	if got := transitions(r.logs); !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
}

// A set stop drains a supervised replica as a shutdown does (draining and
// SetStopped at once, until the proxy reports nothing in flight), then
// stops its process (SIGTERM, not restarted, no budget used, not failed)
// and advertises stopped, while the agent keeps running. A set start runs
// a fresh process, which the probes make ready.
func TestSetStopSupervised(t *testing.T) {
	p := startSetProxy(t)
	rep := startReplica(t, "ok")
	cs := &children{exitOnTerm: true}
	a := startSupervising(t, superviseConfig(rep.addr, p.GossipAddr()), cs)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))

	p.inflight.Store(2)
	p.want(true, 1)
	poll.Until(t, 10*time.Second, "the proxy to see the agent draining, set stopped", p.sees(a.Name(), balancer.StateDraining, true))
	if !a.SetStopped() {
		t.Fatal("SetStopped() false after a stop command")
	}
	poll.Until(t, 10*time.Second, "5 accepted reports", func() bool {
		return metric(t, a.reg, "keyway_agent_drain_reports_total", "result", "accepted") >= 5
	})
	if s := a.State(); s != balancer.StateDraining || len(cs.last().signals()) != 0 {
		t.Fatalf("while the proxy has 2 in flight: state %s, signals %v; want draining and none", s, cs.last().signals())
	}
	if code, _ := get(t, a.base+"/readyz"); code != 503 {
		t.Fatalf("/readyz while draining for the set stop: %d, want 503", code)
	}

	p.inflight.Store(0)
	poll.Until(t, 10*time.Second, "the proxy to see the agent stopped, set stopped", p.sees(a.Name(), balancer.StateStopped, true))
	if s := cs.last().signals(); !slices.Equal(s, []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("signals to the process: %v, want [SIGTERM]", s)
	}
	// The agent stays: probing, listening, in gossip, and the process is
	// not started again however long it stays stopped.
	probes := rep.requests.Load()
	poll.Until(t, 10*time.Second, "probes to go on while stopped", func() bool { return rep.requests.Load() >= probes+5 })
	if s := a.State(); s != balancer.StateStopped || cs.count() != 1 || !a.running() {
		t.Fatalf("while stopped with passing probes: state %s, %d starts, running %v; want stopped, 1, true", s, cs.count(), a.running())
	}
	if code, _ := get(t, a.base+"/healthz"); code != 200 {
		t.Fatalf("/healthz while set stopped: %d", code)
	}
	for name, want := range map[string]float64{
		"keyway_agent_child_restarts_total": 0, "keyway_agent_child_gave_up_total": 0, "keyway_agent_child_running": 0,
	} {
		if v := testutilValue(t, a.reg, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if v := metric(t, a.reg, "keyway_agent_child_exits_total", "reason", "stop"); v != 1 {
		t.Errorf("exits by stop: %v, want 1", v)
	}
	if v := metric(t, a.reg, "keyway_agent_set_commands_total", "command", "stop"); v != 1 {
		t.Errorf("set stop commands applied: %v, want 1", v)
	}
	stopped := a.logs.FilterMessage("replica stopped: its set is stopped").All()
	if len(stopped) != 1 || stopped[0].ContextMap()["drain_took"] == nil {
		t.Fatalf("stopped log lines: %+v", stopped)
	}
	// In order: drained, then the process stopped, then stopped advertised.
	var order []string
	for _, e := range a.logs.All() {
		switch e.Message {
		case "replica drained for the set stop", "stopping replica process", "replica process exited":
			order = append(order, e.Message)
		case "replica state changed":
			if e.ContextMap()["to"] == "stopped" {
				order = append(order, "stopped")
			}
		}
	}
	if w := []string{"replica drained for the set stop", "stopping replica process", "replica process exited", "stopped"}; !slices.Equal(order, w) {
		t.Fatalf("order %v, want %v", order, w)
	}

	p.want(false, 2)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready again, not set stopped", p.sees(a.Name(), balancer.StateReady, false))
	if a.SetStopped() {
		t.Fatal("SetStopped() true after a start command")
	}
	if cs.count() != 2 || len(cs.last().signals()) != 0 {
		t.Fatalf("%d starts, signals to the new process %v; want 2 and none", cs.count(), cs.last().signals())
	}
	if v := metric(t, a.reg, "keyway_agent_set_commands_total", "command", "start"); v != 1 {
		t.Errorf("set start commands applied: %v, want 1", v)
	}
	if n := a.logged("replica started: its set is started"); n != 1 {
		t.Fatalf("%d started log lines, want 1", n)
	}
	// The proxy repeated its commands until the flag followed; each was
	// applied, and logged at info, once.
	if n := a.logged("set command"); n != 2 {
		t.Fatalf("%d set command log lines, want 2 (one stop, one start)", n)
	}
	wantTransitions(t, a, "starting>ready", "ready>draining", "draining>stopped", "stopped>starting", "starting>ready")

	if err := a.stop(t, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if s := cs.last().signals(); !slices.Equal(s, []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("signals to the second process at shutdown: %v, want [SIGTERM]", s)
	}
}

// Without a process the replica simply ends stopped once drained, and the
// agent keeps running and probing; a start lets the probes make it ready
// again.
func TestSetStopWithoutProcess(t *testing.T) {
	p := startSetProxy(t)
	rep := startReplica(t, "ok")
	a := startAgent(t, testConfig(rep.addr, p.GossipAddr()))
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))

	p.want(true, 7)
	poll.Until(t, 10*time.Second, "the proxy to see the agent stopped, set stopped", p.sees(a.Name(), balancer.StateStopped, true))
	probes := rep.requests.Load()
	poll.Until(t, 10*time.Second, "probes to go on while stopped", func() bool { return rep.requests.Load() >= probes+5 })
	if s := a.State(); s != balancer.StateStopped || !a.running() {
		t.Fatalf("while stopped with passing probes: state %s, running %v", s, a.running())
	}
	if n := a.logged("replica stopped: its set is stopped"); n != 1 {
		t.Fatalf("%d stopped log lines, want 1", n)
	}

	p.want(false, 8)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready again", p.sees(a.Name(), balancer.StateReady, false))
	wantTransitions(t, a, "starting>ready", "ready>draining", "draining>stopped", "stopped>starting", "starting>ready")
}

// Shutting down a set-stopped agent does not drain the replica again nor
// stop its process twice: it advertises stopped (with Remove under
// drain.remove), leaves and Run returns.
func TestSetStopShutdownWhileStopped(t *testing.T) {
	for _, supervised := range []bool{false, true} {
		name := "without a process"
		if supervised {
			name = "supervised"
		}
		t.Run(name, func(t *testing.T) {
			p := startSetProxy(t)
			rep := startReplica(t, "ok")
			cfg := testConfig(rep.addr, p.GossipAddr())
			cs := &children{exitOnTerm: true}
			var a *running
			if supervised {
				cfg = superviseConfig(rep.addr, p.GossipAddr())
				cfg.Drain.Remove = true
				a = startSupervising(t, cfg, cs)
			} else {
				a = startAgent(t, cfg)
			}
			poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
			p.want(true, 1)
			poll.Until(t, 10*time.Second, "the proxy to see the agent stopped", p.sees(a.Name(), balancer.StateStopped, true))

			p.inflight.Store(5) // a drain now would wait for drain.timeout (10s)
			if err := a.stop(t, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if n := a.logged("replica already stopped (its set is stopped); nothing to drain"); n != 1 {
				t.Fatalf("%d 'already stopped' log lines, want 1", n)
			}
			wantTransitions(t, a, "starting>ready", "ready>draining", "draining>stopped")
			poll.Until(t, 10*time.Second, "the proxy to see the agent leave", func() bool {
				m, ok := p.member(a.Name())
				return ok && m.Status == membership.StatusLeft
			})
			m, _ := p.member(a.Name())
			if m.Meta.Remove != cfg.Drain.Remove {
				t.Fatalf("Remove %v at the leave, want drain.remove %v", m.Meta.Remove, cfg.Drain.Remove)
			}
			if supervised {
				if cs.count() != 1 || !slices.Equal(cs.last().signals(), []syscall.Signal{syscall.SIGTERM}) {
					t.Fatalf("%d starts, signals %v; want 1 and one SIGTERM", cs.count(), cs.last().signals())
				}
				if v := metric(t, a.reg, "keyway_agent_child_exits_total", "reason", "stop"); v != 1 {
					t.Fatalf("exits by stop: %v, want 1", v)
				}
			}
		})
	}
}

// Shutting down while a set stop still drains: the shutdown's drain takes
// it over, waits for the proxy, stops the process once, and Run returns.
func TestSetStopShutdownWhileDraining(t *testing.T) {
	p := startSetProxy(t)
	rep := startReplica(t, "ok")
	cs := &children{exitOnTerm: true}
	a := startSupervising(t, superviseConfig(rep.addr, p.GossipAddr()), cs)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
	p.inflight.Store(1)
	p.want(true, 1)
	poll.Until(t, 10*time.Second, "the proxy to see the agent draining", p.sees(a.Name(), balancer.StateDraining, true))

	a.cancel()
	poll.Until(t, 10*time.Second, "the shutdown drain to collect reports", func() bool {
		return metric(t, a.reg, "keyway_agent_drain_reports_total", "result", "accepted") >= 8
	})
	if !a.running() || len(cs.last().signals()) != 0 {
		t.Fatalf("with 1 in flight: running %v, signals %v; want running and none", a.running(), cs.last().signals())
	}
	p.inflight.Store(0)
	if err := a.stop(t, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if cs.count() != 1 || !slices.Equal(cs.last().signals(), []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("%d starts, signals %v; want 1 and one SIGTERM", cs.count(), cs.last().signals())
	}
	wantTransitions(t, a, "starting>ready", "ready>draining", "draining>stopped")
	if n := a.logged("replica drained"); n != 1 {
		t.Fatalf("%d shutdown drains completed, want 1", n)
	}
}

// A start while the stop still waits for the proxies, or for the drain
// probe, abandons it: the process that runs is kept (never signalled), and
// the probes make the replica ready again.
func TestSetStartWhileDraining(t *testing.T) {
	for _, phase := range []string{"reports", "drain probe"} {
		t.Run(phase, func(t *testing.T) {
			p := startSetProxy(t)
			rep := startReplica(t, "ok")
			cs := &children{exitOnTerm: true}
			cfg := superviseConfig(rep.addr, p.GossipAddr())
			if phase == "drain probe" {
				cfg.Drain.ProbePath, cfg.Drain.ProbeTimeout = "/drained", time.Hour
			}
			a := startSupervising(t, cfg, cs)
			poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
			p.inflight.Store(3)
			p.want(true, 1)
			poll.Until(t, 10*time.Second, "the proxy to see the agent draining", p.sees(a.Name(), balancer.StateDraining, true))
			poll.Until(t, 10*time.Second, "5 accepted reports", func() bool {
				return metric(t, a.reg, "keyway_agent_drain_reports_total", "result", "accepted") >= 5
			})
			if phase == "drain probe" {
				// The replica still has work of its own: the stop waits
				// for it after the proxies' reports.
				rep.mode.Store("fail")
				p.inflight.Store(0)
				poll.Until(t, 10*time.Second, "the drain probe wait", func() bool {
					return a.logged("drain probe: waiting for the replica's own work") >= 1
				})
			}
			p.want(false, 2)
			poll.Until(t, 10*time.Second, "the agent to start again", func() bool { return a.logged("replica started: its set is started") == 1 })
			rep.mode.Store("ok")
			poll.Until(t, 10*time.Second, "the proxy to see the agent ready again", p.sees(a.Name(), balancer.StateReady, false))
			if cs.count() != 1 || len(cs.last().signals()) != 0 {
				t.Fatalf("%d starts, signals %v; want the first process, never signalled", cs.count(), cs.last().signals())
			}
			wantTransitions(t, a, "starting>ready", "ready>draining", "draining>starting", "starting>ready")
			if phase == "reports" && a.logged("set stop abandoned while draining: the set is started again") != 1 {
				t.Fatal("no log line for the abandoned stop")
			}

			// Stopped again, it goes all the way.
			p.inflight.Store(0)
			p.want(true, 3)
			poll.Until(t, 10*time.Second, "the proxy to see the agent stopped", p.sees(a.Name(), balancer.StateStopped, true))
			if cs.count() != 1 || !slices.Equal(cs.last().signals(), []syscall.Signal{syscall.SIGTERM}) {
				t.Fatalf("%d starts, signals %v; want 1 and [SIGTERM]", cs.count(), cs.last().signals())
			}
		})
	}
}

// A command older than the newest applied is ignored (also long after,
// and also version 0 from proxies restarted without a state directory), a
// newer one is applied (an operator write after every proxy restarted), a
// repeat of the current mode changes nothing, a command for another set
// is ignored, and one from a member that is not a proxy is rejected and
// counted.
func TestSetStopCommandChecks(t *testing.T) {
	p := startSetProxy(t) // commands only through send
	rep := startReplica(t, "ok")
	a := startAgent(t, testConfig(rep.addr, p.GossipAddr()))
	other := startNode(t, membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "orders-1", Addr: "127.0.0.1:1", State: balancer.StateReady}, p.GossipAddr())
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
	poll.Until(t, 10*time.Second, "the agent to see the other replica", func() bool { return aliveReplicas(t, a.reg) == 2 })

	// From a replica: rejected.
	cmd := membership.SetStop{Set: "orders", Stop: true, Version: 9, By: other.Name()}
	if err := other.Send(a.Name(), cmd.Encode()); err != nil {
		t.Fatal(err)
	}
	_ = other.Members()
	// Counted, then logged: wait for both.
	warned := func() int {
		return a.logs.FilterMessageSnippet("gossip: refused").FilterField(zap.String("from", other.Name())).FilterField(zap.String("what", "set_stop")).Len()
	}
	poll.Until(t, 10*time.Second, "the command to be counted and logged as rejected", func() bool {
		return metric(t, a.reg, "keyway_gossip_rejected_total", "reason", "not_proxy") == 1 && warned() > 0
	})
	if warned() != 1 || a.SetStopped() {
		t.Fatalf("%d rejection warnings, SetStopped %v; want 1, false", warned(), a.SetStopped())
	}

	// For another set: ignored. Then the proxy's stop, three times.
	cmd = membership.SetStop{Set: "payments", Stop: true, Version: 10, By: p.Name()}
	if err := p.Send(a.Name(), cmd.Encode()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		p.send(t, a.Name(), true, 5)
	}
	poll.Until(t, 10*time.Second, "the proxy to see the agent stopped", p.sees(a.Name(), balancer.StateStopped, true))
	if v := metric(t, a.reg, "keyway_agent_set_commands_total", "command", "stop"); v != 1 {
		t.Fatalf("stop commands applied: %v, want 1", v)
	}

	// An older start (a proxy that has not learnt the stop): ignored.
	p.send(t, a.Name(), false, 4)
	poll.Until(t, 10*time.Second, "the older command to be logged", func() bool {
		return a.logs.FilterMessage("older set stop command ignored").FilterField(zap.Uint64("version", 4)).Len() == 1
	})
	if !a.SetStopped() || a.State() != balancer.StateStopped {
		t.Fatalf("after an older start: SetStopped %v, state %s; want true, stopped", a.SetStopped(), a.State())
	}
	if v := metric(t, a.reg, "keyway_agent_set_commands_total", "command", "start"); v != 0 {
		t.Fatalf("start commands applied: %v, want 0", v)
	}
	if n := a.logged("set command"); n != 1 {
		t.Fatalf("%d set command log lines, want 1", n)
	}

	// The current version (or newer) starts it.
	p.send(t, a.Name(), false, 5)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
	if v := metric(t, a.reg, "keyway_agent_set_commands_total", "command", "start"); v != 1 {
		t.Fatalf("start commands applied: %v, want 1", v)
	}

	// Every proxy restarts without runtime.state_dir: a new proxy, with no
	// run-time record of the set, sends what its file says, as version 0.
	// Older than what the agent applied: ignored, however long after.
	fresh := startSetProxy(t, p.GossipAddr())
	poll.Until(t, 10*time.Second, "the new proxy to see the agent", fresh.sees(a.Name(), balancer.StateReady, false))
	poll.Until(t, 10*time.Second, "the agent to see the new proxy", func() bool { return aliveMembers(t, a.reg, "proxy") == 2 })
	fresh.send(t, a.Name(), true, 0)
	poll.Until(t, 10*time.Second, "the version 0 command to be logged", func() bool {
		return a.logs.FilterMessage("older set stop command ignored").FilterField(zap.Uint64("version", 0)).Len() == 1
	})
	if a.SetStopped() {
		t.Fatal("a version 0 stop was applied after version 5")
	}
	// An operator's next write there takes a version from the wall clock
	// (package runstate), newer than anything written before: applied.
	hlc := uint64(time.Now().UnixMilli()) << 16
	fresh.send(t, a.Name(), true, hlc)
	poll.Until(t, 10*time.Second, "the new proxy to see the agent stopped", fresh.sees(a.Name(), balancer.StateStopped, true))
	if v := metric(t, a.reg, "keyway_agent_set_commands_total", "command", "stop"); v != 2 {
		t.Fatalf("stop commands applied: %v, want 2", v)
	}
	// And the old proxy's version 5, were it still around, is older.
	p.send(t, a.Name(), false, 5)
	poll.Until(t, 10*time.Second, "the older command to be logged", func() bool {
		return a.logs.FilterMessage("older set stop command ignored").FilterField(zap.Uint64("version", 5)).Len() == 1
	})
	if !a.SetStopped() {
		t.Fatal("version 5 applied after a newer one")
	}
}

// An operator drain still wins: a held replica started again advertises
// draining (with Held) until undrained.
func TestSetStartWhileHeld(t *testing.T) {
	p := startSetProxy(t)
	rep := startReplica(t, "ok")
	a := startAgent(t, testConfig(rep.addr, p.GossipAddr()))
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
	p.want(true, 1)
	poll.Until(t, 10*time.Second, "the proxy to see the agent stopped", p.sees(a.Name(), balancer.StateStopped, true))
	hold := func(drain bool) {
		cmd := membership.AdminDrain{Set: "orders", Replica: "orders-0", Drain: drain, By: p.Name()}
		if err := p.Send(a.Name(), cmd.Encode()); err != nil {
			t.Fatal(err)
		}
		_ = p.Members()
	}
	hold(true)
	poll.Until(t, 10*time.Second, "the proxy to see the Held flag on the stopped replica", func() bool {
		m, _ := p.member(a.Name())
		return m.Meta.Held && m.Meta.State == balancer.StateStopped
	})
	p.want(false, 2)
	poll.Until(t, 10*time.Second, "the proxy to see the agent started, held draining", p.sees(a.Name(), balancer.StateDraining, false))
	probes := rep.requests.Load()
	poll.Until(t, 10*time.Second, "probes to go on", func() bool { return rep.requests.Load() >= probes+5 })
	if s := a.State(); s != balancer.StateDraining {
		t.Fatalf("held with passing probes after the start: %s, want draining", s)
	}
	hold(false)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
}

// Shutting down while the set stop is stopping the process (it ignores
// SIGTERM, so the stop waits supervise.stop_grace): the shutdown waits for
// that stop instead of signalling the process again, then leaves.
func TestSetStopShutdownWhileStoppingProcess(t *testing.T) {
	p := startSetProxy(t)
	rep := startReplica(t, "ok")
	cfg := superviseConfig(rep.addr, p.GossipAddr())
	cfg.Supervise.StopGrace = 300 * time.Millisecond
	var a *running
	var terms atomic.Int64
	cs := &children{onSignal: func(sig syscall.Signal) {
		if sig == syscall.SIGTERM && terms.Add(1) == 1 {
			a.cancel() // SIGTERM to the agent while it stops its replica
		}
	}}
	a = startSupervising(t, cfg, cs)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
	p.want(true, 1)
	poll.Until(t, 20*time.Second, "Run to return after the SIGTERM during the process stop", func() bool { return !a.running() })
	if err := <-a.done; err != nil {
		t.Fatal(err)
	}
	a.done <- nil // for the cleanup
	if s := cs.last().signals(); cs.count() != 1 || !slices.Equal(s, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}) {
		t.Fatalf("%d starts, signals %v; want 1 and [SIGTERM SIGKILL]", cs.count(), s)
	}
	wantTransitions(t, a, "starting>ready", "ready>draining", "draining>stopped")
	if n := a.logged("replica already stopped (its set is stopped); nothing to drain"); n != 1 {
		t.Fatalf("%d 'already stopped' log lines, want 1", n)
	}
}

// A replica whose process the supervisor gave up on (failed) can be set
// stopped, and a set start runs it again with a fresh restart budget.
func TestSetStopAfterGiveUp(t *testing.T) {
	p := startSetProxy(t)
	rep := startReplica(t, "ok")
	cs := &children{exitOnTerm: true}
	a := startSupervising(t, superviseConfig(rep.addr, p.GossipAddr()), cs) // max_restarts 2
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
	for i := 1; i <= 3; i++ {
		cs.last().exit(agent.Exit{Code: 1})
		if i < 3 {
			poll.Until(t, 10*time.Second, "a restart", func() bool { return cs.count() == i+1 })
		}
	}
	poll.Until(t, 10*time.Second, "the proxy to see the agent failed", p.sees(a.Name(), balancer.StateFailed, false))

	p.want(true, 1)
	poll.Until(t, 10*time.Second, "the proxy to see the agent stopped", p.sees(a.Name(), balancer.StateStopped, true))
	p.want(false, 2)
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
	if cs.count() != 4 {
		t.Fatalf("%d starts, want 4 (3, then one for the set start)", cs.count())
	}
	// A fresh budget: one more exit is restarted, not given up on.
	cs.last().exit(agent.Exit{Code: 1})
	poll.Until(t, 10*time.Second, "a restart after the set start", func() bool { return cs.count() == 5 })
	poll.Until(t, 10*time.Second, "the proxy to see the agent ready", p.sees(a.Name(), balancer.StateReady, false))
}
