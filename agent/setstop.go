package agent

import (
	"context"
	"time"

	"go.uber.org/zap"

	"keyway/membership"
)

// Set stops: an operator stops a whole replica set (the proxies' admin
// API), and the proxies send its agents a membership.SetStop, again every
// report interval until each agent's Meta.SetStopped says it follows.
// Stopping the replica is the shutdown's drain without the leave: the
// agent advertises draining and SetStopped together, waits for every live
// proxy to report nothing in flight (or drain.timeout), drain.quiet and
// the drain probe, then pauses the supervisor (SIGTERM, SIGKILL after
// supervise.stop_grace; no restart, no budget used) and advertises
// stopped. It stays in the cluster, probing and serving its HTTP
// listener. A set start clears SetStopped and resumes the supervisor (a
// fresh process) or, without one, lets the probes decide from starting.
//
// Commands arrive on the membership message worker, which must never
// block: onSetStop only checks the command, keeps its version and stores
// the wanted mode (setWanted), then signals the run loop. The run loop
// carries the mode out (onSetCommand) without blocking for long: it waits
// for the proxies' reports in its own select, and leaves the quiet period,
// the drain probe and the process stop to a goroutine it owns (setStopRun),
// so that probes, other commands and shutdown are handled meanwhile.

// olderSetCommand reports whether a set command of version v is to be
// ignored, the newest applied being newest: it is older. Versions are
// those of the set's run-time record (package runstate: a hybrid logical
// clock of the proxies' wall clocks), so an older one comes from a proxy
// that has not learnt the newest state yet, for a second or two, and is
// never right. Versions never start again from 0: when every proxy has
// restarted without runtime.state_dir, the next operator write takes the
// wall clock, above what the agent holds. (Lamport versions did start
// again, and an older command was therefore obeyed 30 s after the
// newest.) Until that write, such proxies send version 0 (no record: the
// configuration file alone), which the agent ignores: it keeps the mode
// an operator last asked for.
func olderSetCommand(v, newest uint64) bool { return v < newest }

// setStopRun is a set stop under way. Run's goroutine owns it; complete is
// written by the goroutine that finishes the stop, before it closes done.
type setStopRun struct {
	start     time.Time
	timeout   *time.Timer        // drain.timeout, while waiting for the proxies' reports
	drained   bool               // the reports' wait is over: finish runs
	cancel    context.CancelFunc // ends finish early (a set start, shutdown); set with drained
	cancelled bool               // cancel was called
	done      chan struct{}      // closed when finish returns
	complete  bool               // finish stopped the process (or there is none): the replica is stopped
}

// onSetStop handles a membership.SetStop, on the membership message
// worker. Only a proxy may send it (the decoder checks its signature),
// for this agent's set; a command older than the newest applied is ignored
// (olderSetCommand), and one that wants what the agent already wants
// changes nothing (proxies repeat it until the metadata follows).
func (a *Agent) onSetStop(from string, msg []byte) {
	c, err := membership.DecodeSetStop(msg)
	if err != nil {
		a.log.Warn("malformed set stop command", zap.String("from", from), zap.Error(err))
		return
	}
	if c.Set != a.cfg.Replica.Set {
		a.log.Debug("set stop command for another set ignored", zap.String("from", from), zap.String("set", c.Set))
		return
	}
	a.setMu.Lock()
	newest := a.setVersion
	older := olderSetCommand(c.Version, newest)
	changed := !older && a.setWanted.Load() != c.Stop
	if !older {
		a.setVersion = c.Version
		a.setWanted.Store(c.Stop)
	}
	a.setMu.Unlock()
	if older {
		a.log.Debug("older set stop command ignored", zap.String("from", from), zap.String("by", c.By),
			zap.Bool("stop", c.Stop), zap.Uint64("version", c.Version), zap.Uint64("newest", newest))
		return
	}
	if !changed {
		return
	}
	command := "start"
	if c.Stop {
		command = "stop"
	}
	a.metrics.setCommands.WithLabelValues(command).Inc()
	a.log.Info("set command", zap.String("command", command), zap.String("set", c.Set), zap.String("from", from),
		zap.String("by", c.By), zap.Uint64("version", c.Version))
	select {
	case a.setSignal <- struct{}{}:
	default:
	}
}

// SetStopped reports whether the newest set command the agent accepted
// stops its replica's set: the agent drains and stops the replica, or has.
// Safe for concurrent use.
func (a *Agent) SetStopped() bool { return a.setWanted.Load() }

// onSetCommand brings the replica to the mode the newest set command
// wants. Run's goroutine.
func (a *Agent) onSetCommand() {
	if a.retired {
		return // stopped for good: a set start does not bring it back
	}
	want := a.setWanted.Load()
	if r := a.setRun; r != nil {
		if !want {
			a.abandonSetStop(r)
		}
		// Still stopping: carry on. (A stop whose finish was cancelled
		// is taken up again in onSetStopDone.)
		return
	}
	switch {
	case want && !a.setApplied:
		a.beginSetStop()
	case !want && a.setApplied:
		a.startSet()
	}
}

// beginSetStop advertises draining and SetStopped, in one metadata update,
// and starts waiting for the proxies' reports. Run's goroutine.
func (a *Agent) beginSetStop() {
	a.setApplied = true
	a.book.begin() // before draining shows: no report answering it is missed
	a.apply(evSetStop)
	a.setRun = &setStopRun{start: a.now(), timeout: time.NewTimer(a.cfg.Drain.Timeout), done: make(chan struct{})}
	a.checkSetDrained() // no proxy alive: drained at once
}

// setStopWaits returns what the run loop waits on for a set stop under
// way: the proxies' reports and drain.timeout, then the end of finish. A
// nil channel is one the loop does not wait on.
func (a *Agent) setStopWaits() (reports <-chan struct{}, timeout <-chan time.Time, done <-chan struct{}) {
	switch r := a.setRun; {
	case r == nil:
	case !r.drained:
		return a.book.changed, r.timeout.C, nil
	default:
		return nil, nil, r.done
	}
	return nil, nil, nil
}

// checkSetDrained goes on to finish once every live proxy has reported
// nothing in flight to the replica. Run's goroutine; it does nothing
// unless a set stop waits for reports.
func (a *Agent) checkSetDrained() {
	r := a.setRun
	if r == nil || r.drained {
		return
	}
	members := a.node.Members()
	latest := a.book.snapshot()
	if len(pendingProxies(members, latest)) > 0 {
		return
	}
	a.log.Info("replica drained for the set stop", zap.Duration("took", a.now().Sub(r.start)),
		zap.Int("proxies", liveProxies(members)), zap.Int("reports", len(latest)))
	a.finishSetStop(r)
}

// setDrainTimedOut goes on to finish although proxies still report
// requests in flight (or nothing): drain.timeout has passed.
func (a *Agent) setDrainTimedOut() {
	r := a.setRun
	latest := a.book.snapshot()
	pending := pendingProxies(a.node.Members(), latest)
	a.log.Warn("set stop: drain timed out; proxies may still be sending", zap.Duration("timeout", a.cfg.Drain.Timeout),
		zap.Strings("pending", describePending(pending, latest)))
	a.finishSetStop(r)
}

// finishSetStop starts the rest of the stop on a goroutine: drain.quiet,
// the drain probe, then pausing the supervisor, which stops the process
// (that may take supervise.stop_grace). Run's goroutine; onSetStopDone
// takes the result.
func (a *Agent) finishSetStop(r *setStopRun) {
	r.drained = true
	r.timeout.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		if q := a.cfg.Drain.Quiet; q > 0 {
			a.log.Info("drain quiet period", zap.Duration("quiet", q))
			t := time.NewTimer(q)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		a.waitDrainProbe(ctx)
		if ctx.Err() != nil {
			return
		}
		if a.sup != nil {
			// Only shutdown makes pause fail, and shutdown stops the
			// process itself.
			if err := a.sup.pause(); err != nil {
				a.log.Warn("set stop: replica process not stopped", zap.Error(err))
			}
		}
		r.complete = true
	}()
}

// onSetStopDone takes the end of finish: the replica is stopped, unless a
// set start cancelled finish before it stopped the process. Then the
// newest command decides what comes next. Run's goroutine.
func (a *Agent) onSetStopDone() {
	r := a.setRun
	a.setRun = nil
	r.cancel()
	if a.retired {
		return // the replica left for good meanwhile
	}
	if r.complete {
		a.setStopped(r)
	} else if a.setWanted.Load() {
		// A start cancelled finish, and a stop came after it: stop again,
		// from the start (the replica still advertises draining).
		a.beginSetStop()
		return
	}
	a.onSetCommand()
}

// setStopped advertises stopped at the end of a set stop.
func (a *Agent) setStopped(r *setStopRun) {
	took := a.now().Sub(r.start)
	a.apply(evStop, zap.Duration("drain_took", took))
	a.log.Info("replica stopped: its set is stopped", zap.String("set", a.cfg.Replica.Set), zap.String("replica", a.replica),
		zap.Duration("drain_took", took), zap.Bool("process", a.sup != nil))
}

// abandonSetStop gives up a set stop for a set start. While it waits for
// the proxies' reports the start follows at once; once finish runs, it is
// cancelled and the start follows when it has returned (onSetStopDone),
// within supervise.stop_grace if it is stopping the process.
func (a *Agent) abandonSetStop(r *setStopRun) {
	switch {
	case !r.drained:
		r.timeout.Stop()
		a.setRun = nil
		a.log.Info("set stop abandoned while draining: the set is started again")
		a.startSet()
	case !r.cancelled:
		r.cancelled = true
		r.cancel()
	}
}

// startSet ends a set stop: SetStopped is cleared, the supervised process
// starts again (a fresh one with a fresh restart budget, unless a stop
// abandoned in time left it running), and the replica advertises starting
// (draining while an operator drain holds it) until its probes pass.
// Run's goroutine; resume blocks it until the start has been attempted.
func (a *Agent) startSet() {
	a.setApplied = false
	a.book.end()
	if a.sup != nil {
		if err := a.sup.resume(); err != nil {
			a.log.Warn("set start: replica process not started", zap.Error(err))
		}
	}
	from := a.State()
	a.apply(evSetStart)
	a.log.Info("replica started: its set is started", zap.String("set", a.cfg.Replica.Set), zap.String("replica", a.replica),
		zap.Stringer("from", from), zap.Bool("process", a.sup != nil))
}

// endSetStop ends a set stop under way when the agent shuts down: finish
// is cancelled and waited for; if it stopped the replica, stopped is
// advertised, so that the shutdown's drain does not drain it again. Run's
// goroutine, after its loop.
func (a *Agent) endSetStop() {
	r := a.setRun
	if r == nil {
		return
	}
	a.setRun = nil
	if !r.drained {
		r.timeout.Stop()
		return
	}
	r.cancel()
	<-r.done
	if r.complete {
		a.setStopped(r)
	}
}
