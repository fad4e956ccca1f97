package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"keyway/admin"
	"keyway/balancer"
	"keyway/eventlog"
)

var _ admin.Restarter = (*view)(nil)

// restarts are the rolling restarts this proxy runs or ran, by set.
type restarts struct {
	mu   sync.Mutex
	runs map[string]*admin.RestartStatus // guarded by mu; copied out
	wg   sync.WaitGroup                  // running restarts (Run waits for them)
}

// StartRestart begins a rolling restart of a set: its gossip replicas, one
// at a time in name order, are drained on every proxy (an operator drain
// through the agent), restarted by their agents once nothing is in flight
// to them, and undrained once their new process has started; the next one
// starts when the previous one is back in rotation. It stops at the first
// step that does not complete within stepTimeout, undraining that replica.
func (v *view) StartRestart(set string, stepTimeout time.Duration) (admin.RestartStatus, error) {
	n := v.n
	r := n.p.Router(set)
	if r == nil {
		return admin.RestartStatus{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	if n.disc == nil {
		return admin.RestartStatus{}, fmt.Errorf("%w: gossip is off on this proxy: a rolling restart needs the replicas' agents", admin.ErrUnreachable)
	}
	ctx := n.runContext()
	if ctx == nil {
		return admin.RestartStatus{}, errors.New("the proxy is not running")
	}
	var names []string
	for _, m := range r.Table().Members() {
		if m.Source == "gossip" && m.Slot >= 0 {
			names = append(names, m.Name)
		}
	}
	if len(names) == 0 {
		return admin.RestartStatus{}, fmt.Errorf("%w: no replica of %s is advertised by an agent", admin.ErrUnreachable, set)
	}
	n.restarts.mu.Lock()
	defer n.restarts.mu.Unlock()
	if cur := n.restarts.runs[set]; cur != nil && cur.State == "running" {
		return admin.RestartStatus{}, fmt.Errorf("%w (started %s)", admin.ErrRestartRunning, cur.Started.Format(time.RFC3339))
	}
	st := &admin.RestartStatus{Set: set, State: "running", Replicas: names, StepTimeout: stepTimeout.String(), Started: time.Now(), Steps: []admin.RestartStep{}}
	if n.restarts.runs == nil {
		n.restarts.runs = map[string]*admin.RestartStatus{}
	}
	n.restarts.runs[set] = st
	n.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{"action": "restart", "replicas": names, "scope": admin.ScopeGossip})
	n.restarts.wg.Go(func() { n.rollingRestart(ctx, set, names, stepTimeout) })
	return copyStatus(st), nil
}

// RestartStatus returns the set's last rolling restart on this proxy.
func (v *view) RestartStatus(set string) (admin.RestartStatus, bool) {
	v.n.restarts.mu.Lock()
	defer v.n.restarts.mu.Unlock()
	st := v.n.restarts.runs[set]
	if st == nil {
		return admin.RestartStatus{}, false
	}
	return copyStatus(st), true
}

func copyStatus(st *admin.RestartStatus) admin.RestartStatus {
	c := *st
	c.Steps = slices.Clone(st.Steps)
	return c
}

// rollingRestart runs a restart's steps; see StartRestart.
func (n *ProxyNode) rollingRestart(ctx context.Context, set string, names []string, stepTimeout time.Duration) {
	log := n.log.Named("restart").With(zap.String("set", set))
	step := func(replica, what, detail string) {
		n.restarts.mu.Lock()
		st := n.restarts.runs[set]
		st.Current = replica
		st.Steps = append(st.Steps, admin.RestartStep{Time: time.Now(), Replica: replica, Step: what, Detail: detail})
		n.restarts.mu.Unlock()
		log.Info("rolling restart step", zap.String("replica", replica), zap.String("step", what), zap.String("detail", detail))
	}
	finish := func(state, errText string) {
		n.restarts.mu.Lock()
		st := n.restarts.runs[set]
		st.State, st.Error, st.Current, st.Finished = state, errText, "", time.Now()
		n.restarts.mu.Unlock()
		fields := map[string]any{"action": "restart", "result": state, "scope": admin.ScopeGossip}
		if errText != "" {
			fields["error"] = errText
			log.Error("rolling restart stopped", zap.String("state", state), zap.String("error", errText))
		} else {
			log.Info("rolling restart done")
		}
		n.audit.Record(eventlog.KindAdminAction, set, "", fields)
	}
	// wait polls cond every 100ms until it holds, the step times out or
	// the proxy stops.
	wait := func(cond func() bool) error {
		deadline := time.Now().Add(stepTimeout)
		for !cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("not within %s", stepTimeout)
			}
			select {
			case <-ctx.Done():
				return errors.New("interrupted: this proxy is stopping")
			case <-time.After(100 * time.Millisecond):
			}
		}
		return nil
	}
	member := func(name string) (balancer.Member, bool) {
		for _, m := range n.p.Router(set).Table().Members() {
			if m.Name == name {
				return m, true
			}
		}
		return balancer.Member{}, false
	}
	for _, name := range names {
		fail := func(what string, err error) {
			step(name, "failed", what+": "+err.Error())
			_ = n.disc.Drain(set, name, false)
			state := "failed"
			if ctx.Err() != nil {
				state = "interrupted"
			}
			finish(state, fmt.Sprintf("%s %s: %v", name, what, err))
		}
		step(name, "drain", "")
		if err := n.disc.Drain(set, name, true); err != nil {
			fail("drain", err)
			return
		}
		// Drained: out of rotation here, every other proxy has said since
		// then that it routes the set like this one (so it has the replica
		// out too) and that it has nothing in flight to it, and neither
		// has this one.
		var outSince time.Time
		if err := wait(func() bool {
			inflight, out, ok := n.p.ReplicaLoad(set, name)
			if !ok || !out {
				return false
			}
			if outSince.IsZero() {
				outSince = time.Now()
			}
			for _, p := range n.fleet.Peers() {
				if p.Heard.Before(outSince) {
					return false
				}
			}
			for _, fs := range n.p.FleetStatus() {
				for _, p := range fs.Peers {
					if fs.Set == set && !p.Agrees {
						return false
					}
				}
			}
			others, _ := n.p.FleetInflight(set)
			return inflight == 0 && others[name] == 0
		}); err != nil {
			fail("drained", err)
			return
		}
		step(name, "drained", "out of rotation and nothing in flight on every proxy")
		since := time.Now()
		step(name, "restart", "")
		if err := n.disc.RestartReplica(set, name); err != nil {
			fail("restart", err)
			return
		}
		if err := wait(func() bool { return n.processStarted(set, name, since) }); err != nil {
			fail("started", err)
			return
		}
		step(name, "started", "the agent started a new process")
		step(name, "undrain", "")
		if err := n.disc.Drain(set, name, false); err != nil {
			fail("undrain", err)
			return
		}
		if err := wait(func() bool {
			m, ok := member(name)
			return ok && m.State == balancer.StateReady && m.InRotation
		}); err != nil {
			fail("ready", err)
			return
		}
		step(name, "ready", "back in rotation")
	}
	finish("done", "")
}

// processStarted reports whether the replica's agent reported a process
// start (a replica_process event in the audit trail) since t.
func (n *ProxyNode) processStarted(set, name string, since time.Time) bool {
	for _, e := range n.audit.Recent(since, []string{eventlog.KindReplicaProcess}, 0) {
		if e.Set == set && e.Replica == name && e.Fields["event"] == "start" {
			return true
		}
	}
	return false
}

// runContext is Run's context for work started while the node runs (a
// rolling restart), or nil when the node is not running.
func (n *ProxyNode) runContext() context.Context {
	n.runMu.Lock()
	defer n.runMu.Unlock()
	return n.runCtx
}

func (n *ProxyNode) setRunContext(ctx context.Context) {
	n.runMu.Lock()
	n.runCtx = ctx
	n.runMu.Unlock()
}
