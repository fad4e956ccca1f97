package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"keyway/admin"
	"keyway/balancer"
	"keyway/eventlog"
	"keyway/health"
	"keyway/kube/backend"
	"keyway/membership"
	"keyway/runstate"
)

var _ admin.Restarter = (*view)(nil)

// Rolling restarts are fleet-wide: the proxy that runs one (its owner,
// named by its fleet ID) writes its progress after every step as a
// run-time record (kind runstate.KindRestart), so every proxy shows
// it and only one runs per set. If the owner leaves the fleet mid-way (it
// crashed, or stopped while other proxies run: no alive process carries
// its ID any more), the alive proxy with the lowest ID takes it over
// (checkRestarts) and continues with the replica it was at, from its
// drain: that replica may get one more restart. A binary upgrade of the
// owner hands nothing over: the old process stops running the restart
// when it drains, and the new one, with the same ID, resumes it once the
// old one has left. The record names the process that runs it
// (OwnerNode), so that exactly one process writes its steps.

// restarts tracks the rolling restarts this process runs.
type restarts struct {
	wg      sync.WaitGroup // running restarts (Run waits for them)
	mu      sync.Mutex
	running map[string]bool // sets whose restart runs in this process
}

// claim marks set's restart as running in this process; false when it
// already is.
func (r *restarts) claim(set string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[set] {
		return false
	}
	if r.running == nil {
		r.running = map[string]bool{}
	}
	r.running[set] = true
	return true
}

func (r *restarts) release(set string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running, set)
}

// goRestart runs a claimed restart from st until it ends, then releases
// the claim.
func (n *ProxyNode) goRestart(ctx context.Context, set string, st admin.RestartStatus) {
	n.restarts.wg.Go(func() {
		defer n.restarts.release(set)
		n.rollingRestart(ctx, set, st)
	})
}

// maxRestartSteps bounds the steps a restart's record keeps (the oldest
// go first): the record travels to every proxy after every step.
const maxRestartSteps = 200

// errHandedOver stops a restart whose record another proxy has taken
// over.
var errHandedOver = errors.New("another proxy has taken the restart over")

// restartStatus decodes a set's restart record.
func (n *ProxyNode) restartStatus(set string) (admin.RestartStatus, bool) {
	rec, ok := n.rt.Get(runstate.KindRestart, set)
	if !ok || len(rec.Restart) == 0 {
		return admin.RestartStatus{}, false
	}
	var st admin.RestartStatus
	if err := json.Unmarshal(rec.Restart, &st); err != nil {
		return admin.RestartStatus{}, false
	}
	return st, true
}

// updateRestart changes a set's restart record with mutate, under the
// run-time state's write lock: mutate sees the record as it is now (ok
// false when there is none) and may refuse with an error.
//
// A change of who runs the restart (a start, a resume, a takeover) passes
// confirm: it answers once the fleet holds the record, as an operator's
// write does (runstate.State.Write), so that of two proxies taking a
// restart at once the one whose record loses the merge learns it
// (errHandedOver) and does not run it too. A progress step does not wait.
func (n *ProxyNode) updateRestart(confirm context.Context, set, by string, mutate func(st *admin.RestartStatus, ok bool) error) (admin.RestartStatus, error) {
	var out admin.RestartStatus
	write := n.rt.Update
	if confirm != nil {
		write = func(kind runstate.Kind, set string, f func(runstate.Record, bool) (runstate.Record, error)) (runstate.Record, error) {
			return n.rt.Write(confirm, kind, set, nil, f)
		}
	}
	_, err := write(runstate.KindRestart, set, func(cur runstate.Record, ok bool) (runstate.Record, error) {
		var st admin.RestartStatus
		ok = ok && len(cur.Restart) > 0 && json.Unmarshal(cur.Restart, &st) == nil
		if err := mutate(&st, ok); err != nil {
			return cur, err
		}
		if len(st.Steps) > maxRestartSteps {
			st.Steps = slices.Clone(st.Steps[len(st.Steps)-maxRestartSteps:])
		}
		b, err := json.Marshal(st)
		if err != nil {
			return cur, err
		}
		out = st
		return runstate.Record{Restart: b, Action: "restart", By: cmp.Or(by, cur.By), Via: n.via()}, nil
	})
	return out, err
}

// aliveProxies returns the distinct fleet IDs of the alive proxies, this
// one included, sorted.
func (n *ProxyNode) aliveProxies() []string {
	var out []string
	for _, m := range n.node.Members() {
		if m.Meta.Role == membership.RoleProxy && m.Status == membership.StatusAlive {
			out = append(out, m.ID())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// processes describes the other alive proxy processes: how many there
// are, how many of them carry this proxy's ID (its other process, during
// a binary upgrade), and whether this process has the newest boot of its
// ID.
func (n *ProxyNode) processes() (others, twins int, newest bool) {
	self, boot := n.node.ID(), n.node.Meta().Boot
	newest = true
	for _, m := range n.node.Members() {
		if m.Meta.Role != membership.RoleProxy || m.Status != membership.StatusAlive || m.Self {
			continue
		}
		others++
		if m.ID() == self {
			twins++
			newest = newest && m.Meta.Boot < boot
		}
	}
	return others, twins, newest
}

// StartRestart begins a rolling restart of a set: its gossip replicas, one
// at a time in name order, are drained on every proxy (an operator drain
// through the agent), restarted by their agents once nothing is in flight
// to them (with opts.Force, once out of rotation on this proxy), and
// undrained once their new process has started. A replica of a set on a
// StatefulSet whose agent supervises no process is restarted by deleting
// its pod: the step ends once the pod's new agent joined. The next one starts when
// the previous one is back in rotation. It stops at the first step that
// does not complete within opts.StepTimeout, undraining that replica. One
// restart of a set runs at a time in the whole fleet.
//
// It refuses at once (*admin.RefusedError) when a replica's agent could
// not restart it: it supervises no process, or no agent of it is alive.
func (v *view) StartRestart(set string, opts admin.RestartOptions, who admin.Actor) (admin.RestartStatus, error) {
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
	jobs := n.jobNames(set)
	for _, m := range r.Table().Members() {
		if m.Source == "gossip" && m.Slot >= 0 && (jobs == nil || jobs[m.Name]) {
			names = append(names, m.Name)
		}
	}
	if len(names) == 0 {
		return admin.RestartStatus{}, fmt.Errorf("%w: no replica of %s is advertised by an agent", admin.ErrUnreachable, set)
	}
	if err := n.restartRefusal(set, names); err != nil {
		return admin.RestartStatus{}, err
	}
	self, node := n.node.ID(), n.node.Name()
	alive := n.aliveProxies()
	if !n.restarts.claim(set) {
		return admin.RestartStatus{}, fmt.Errorf("%w (run by this proxy)", admin.ErrRestartRunning)
	}
	st, err := n.updateRestart(ctx, set, who.String(), func(st *admin.RestartStatus, ok bool) error {
		if ok && st.State == "running" && slices.Contains(alive, st.Owner) {
			return fmt.Errorf("%w (started %s, run by %s)", admin.ErrRestartRunning, st.Started.Format(time.RFC3339), st.Owner)
		}
		*st = admin.RestartStatus{Set: set, State: "running", Owner: self, OwnerNode: node, By: who.String(), Replicas: names,
			StepTimeout: opts.StepTimeout.String(), Force: opts.Force, Started: time.Now(), Steps: []admin.RestartStep{}}
		return nil
	})
	if err != nil {
		n.restarts.release(set)
		return admin.RestartStatus{}, writeError(err)
	}
	fields := map[string]any{"action": "restart", "replicas": names, "scope": admin.ScopeFleet, "by": who.String()}
	if opts.Force {
		fields["force"] = true
	}
	n.audit.Record(eventlog.KindAdminAction, set, "", fields)
	n.goRestart(ctx, set, st)
	return st, nil
}

// agentMetas returns the metadata of the newest alive agent of each
// replica of set that has one, by replica name.
func (n *ProxyNode) agentMetas(set string) map[string]membership.Meta {
	out := map[string]membership.Meta{}
	for _, m := range n.node.Members() {
		if m.Meta.Role != membership.RoleReplica || m.Meta.Set != set || m.Status != membership.StatusAlive {
			continue
		}
		if cur, ok := out[m.Meta.Replica]; !ok || m.Meta.Boot > cur.Boot {
			out[m.Meta.Replica] = m.Meta
		}
	}
	return out
}

// unsupervised reports whether an agent says that it supervises no
// process (an agent too old to say is given the benefit of the doubt).
func unsupervised(m membership.Meta) bool { return m.SupervisionKnown && !m.Supervised }

// restartRefusal returns why the agents of names could not restart them,
// or nil: agents that supervise no process (run without `-- CMD`), and
// replicas no alive agent advertises.
func (n *ProxyNode) restartRefusal(set string, names []string) error {
	metas := n.agentMetas(set)
	var bare, gone []string
	for _, name := range names {
		m, ok := metas[name]
		switch {
		case !ok:
			gone = append(gone, name)
		case unsupervised(m):
			if _, ok := n.restartsByPod(set, name); !ok {
				bare = append(bare, name)
			}
		}
	}
	if len(bare) == 0 && len(gone) == 0 {
		return nil
	}
	var reasons, fixes []string
	if len(bare) > 0 {
		reasons = append(reasons, withoutCommand(bare))
		fixes = append(fixes, plural(bare, "restart the replica yourself, or run its agent with -- CMD", "restart the replicas yourself, or run the agents with -- CMD"))
	}
	if len(gone) > 0 {
		reasons = append(reasons, plural(gone, strings.Join(gone, ", ")+" has no live agent in gossip, so keyway cannot restart it",
			strings.Join(gone, ", ")+" have no live agent in gossip, so keyway cannot restart them"))
		fixes = append(fixes, plural(gone, "start its agent and wait until it is ready", "start their agents and wait until they are ready"))
	}
	return &admin.RefusedError{Action: "restart", Set: set, Replicas: slices.Sorted(slices.Values(append(bare, gone...))),
		Reason: strings.Join(reasons, "; "), Fix: strings.Join(fixes, "; ")}
}

// withoutCommand says that the replicas' agents supervise no process.
func withoutCommand(names []string) string {
	return plural(names,
		strings.Join(names, ", ")+" runs without -- CMD: its agent supervises no process, so keyway cannot restart it",
		strings.Join(names, ", ")+" run without -- CMD: their agents supervise no process, so keyway cannot restart them")
}

// plural returns one when names has one element, else many.
func plural(names []string, one, many string) string {
	if len(names) == 1 {
		return one
	}
	return many
}

// RestartStatus returns the set's last rolling restart, from the fleet's
// run-time state, with its mark as this proxy sees it (markRestart).
func (v *view) RestartStatus(set string) (admin.RestartStatus, bool) {
	st, ok := v.n.restartStatus(set)
	if !ok {
		return st, false
	}
	phase, since := v.n.phases.PhaseSince(set)
	markRestart(&st, phase, since)
	return st, true
}

// markRestart works out whether a failed or interrupted restart is still
// marked: until an operator acknowledges it, or until the set enters the
// phase Running after the failure (phase, since when).
func markRestart(st *admin.RestartStatus, phase health.Phase, since time.Time) {
	if st.State != "failed" && st.State != "interrupted" {
		return
	}
	// The failure is its "failed" step: the replica is undrained after it,
	// and Finished is written last.
	failed := st.Finished
	for _, s := range st.Steps {
		if s.Step == "failed" && (failed.IsZero() || s.Time.Before(failed)) {
			failed = s.Time
		}
	}
	switch {
	case !st.Acknowledged.IsZero():
		st.Cleared = admin.ClearedAcknowledged
	case phase == health.PhaseRunning && since.After(failed):
		st.Cleared, st.RunningSince = admin.ClearedRunning, since
	default:
		st.Mark = true
	}
}

// errAcked ends an acknowledgement that changes nothing: the restart was
// acknowledged already.
var errAcked = errors.New("acknowledged already")

// AckRestart acknowledges the set's failed or interrupted last restart:
// it writes who and when into the restart's record (which stays), so that
// no proxy marks it any more. Acknowledging it again changes nothing.
func (v *view) AckRestart(set string, who admin.Actor) (admin.RestartStatus, error) {
	n := v.n
	if n.p.Router(set) == nil {
		return admin.RestartStatus{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	var cur admin.RestartStatus
	st, err := n.updateRestart(nil, set, who.String(), func(st *admin.RestartStatus, ok bool) error {
		cur = *st
		switch {
		case !ok:
			return fmt.Errorf("%w: no rolling restart of %s has run", admin.ErrNoRestart, set)
		case st.State == "running":
			return fmt.Errorf("%w (started %s)", admin.ErrRestartRunning, st.Started.Format(time.RFC3339))
		case st.State == "done":
			return fmt.Errorf("%w: the last rolling restart of %s (finished %s) succeeded", admin.ErrNoRestart, set, st.Finished.Format(time.RFC3339))
		case !st.Acknowledged.IsZero():
			return errAcked
		}
		st.Acknowledged, st.AcknowledgedBy = time.Now(), who.String()
		return nil
	})
	switch {
	case errors.Is(err, errAcked):
		st = cur
	case err != nil:
		return cur, writeError(err)
	default:
		n.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{"action": "restart_ack", "state": st.State, "error": st.Error,
			"by": who.String(), "scope": admin.ScopeFleet})
	}
	phase, since := n.phases.PhaseSince(set)
	markRestart(&st, phase, since)
	return st, nil
}

// watchRestarts runs checkRestarts every second until ctx is done.
func (n *ProxyNode) watchRestarts(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.checkRestarts(ctx)
		}
	}
}

// checkRestarts continues the running restarts nobody runs any more:
//
//   - one whose owner is this proxy's ID, once no other alive process
//     carries the ID (the old process of an upgrade, or of a crash, is
//     gone) and this process does not run it already: resumed;
//   - one whose owner has left the fleet (no alive process carries its
//     ID), when this proxy has the lowest alive ID and this process is
//     the newest of its ID: taken over.
//
// The restarts it continues run under ctx.
func (n *ProxyNode) checkRestarts(ctx context.Context) {
	self, node := n.node.ID(), n.node.Name()
	alive := n.aliveProxies()
	_, twins, newest := n.processes()
	lowest := len(alive) > 0 && alive[0] == self && newest
	for _, rec := range n.rt.Records() {
		if rec.Kind != runstate.KindRestart {
			continue
		}
		set := rec.Set
		st, ok := n.restartStatus(set)
		if !ok || st.State != "running" || n.p.Router(set) == nil {
			continue
		}
		switch {
		case st.Owner == self && twins == 0:
			n.resumeRestart(ctx, set, node)
		case st.Owner != self && lowest && !slices.Contains(alive, st.Owner):
			n.takeOverRestart(ctx, set, self, node)
		}
	}
}

// resumeRestart continues, in this process, a restart this proxy owns
// that no process of it runs any more.
func (n *ProxyNode) resumeRestart(ctx context.Context, set, node string) {
	if !n.restarts.claim(set) {
		return // running here
	}
	var prev string
	st, err := n.updateRestart(ctx, set, "", func(st *admin.RestartStatus, ok bool) error {
		if !ok || st.State != "running" || st.Owner != n.node.ID() {
			return errHandedOver
		}
		prev = st.OwnerNode
		st.OwnerNode = node
		st.Steps = append(st.Steps, admin.RestartStep{Time: time.Now(), Replica: st.Current, Step: "resumed",
			Detail: fmt.Sprintf("this proxy's process %s continues (the one running it, %s, is gone)", node, cmp.Or(prev, "unknown"))})
		return nil
	})
	if err != nil {
		n.restarts.release(set)
		return
	}
	n.log.Named("restart").Info("rolling restart resumed: this proxy owns it and the process that ran it is gone",
		zap.String("set", set), zap.String("from", prev), zap.String("current", st.Current))
	n.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{"action": "restart_resume", "from": prev, "scope": admin.ScopeFleet})
	n.goRestart(ctx, set, st)
}

// takeOverRestart continues, in this process, a restart whose owner has
// left the fleet.
func (n *ProxyNode) takeOverRestart(ctx context.Context, set, self, node string) {
	if !n.restarts.claim(set) {
		return
	}
	var prev string
	st, err := n.updateRestart(ctx, set, "", func(st *admin.RestartStatus, ok bool) error {
		if !ok || st.State != "running" || st.Owner == self || slices.Contains(n.aliveProxies(), st.Owner) {
			return errHandedOver // someone else was quicker, or the owner is back
		}
		prev = st.Owner
		st.Owner, st.OwnerNode = self, node
		st.Steps = append(st.Steps, admin.RestartStep{Time: time.Now(), Replica: st.Current, Step: "takeover",
			Detail: fmt.Sprintf("%s left the fleet; %s continues", prev, self)})
		return nil
	})
	if err != nil {
		n.restarts.release(set)
		return
	}
	n.log.Named("restart").Warn("rolling restart taken over: the proxy running it left the fleet",
		zap.String("set", set), zap.String("from", prev), zap.String("current", st.Current))
	n.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{"action": "restart_takeover", "from": prev, "scope": admin.ScopeFleet})
	n.goRestart(ctx, set, st)
}

// rollingRestart runs a restart's steps from where st is: the replicas
// before the current one are done (their "ready" step is recorded); see
// StartRestart.
func (n *ProxyNode) rollingRestart(ctx context.Context, set string, st admin.RestartStatus) {
	log := n.log.Named("restart").With(zap.String("set", set))
	self, node := n.node.ID(), n.node.Name()
	done := map[string]bool{}
	for _, s := range st.Steps {
		if s.Step == "ready" {
			done[s.Replica] = true
		}
	}
	stepTimeout, err := time.ParseDuration(st.StepTimeout)
	if err != nil {
		stepTimeout = 2 * time.Minute
	}
	// runs reports whether the record says this process runs the
	// restart: not when another proxy has taken it over, nor when another
	// process of this proxy has resumed it.
	runs := func(st admin.RestartStatus) bool {
		return st.Owner == self && st.State == "running" && (st.OwnerNode == "" || st.OwnerNode == node)
	}
	// write records a step, unless another process runs the restart now.
	write := func(mutate func(st *admin.RestartStatus)) error {
		_, err := n.updateRestart(nil, set, "", func(st *admin.RestartStatus, ok bool) error {
			if !ok || !runs(*st) {
				return errHandedOver
			}
			mutate(st)
			return nil
		})
		return err
	}
	step := func(replica, what, detail string) error {
		log.Info("rolling restart step", zap.String("replica", replica), zap.String("step", what), zap.String("detail", detail))
		return write(func(st *admin.RestartStatus) {
			st.Current = replica
			st.Steps = append(st.Steps, admin.RestartStep{Time: time.Now(), Replica: replica, Step: what, Detail: detail})
		})
	}
	finish := func(state, errText string) {
		err := write(func(st *admin.RestartStatus) {
			st.State, st.Error, st.Current, st.Finished = state, errText, "", time.Now()
		})
		if err != nil {
			return
		}
		fields := map[string]any{"action": "restart", "result": state, "scope": admin.ScopeFleet}
		if st.Force {
			fields["force"] = true
		}
		if errText != "" {
			fields["error"] = errText
			log.Error("rolling restart stopped", zap.String("state", state), zap.String("error", errText))
		} else {
			log.Info("rolling restart done")
		}
		n.audit.Record(eventlog.KindAdminAction, set, "", fields)
	}
	// owned reports whether this process still runs the restart.
	owned := func() bool {
		cur, ok := n.restartStatus(set)
		return ok && runs(cur)
	}
	// wait polls cond every 100ms until it holds, the step times out, the
	// proxy stops or another proxy takes the restart over.
	wait := func(cond func() bool) error {
		deadline := time.Now().Add(stepTimeout)
		for !cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("not within %s", stepTimeout)
			}
			if !owned() {
				return errHandedOver
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
		r := n.p.Router(set)
		if r == nil {
			return balancer.Member{}, false
		}
		for _, m := range r.Table().Members() {
			if m.Name == name {
				return m, true
			}
		}
		return balancer.Member{}, false
	}
	for _, name := range st.Replicas {
		if done[name] {
			continue
		}
		fail := func(what string, err error) {
			if errors.Is(err, errHandedOver) {
				log.Warn("rolling restart continues in another process", zap.String("replica", name))
				return
			}
			if others, twins, _ := n.processes(); ctx.Err() != nil && others > 0 {
				// Stopping while other proxy processes run: once this one
				// has left, this proxy's new process resumes it (a binary
				// upgrade), or another proxy takes it over, from this
				// replica's drain.
				detail := "this proxy is stopping; another proxy takes the restart over"
				if twins > 0 {
					detail = "this process is stopping; this proxy's new process resumes the restart"
				}
				_ = step(name, "handover", detail)
				return
			}
			_ = step(name, "failed", what+": "+err.Error())
			_ = n.disc.Drain(set, name, false)
			state := "failed"
			if ctx.Err() != nil {
				state = "interrupted"
			}
			finish(state, fmt.Sprintf("%s %s: %v", name, what, err))
		}
		if err := step(name, "drain", ""); err != nil {
			fail("drain", err)
			return
		}
		if err := n.disc.Drain(set, name, true); err != nil {
			fail("drain", err)
			return
		}
		// Forced: out of rotation here is enough; the requests in flight
		// to it fail when its process stops.
		drained := "out of rotation and nothing in flight on every proxy"
		var (
			outSince time.Time
			err      error
		)
		if st.Force {
			err = wait(func() bool {
				inflight, out, ok := n.p.ReplicaLoad(set, name)
				if !ok || !out {
					return false
				}
				others, _ := n.p.FleetInflight(set)
				drained = fmt.Sprintf("forced: out of rotation here; not waiting for %d requests in flight here and %d on other proxies", inflight, others[name])
				return true
			})
		} else {
			// Drained: out of rotation here, every other proxy has said
			// since then that it routes the set like this one (so it has
			// the replica out too) and that it has nothing in flight to
			// it, and neither has this one.
			err = wait(func() bool {
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
			})
		}
		if err != nil {
			fail("drained", err)
			return
		}
		if err := step(name, "drained", drained); err != nil {
			fail("drained", err)
			return
		}
		since := time.Now()
		if pod, ok := n.restartsByPod(set, name); ok {
			// A pod whose agent supervises no process: deleting it makes
			// its StatefulSet start it again under the same name, with a
			// new agent.
			oldBoot := n.agentMetas(set)[name].Boot
			if err := step(name, "restart", "deleting pod "+pod.Name); err != nil {
				fail("restart", err)
				return
			}
			if err := n.kube.DeletePod(ctx, set, pod.Name, pod.UID); err != nil {
				fail("restart", err)
				return
			}
			if err := wait(func() bool { m, ok := n.agentMetas(set)[name]; return ok && m.Boot > oldBoot }); err != nil {
				fail("started", err)
				return
			}
			if err := step(name, "started", "the pod was made again, and its new agent joined"); err != nil {
				fail("started", err)
				return
			}
		} else {
			if err := step(name, "restart", ""); err != nil {
				fail("restart", err)
				return
			}
			if err := n.disc.RestartReplica(set, name); err != nil {
				fail("restart", err)
				return
			}
			if err := wait(func() bool { return n.processStarted(set, name, since) }); err != nil {
				fail("started", err)
				return
			}
			if err := step(name, "started", "the agent started a new process"); err != nil {
				fail("started", err)
				return
			}
		}
		if err := step(name, "undrain", ""); err != nil {
			fail("undrain", err)
			return
		}
		// A new agent (a pod made again) may join discovery a moment
		// after the member list: the undrain is retried until it has.
		var undrainErr error
		if err := wait(func() bool {
			undrainErr = n.disc.Drain(set, name, false)
			return !errors.Is(undrainErr, membership.ErrNotAdvertised)
		}); err != nil {
			fail("undrain", fmt.Errorf("%w: %v", err, undrainErr))
			return
		}
		if undrainErr != nil {
			fail("undrain", undrainErr)
			return
		}
		if err := wait(func() bool {
			m, ok := member(name)
			return ok && m.State == balancer.StateReady && m.InRotation
		}); err != nil {
			fail("ready", err)
			return
		}
		if err := step(name, "ready", "back in rotation"); err != nil {
			fail("ready", err)
			return
		}
	}
	finish("done", "")
}

// restartsByPod returns the pod to delete to restart a replica of a set
// on a StatefulSet whose agent supervises no process; ok is false for
// any other replica (its agent restarts it in place).
func (n *ProxyNode) restartsByPod(set, name string) (backend.Pod, bool) {
	if n.kube == nil {
		return backend.Pod{}, false
	}
	if _, ok := n.isKubeSet(set); !ok {
		return backend.Pod{}, false
	}
	if m, ok := n.agentMetas(set)[name]; ok && !unsupervised(m) {
		return backend.Pod{}, false
	}
	pods, err := n.kube.Pods(set)
	if err != nil {
		return backend.Pod{}, false
	}
	for _, p := range pods {
		if p.Name == name && !p.Deleting {
			return p, true
		}
	}
	return backend.Pod{}, false
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
