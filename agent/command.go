package agent

import (
	"go.uber.org/zap"

	"keyway/membership"
)

// Operator drains: a proxy's admin API sends the agent a
// membership.AdminDrain, signed with the proxy key (membership's message
// decoder refuses it otherwise). While the agent holds such a drain it advertises
// draining, whatever its probes say, so every proxy takes the replica out
// of rotation; it keeps probing, and an undrain advertises the state the
// probes have reached (ready, starting or recovering). It also advertises
// the hold itself (Meta.Held): proxies remember it, and drain a new
// incarnation of the replica (this agent restarted) again until undrained.

// HandleMessage is the agent's membership.MessageHandler: commands go to
// their handlers (admin drains and set stops on to the run loop),
// everything else to the drain report book. It runs on the membership
// message worker and never blocks, except for a rolling restart
// (onRestartReplica).
func (a *Agent) HandleMessage(from string, msg []byte) {
	a.handle(membership.MessageKind(msg), from, msg)
}

// handle is HandleMessage for a message whose kind is read.
func (a *Agent) handle(kind, from string, msg []byte) {
	switch kind {
	case membership.RepairKind:
		a.onRepair(from, msg)
	case membership.RestartReplicaKind:
		a.onRestartReplica(from, msg)
	case membership.SetStopKind:
		a.onSetStop(from, msg)
	case membership.AdminDrainKind:
		a.onAdminDrain(from, msg)
	case membership.RetireKind:
		a.onRetire(from, msg)
	default:
		a.book.record(from, msg)
	}
}

// onAdminDrain handles an operator drain or undrain of this replica.
func (a *Agent) onAdminDrain(from string, msg []byte) {
	c, err := membership.DecodeAdminDrain(msg)
	if err != nil {
		a.log.Warn("malformed admin drain command", zap.String("from", from), zap.Error(err))
		return
	}
	if c.Set != a.cfg.Replica.Set || c.Replica != a.replica || (c.Boot != 0 && c.Boot != a.book.boot) {
		a.log.Info("admin drain command for another replica ignored", zap.String("from", from),
			zap.String("set", c.Set), zap.String("replica", c.Replica), zap.Int64("boot", c.Boot))
		return
	}
	a.log.Info("admin drain command", zap.String("from", from), zap.String("by", c.By), zap.Bool("drain", c.Drain))
	a.holdWanted.Store(c.Drain)
	select {
	case a.holdSignal <- struct{}{}:
	default:
	}
}

// onHold applies the latest operator command on the run loop's goroutine.
func (a *Agent) onHold() {
	want := a.holdWanted.Load()
	if want == a.held {
		return
	}
	a.held = want
	ev := evRelease
	if want {
		ev = evHold
	}
	// Also when the state does not change (held while already draining,
	// or stopped), apply advertises the flag: proxies remember it.
	a.apply(ev, zap.Bool("operator", true))
}

// Held reports whether an operator drain is in force.
func (a *Agent) Held() bool { return a.holdWanted.Load() }

// onRepair handles a membership.Repair of this agent's set, from a proxy:
// a supervised replica that gave up (failed) gets a fresh restart budget
// and is started again. Anything else is left as it is (a repair also
// reaches agents whose replica is fine). It runs on the membership
// message worker and never blocks: Repair only signals the supervisor.
func (a *Agent) onRepair(from string, msg []byte) {
	r, err := membership.DecodeRepair(msg)
	if err != nil {
		a.log.Warn("malformed repair command", zap.String("from", from), zap.Error(err))
		return
	}
	if r.Set != a.cfg.Replica.Set {
		return
	}
	if a.sup == nil {
		a.log.Info("repair command: this agent supervises no process; nothing to restart", zap.String("by", r.By))
		return
	}
	if err := a.Repair(); err != nil {
		a.log.Info("repair command: nothing to repair", zap.String("by", r.By), zap.Error(err))
		return
	}
	a.log.Info("repair command: restarting the replica that gave up", zap.String("by", r.By))
}

// onRestartReplica handles a proxy's rolling restart of this replica: the
// supervised process is stopped and started again, the agent and any
// operator drain it holds stay. It blocks the message worker for the stop
// (at most supervise.stop_grace): nothing else is pending for this agent
// while its replica is restarted.
func (a *Agent) onRestartReplica(from string, msg []byte) {
	r, err := membership.DecodeRestartReplica(msg)
	if err != nil {
		a.log.Warn("malformed restart command", zap.String("from", from), zap.Error(err))
		return
	}
	if r.Set != a.cfg.Replica.Set || r.Replica != a.replica || (r.Boot != 0 && r.Boot != a.book.boot) {
		return
	}
	if a.sup == nil {
		a.log.Warn("restart command: this agent supervises no process; nothing to restart", zap.String("by", r.By))
		return
	}
	a.log.Info("restart command: restarting the replica's process", zap.String("by", r.By))
	if err := a.sup.restart(); err != nil {
		a.log.Warn("restart command not carried out", zap.Error(err))
	}
}
