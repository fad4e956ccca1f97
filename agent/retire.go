package agent

import (
	"go.uber.org/zap"

	"keyway/membership"
)

// Retirement: the replica's ordinal is beyond its set's count (a
// StatefulSet scaled in, by keyway or by anyone), and the proxies send its
// agent a membership.Retire. The agent drains the replica as at shutdown
// (draining, every live proxy's report that nothing is in flight,
// drain.quiet, the drain probe), stops its supervised process, and
// advertises stopped with Remove: proxies drop the replica from the ring
// at once, so its partitions go to their new owners instead of waiting on
// stand-ins for gossip.forget_after. The agent stays in the cluster,
// stopped, until it is stopped itself (its pod deleted); then it only
// leaves.

// onRetire handles a membership.Retire, on the membership message worker:
// it only checks the command and signals the run loop.
func (a *Agent) onRetire(from string, msg []byte) {
	c, err := membership.DecodeRetire(msg)
	if err != nil {
		a.log.Warn("malformed retire command", zap.String("from", from), zap.Error(err))
		return
	}
	if c.Set != a.cfg.Replica.Set || c.Replica != a.replica || (c.Boot != 0 && c.Boot != a.book.boot) {
		return
	}
	if a.retireWanted.Swap(true) {
		return // proxies repeat it until Remove shows
	}
	a.log.Info("retire command: the replica leaves its set for good", zap.String("from", from), zap.String("by", c.By))
	select {
	case a.retireSignal <- struct{}{}:
	default:
	}
}

// retire drains and stops the replica for good. Run's goroutine; it
// blocks the run loop for the drain, as the shutdown's does.
func (a *Agent) retire() {
	if a.retired || a.leaving {
		return
	}
	a.retired = true
	a.metrics.retires.Inc()
	a.drain()
	a.log.Info("replica retired: stopped for good; the agent stays until it is stopped")
}

// removing reports whether the replica leaves for good when it stops:
// drain.remove, or a retire command.
func (a *Agent) removing() bool { return a.cfg.Drain.Remove || a.retireWanted.Load() }

// Retired reports whether a retire command was accepted. Safe for
// concurrent use.
func (a *Agent) Retired() bool { return a.retireWanted.Load() }
