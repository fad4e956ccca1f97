package membership

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
)

// The proxy side of drains. An operator drain is an AdminDrain command
// sent to the agent of a replica's newest alive incarnation (Drain); the
// agent advertises draining and Meta.Held while it holds it, so every
// proxy takes the replica out of rotation. Each proxy remembers the drain
// per replica (trackHeldLocked): a new incarnation of a held replica (its
// agent restarted) is routed as draining and sent the drain again (report)
// until it holds it, at most MaxRedrains times. An undrain ends it on
// every proxy (Drain tells the others; HandleMessage hears it). Agents of
// draining replicas get drain reports (report).

// Errors of [Discovery.Drain].
var (
	// ErrNotAttached: no Node is attached to the Discovery yet.
	ErrNotAttached = errors.New("membership: no gossip node attached")
	// ErrNotAdvertised: no alive gossip member advertises the replica.
	ErrNotAdvertised = errors.New("membership: no alive gossip member advertises the replica")
)

// Drain asks the agent of a gossip replica to drain it (drain true) or to
// end that drain (drain false). The command goes to the replica's newest
// alive incarnation in the last snapshot. An undrain also makes this
// proxy forget the operator drain ([Discovery.ForgetHold]) and is told,
// best effort, to every other alive proxy, so that none drains a later
// incarnation again (a proxy that misses it asks a restarted replica at
// most MaxRedrains times). Errors wrap [ErrNotAttached] before a Node is
// attached, [ErrNotAdvertised] when no alive member advertises set/replica,
// or the error of sending the command to the replica's agent.
//
// It blocks for the send (TCP). Call it from an admin request, never from
// the Target, from OnEvent or from a memberlist callback.
func (d *Discovery) Drain(set, replica string, drain bool) error {
	d.mu.Lock()
	node, self, send := d.node, d.self, d.send
	target, ok := d.index.newestAlive(set, replica)
	d.mu.Unlock()
	if send == nil {
		return ErrNotAttached
	}
	if !ok {
		return fmt.Errorf("%w: %s/%s", ErrNotAdvertised, set, replica)
	}
	msg := AdminDrain{Set: set, Replica: replica, Boot: target.Meta.Boot, Drain: drain, By: self}.Encode()
	if !drain {
		// Forget the drain here and tell the other proxies first, then the
		// agent: a proxy that still remembered it when the agent releases
		// the drain would drain the replica again (report). Under cmdMu, so
		// that no re-drain this proxy computed before is sent after.
		d.cmdMu.Lock()
		defer d.cmdMu.Unlock()
		d.forgetHold(set, replica)
		d.tellProxies(send, msg)
	}
	if err := send(target.Node, msg); err != nil {
		return fmt.Errorf("membership: sending the command to %s: %w", target.Node, err)
	}
	if node != nil {
		// Take the node's lock once more: it orders Send's reads before the
		// gossip update the command triggers (see agent/helpers_test.go).
		_ = node.Members()
	}
	return nil
}

// tellProxies sends msg to every other alive proxy process of the last
// snapshot (the other process of this proxy too, during an upgrade), best
// effort (one that misses it is logged at debug level), and returns how
// many other proxies (IDs) it reached.
func (d *Discovery) tellProxies(send func(string, []byte) error, msg []byte) (told int) {
	d.mu.Lock()
	ms, self := d.members, d.self
	d.mu.Unlock()
	reached := map[string]bool{}
	for _, m := range ms {
		if m.Meta.Role != RoleProxy || m.Status != StatusAlive || m.Self {
			continue
		}
		if err := send(m.Node, msg); err != nil {
			d.log.Debug("command not told to a proxy", zap.String("proxy", m.Node), zap.String("kind", MessageKind(msg)), zap.Error(err))
			continue
		}
		if m.ID() != self {
			reached[m.ID()] = true
		}
	}
	return len(reached)
}

// OperatorHeld reports whether the newest alive incarnation of a replica
// holds an operator drain (advertises Meta.Held), from the last snapshot.
func (d *Discovery) OperatorHeld(set, replica string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.index.newestAlive(set, replica)
	return ok && m.Meta.Held
}

// trackHeldLocked remembers which replicas an operator drained, from the
// Held flag their newest alive incarnations advertise: set by a held one,
// cleared when the same incarnation advertises it no more (an undrain) or
// the replica leaves for good. Only the newest alive incarnation counts:
// an older one that gossip has not declared dead yet (a crash moments
// ago) still advertises what it held. A newer incarnation that does not
// hold it is drained again by report. d.mu is held and d.index is ms's.
func (d *Discovery) trackHeldLocked(ms []Member) {
	for k := range d.held {
		if _, present := d.index[k]; !present {
			delete(d.held, k) // forgotten (gossip.forget_after): a later replica of that name starts afresh
		}
	}
	if len(d.redrains) > 0 {
		alive := map[string]bool{}
		for _, m := range ms {
			alive[m.Node] = m.Status == StatusAlive
		}
		for node := range d.redrains {
			if !alive[node] {
				delete(d.redrains, node) // that incarnation is gone
			}
		}
	}
	for k, in := range d.index {
		if !in.hasAlive {
			continue
		}
		m := in.newest
		mark, marked := d.held[k]
		switch {
		case m.Meta.Remove:
			delete(d.held, k)
		case m.Meta.Held && m.Meta.Boot >= mark:
			d.held[k] = m.Meta.Boot
		case marked && !m.Meta.Held && m.Meta.Boot == mark:
			delete(d.held, k) // the operator undrained it
		}
	}
}

// MaxRedrains bounds the drain commands a proxy sends one new incarnation
// of a held replica (one per report interval: 5 s at the default 200 ms).
const MaxRedrains = 25

// ForgetHold forgets an operator drain of a replica on this proxy: an
// undrain asked here, or told by another proxy (HandleMessage). A new
// incarnation is then routed by what it advertises.
func (d *Discovery) ForgetHold(set, replica string) {
	d.cmdMu.Lock()
	defer d.cmdMu.Unlock()
	d.forgetHold(set, replica)
}

// forgetHold is ForgetHold with cmdMu held.
func (d *Discovery) forgetHold(set, replica string) {
	d.mu.Lock()
	_, had := d.held[[2]string{set, replica}]
	delete(d.held, [2]string{set, replica})
	d.mu.Unlock()
	if had {
		d.log.Info("operator drain forgotten", zap.String("set", set), zap.String("replica", replica))
		d.feedMu.Lock()
		defer d.feedMu.Unlock()
		d.mu.Lock()
		ms := d.members
		d.mu.Unlock()
		d.feed(ms) // route it by what it advertises now
	}
}

// HandleMessage is a proxy's membership.MessageHandler: an undrain that
// another proxy's admin API received (AdminDrain with Drain false, sent to
// every proxy) makes this one forget the drain too, so that no proxy
// drains a later incarnation again.
func (d *Discovery) HandleMessage(from string, msg []byte) {
	switch MessageKind(msg) {
	case RepairKind:
		d.handleRepair(Message{From: from, Body: msg})
	case adminDrainKind:
		d.handleAdminDrain(Message{From: from, Body: msg})
	}
}

// handleRepair hears of a repair another proxy's admin API received.
func (d *Discovery) handleRepair(m Message) {
	if r, err := DecodeRepair(m.Body); err == nil && d.onRepair != nil {
		d.onRepair(r.Set, r.By)
	}
}

// handleAdminDrain hears of an undrain another proxy's admin API received.
func (d *Discovery) handleAdminDrain(m Message) {
	c, err := DecodeAdminDrain(m.Body)
	if err != nil || c.Drain {
		return
	}
	d.ForgetHold(c.Set, c.Replica)
}

// awaitingHoldLocked reports whether the newest alive incarnation of a
// replica an operator drained does not hold the drain yet. d.mu is held.
func (d *Discovery) awaitingHoldLocked(set, replica string) bool {
	mark, ok := d.held[[2]string{set, replica}]
	if !ok {
		return false
	}
	newest, ok := d.index.newestAlive(set, replica)
	return ok && newest.Meta.Boot > mark && !newest.Meta.Held
}

// Run sends drain reports to the agents of draining (and stopped, not yet
// gone) replicas, and drains again new incarnations of replicas an
// operator drained, until ctx is done.
func (d *Discovery) Run(ctx context.Context) error {
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.report()
			d.tellSetStops()
			d.tellRetiring()
			d.recheckIsolation()
		}
	}
}

func (d *Discovery) report() {
	type redrain struct {
		m    Member
		sent int // commands sent to this incarnation before this one
	}
	var redrains []redrain
	d.cmdMu.Lock() // until the re-drains are sent
	d.mu.Lock()
	send, ms := d.send, d.members
	if send == nil {
		d.mu.Unlock()
		d.cmdMu.Unlock()
		return
	}
	// While the newest alive incarnation of a held replica does not hold
	// the drain, every alive incarnation newer than the mark that does not
	// hold it either is asked (an older one still alive as well).
	for _, m := range ms {
		if m.Meta.Role == RoleReplica && m.Status == StatusAlive && m.Meta.State != balancer.StateStopped &&
			!m.Meta.Held && m.Meta.Boot > d.held[[2]string{m.Meta.Set, m.Meta.Replica}] && d.awaitingHoldLocked(m.Meta.Set, m.Meta.Replica) {
			if n := d.redrains[m.Node]; n <= MaxRedrains {
				redrains = append(redrains, redrain{m, n})
				d.redrains[m.Node] = n + 1
			}
		}
	}
	d.mu.Unlock()
	for _, r := range redrains {
		m := r.m
		fields := []zap.Field{zap.String("set", m.Meta.Set), zap.String("replica", m.Meta.Replica), zap.String("node", m.Node)}
		if r.sent == MaxRedrains {
			// An agent that does not advertise the hold (an older keyway)
			// or does not get the command: this proxy keeps routing it as
			// draining, and stops asking.
			d.log.Warn("replica restarted during an operator drain does not hold it; not asking again, routed as draining until an undrain", fields...)
			continue
		}
		// Sent every interval until the agent advertises the hold: a
		// lost datagram or a busy agent only delays it.
		cmd := AdminDrain{Set: m.Meta.Set, Replica: m.Meta.Replica, Boot: m.Meta.Boot, Drain: true, By: "keyway (operator drain of an earlier incarnation)"}
		if err := send(m.Node, cmd.Encode()); err != nil {
			d.log.Debug("operator drain not re-sent", append(fields, zap.Error(err))...)
		} else if r.sent == 0 {
			d.log.Info("replica restarted during an operator drain: draining it again", fields...)
		}
	}
	d.cmdMu.Unlock()
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Status != StatusAlive || (m.Meta.State != balancer.StateDraining && m.Meta.State != balancer.StateStopped) {
			continue
		}
		inflight, out, ok := d.target.ReplicaLoad(m.Meta.Set, m.Meta.Replica)
		if !ok {
			// Not on our ring: we send it nothing.
			inflight, out = 0, true
		}
		rep := DrainReport{Set: m.Meta.Set, Replica: m.Meta.Replica, Boot: m.Meta.Boot, DrainingSeen: out, Inflight: inflight,
			StoppedSeen: m.Meta.State == balancer.StateStopped}
		if err := send(m.Node, rep.Encode()); err != nil {
			d.log.Debug("drain report not sent", zap.String("node", m.Node), zap.Error(err))
		}
	}
}
