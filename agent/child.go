package agent

import (
	"context"
	"strconv"
	"time"

	"go.uber.org/zap"

	"keyway/membership"
)

// The agent's side of supervision: it starts and stops the supervisor
// (supervise.go), and turns each of its reports into a log line, an audit
// message to every alive proxy and, for starts, unexpected exits
// and give-ups, a lifecycle event for the run loop.

// startSupervisor starts the supervisor, when there is a command, on a
// context of its own: the process must outlive Run's ctx until the
// replica has drained (stopChild).
func (a *Agent) startSupervisor(ctx context.Context) {
	if a.sup == nil {
		return
	}
	supCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	a.stopSup = stop
	go a.sup.run(supCtx)
}

// stopChild stops the supervised process (SIGTERM, SIGKILL after
// supervise.stop_grace) and waits until it has exited. It does nothing
// without a command, or the second time. Run's goroutine.
func (a *Agent) stopChild() {
	if a.stopSup == nil {
		return
	}
	a.stopSup()
	a.stopSup = nil
	<-a.sup.done
}

// Repair ends a give-up: it resets the restart budget (supervise.max_restarts
// within supervise.window) and starts the replica's process again; the
// agent advertises starting, then ready once the probe passes. It returns
// ErrNotSupervising without a command, ErrNotFailed unless the agent has
// given up (state failed), and ErrNotRunning unless Run is running and not
// shutting down. Safe for concurrent use; it returns once the start has
// been attempted (a failed start counts as an exit, with backoff).
func (a *Agent) Repair() error {
	if a.sup == nil {
		return ErrNotSupervising
	}
	return a.sup.repair()
}

// onChild is the supervisor's callback, on the supervisor's goroutine. It
// never blocks: gossip messages are single UDP packets, and the lifecycle
// event is queued for the run loop.
func (a *Agent) onChild(ev childEvent) {
	a.logChild(ev)
	a.reportChild(ev)
	var le event
	switch {
	case ev.Kind == childStart:
		le = evChildStart
	case ev.unexpected():
		le = evChildExit
	case ev.Kind == childGiveUp:
		le = evGiveUp
	default:
		return
	}
	a.childMu.Lock()
	a.childQ = append(a.childQ, le)
	a.childMu.Unlock()
	select {
	case a.childSig <- struct{}{}:
	default:
	}
}

// onChildEvents applies the queued lifecycle events, on Run's goroutine.
func (a *Agent) onChildEvents() {
	a.childMu.Lock()
	q := a.childQ
	a.childQ = nil
	a.childMu.Unlock()
	for _, ev := range q {
		a.apply(ev)
	}
}

func (a *Agent) logChild(ev childEvent) {
	sup := a.cfg.Supervise
	switch ev.Kind {
	case childStart:
		a.log.Info("replica process started", zap.Int("pid", ev.Pid), zap.Strings("command", a.sup.argv))
	case childExit:
		if ev.Reason == reasonStartError {
			a.log.Error("replica process could not be started", zap.Strings("command", a.sup.argv), zap.Error(ev.Err),
				zap.Int("restarts", ev.Restarts))
			return
		}
		fields := []zap.Field{zap.Int("pid", ev.Pid), zap.String("reason", ev.Reason), zap.Int("code", ev.Exit.Code),
			zap.Duration("uptime", ev.Uptime), zap.Int("restarts", ev.Restarts)}
		if ev.Exit.Signal != "" {
			fields = append(fields, zap.String("signal", ev.Exit.Signal))
		}
		if ev.Killed {
			fields = append(fields, zap.Bool("killed", true))
		}
		lvl := zap.WarnLevel
		if ev.Reason == reasonStop {
			lvl = zap.InfoLevel
		}
		a.log.Log(lvl, "replica process exited", fields...)
	case childRestart:
		a.log.Warn("replica process restart scheduled", zap.Duration("backoff", ev.Backoff), zap.Int("restarts", ev.Restarts),
			zap.Int("max_restarts", sup.MaxRestarts), zap.Duration("window", sup.Window))
	case childGiveUp:
		a.log.Error("replica process keeps exiting; gave up restarting it", zap.Int("restarts", ev.Restarts),
			zap.Int("max_restarts", sup.MaxRestarts), zap.Duration("window", sup.Window))
	case childRepair:
		a.log.Info("replica process repaired; starting it again")
	}
}

// reportChild sends the event to every alive proxy, for its audit trail.
// Best effort: a proxy that misses it misses an audit line.
func (a *Agent) reportChild(ev childEvent) {
	a.childSeq++
	msg := membership.ProcessEvent{
		Set: a.cfg.Replica.Set, Replica: a.replica, Boot: a.book.boot, Seq: a.childSeq,
		Event: ev.Kind.String(), Pid: ev.Pid, Restarts: ev.Restarts, BackoffMS: ev.Backoff.Milliseconds(),
	}
	if ev.Kind == childExit {
		msg.Reason, msg.Code, msg.Signal = ev.Reason, ev.Exit.Code, ev.Exit.Signal
		if ev.Err != nil {
			msg.Error = ev.Err.Error()
		}
	}
	a.report(msg.Encode(), ev.Kind == childStart)
}

// maxPendingReports bounds the process events an agent keeps (for the
// first proxy, and a later one's catch-up): the oldest go first.
const maxPendingReports = 16

// reportLog keeps an agent's last process events (at most
// maxPendingReports) and how many of them each proxy process was sent. A
// proxy process is named by its ID and boot (reportKey): the old and the
// new process of an upgrade are two, a proxy's gossip move to another
// port is one.
type reportLog struct {
	msgs      [][]byte             // the last events; msgs[i] is event base+i
	base      int                  // the number of events dropped from msgs
	lastStart int                  // the number of the last start event, -1 before one
	sent      map[string]int       // events sent to each proxy process (all before that number)
	seenAt    map[string]time.Time // when a proxy process not sent to yet was first seen
	reached   bool                 // a proxy was sent events
	retry     bool                 // a later pass is scheduled (reportJoinDelay)
}

// reportJoinDelay is how long a proxy is known before the agent sends it
// its first events. A proxy drops a report from a member it has not
// merged yet, and gossip lets the agent learn of a proxy (its join's
// push/pull answer) before the proxy has merged the agent.
const reportJoinDelay = 250 * time.Millisecond

// reportKey names a proxy process.
func reportKey(m membership.Member) string { return m.ID() + "/" + strconv.FormatInt(m.Meta.Boot, 10) }

// sendReports sends msg (nil for none) and the events each alive proxy
// has not had to it: a proxy the agent reports to gets every event once.
// While the agent knows no proxy yet (the process starts as gossip
// joins) it holds them, at most maxPendingReports, for the first proxies
// it learns of. A proxy that appears later (another proxy, or a new
// process of one: an upgrade, a restart) gets the current process's
// events, from its last start on, so that it knows the replica's process
// (its PID, restarts and last exit) without having seen them happen. A
// proxy's first events wait until it has been known reportJoinDelay. The
// run loop calls it on membership changes. Safe for concurrent use.
func (a *Agent) sendReports(msg []byte) { a.report(msg, false) }

// report is sendReports; start says msg is a start event.
func (a *Agent) report(msg []byte, start bool) {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	l := &a.reports
	if l.sent == nil {
		l.sent, l.seenAt, l.lastStart = map[string]int{}, map[string]time.Time{}, -1
	}
	if msg != nil {
		if start {
			l.lastStart = l.base + len(l.msgs)
		}
		l.msgs = append(l.msgs, msg)
		if n := len(l.msgs); n > maxPendingReports {
			drop := n - maxPendingReports
			l.msgs = append(l.msgs[:0], l.msgs[drop:]...)
			l.base += drop
		}
	}
	total := l.base + len(l.msgs)
	members := a.node.Members()
	known := make(map[string]bool, len(members))
	now, later := time.Now(), false // not a.now: the retry is a real timer
	for _, m := range members {
		if m.Self || m.Meta.Role != membership.RoleProxy {
			continue
		}
		key := reportKey(m)
		known[key] = true
		if m.Status != membership.StatusAlive {
			continue
		}
		from, ok := l.sent[key]
		if !ok {
			at, seen := l.seenAt[key]
			if !seen {
				l.seenAt[key], at = now, now
			}
			if now.Sub(at) < reportJoinDelay {
				later = true
				continue
			}
			delete(l.seenAt, key)
			if l.reached {
				from = max(l.lastStart, 0) // a later proxy: the current process's story
			}
		}
		from = max(from, l.base)
		for i := from; i < total; i++ {
			if err := a.node.Send(m.Node, l.msgs[i-l.base]); err != nil {
				a.log.Debug("replica process event not sent", zap.String("proxy", m.Node), zap.Error(err))
			}
		}
		l.sent[key] = total
	}
	for key := range l.sent {
		if !known[key] {
			delete(l.sent, key) // gone from the member list: a later return is a new proxy process
		}
	}
	for key := range l.seenAt {
		if !known[key] {
			delete(l.seenAt, key)
		}
	}
	if len(l.sent) > 0 {
		l.reached = true
	}
	if later && !l.retry {
		l.retry = true
		time.AfterFunc(reportJoinDelay, func() {
			a.reportMu.Lock()
			a.reports.retry = false
			a.reportMu.Unlock()
			a.sendReports(nil)
		})
	}
}
