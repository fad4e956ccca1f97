package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"keyway/internal/poll"
)

// fakeClock is a clock that moves only when the test advances it. Timers
// fire (synchronously, inside Advance) once the clock reaches them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       chan time.Time
	at      time.Time
	d       time.Duration
	stopped bool
	fired   bool
	clk     *fakeClock
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: make(chan time.Time, 1), at: c.now.Add(d), d: d, clk: c}
	c.timers = append(c.timers, t)
	c.fireLocked()
	return t
}

// Advance moves the clock by d and fires the timers it reaches.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

func (c *fakeClock) fireLocked() {
	for _, t := range c.timers {
		if !t.stopped && !t.fired && !t.at.After(c.now) {
			t.fired = true
			t.c <- c.now
		}
	}
}

// pending returns the timers that have neither fired nor been stopped.
func (c *fakeClock) pending() []*fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*fakeTimer
	for _, t := range c.timers {
		if !t.stopped && !t.fired {
			out = append(out, t)
		}
	}
	return out
}

// last returns the newest timer.
func (c *fakeClock) last() *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timers[len(c.timers)-1]
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	was := !t.stopped && !t.fired
	t.stopped = true
	return was
}

// fakeProc is a Process the test ends: exit makes Wait return. Signals are
// recorded; with exitOnTerm, SIGTERM ends it (code 0), and SIGKILL always
// ends it ("SIGKILL").
type fakeProc struct {
	pid        int
	exitC      chan Exit
	exitOnTerm bool

	mu   sync.Mutex
	sigs []syscall.Signal
	done bool
}

func (p *fakeProc) Pid() int   { return p.pid }
func (p *fakeProc) Wait() Exit { return <-p.exitC }

func (p *fakeProc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	p.sigs = append(p.sigs, sig)
	p.mu.Unlock()
	switch {
	case sig == syscall.SIGKILL:
		p.exit(Exit{Code: -1, Signal: "SIGKILL"})
	case sig == syscall.SIGTERM && p.exitOnTerm:
		p.exit(Exit{Code: 0})
	}
	return nil
}

// exit ends the process once; later calls do nothing.
func (p *fakeProc) exit(e Exit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.done = true
		p.exitC <- e
	}
}

func (p *fakeProc) signals() []syscall.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]syscall.Signal(nil), p.sigs...)
}

// fakeStarter starts fakeProcs with pids 100, 101, …; failures queues
// errors returned by the next starts instead.
type fakeStarter struct {
	mu         sync.Mutex
	next       int
	failures   []error
	procs      []*fakeProc
	exitOnTerm bool
}

func (s *fakeStarter) start(argv []string) (Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) > 0 {
		err := s.failures[0]
		s.failures = s.failures[1:]
		return nil, err
	}
	p := &fakeProc{pid: 100 + s.next, exitC: make(chan Exit, 1), exitOnTerm: s.exitOnTerm}
	s.next++
	s.procs = append(s.procs, p)
	return p, nil
}

// proc returns the newest process started.
func (s *fakeStarter) proc() *fakeProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[len(s.procs)-1]
}

// supRig is a supervisor under test: its events arrive on events.
type supRig struct {
	sup    *Supervisor
	clk    *fakeClock
	st     *fakeStarter
	events chan childEvent
	cancel context.CancelFunc
	done   chan struct{}
}

func testSupervise() SuperviseConfig {
	return SuperviseConfig{StopGrace: 10 * time.Second, BackoffMin: time.Second, BackoffMax: 30 * time.Second, MaxRestarts: 5, Window: 10 * time.Minute}
}

func startSupervisor(t *testing.T, cfg SuperviseConfig, st *fakeStarter) *supRig {
	t.Helper()
	r := &supRig{clk: newFakeClock(), st: st, events: make(chan childEvent, 100), done: make(chan struct{})}
	r.sup = newSupervisor([]string{"replica", "--name", "orders-0"}, cfg, st.start, r.clk, 42, zaptest.NewLogger(t), func(ev childEvent) { r.events <- ev })
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { defer close(r.done); r.sup.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		// A process still running ends at SIGKILL; the grace timer is
		// the fake clock's, so move it past stop_grace until Run returns.
		if !poll.Within(10*time.Second, func() bool {
			r.clk.Advance(cfg.StopGrace)
			select {
			case <-r.done:
				return true
			default:
				return false
			}
		}) {
			t.Error("the supervisor did not stop within 10s")
		}
	})
	return r
}

// next returns the next event, failing the test after 5s without one.
func (r *supRig) next(t *testing.T) childEvent {
	t.Helper()
	select {
	case ev := <-r.events:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no supervisor event within 5s")
		return childEvent{}
	}
}

// expect returns the next event, failing unless it is of kind k.
func (r *supRig) expect(t *testing.T, k childEventKind) childEvent {
	t.Helper()
	ev := r.next(t)
	if ev.Kind != k {
		t.Fatalf("event %s %+v, want %s", ev.Kind, ev, k)
	}
	return ev
}

// restartAfter checks that the pending restart waits exactly its backoff:
// nothing starts a nanosecond before it, a process starts at it.
func (r *supRig) restartAfter(t *testing.T, backoff time.Duration) childEvent {
	t.Helper()
	tm := r.clk.last()
	if tm.d != backoff {
		t.Fatalf("restart timer %s, want the announced backoff %s", tm.d, backoff)
	}
	r.clk.Advance(backoff - time.Nanosecond)
	if len(r.clk.pending()) != 1 {
		t.Fatalf("the restart fired before its backoff")
	}
	r.clk.Advance(time.Nanosecond)
	return r.expect(t, childStart)
}

func TestBackoff(t *testing.T) {
	lo, hi := time.Second, 30*time.Second
	for n, want := range []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		if n == 0 {
			continue
		}
		if got := backoff(lo, hi, n, 0); got != want {
			t.Errorf("restart %d without jitter: %s, want %s", n, got, want)
		}
		// The most jitter adds just under a quarter.
		if got, max := backoff(lo, hi, n, 0.999999), want+want/4; got >= max || got < want+want/4-want/1000 {
			t.Errorf("restart %d with full jitter: %s, want just under %s", n, got, max)
		}
	}
	if got := backoff(10*time.Millisecond, 10*time.Millisecond, 1000, 0); got != 10*time.Millisecond {
		t.Errorf("capped: %s", got)
	}
}

func TestBudget(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := budget{window: 10 * time.Minute, max: 2}
	steps := []struct {
		at     time.Duration
		n      int
		giveUp bool
	}{
		{0, 1, false},
		{time.Minute, 2, false},
		{2 * time.Minute, 3, true},               // the third within 10m
		{10*time.Minute + time.Second, 3, true},  // 0 has left; 1m, 2m and this remain
		{12*time.Minute + time.Second, 2, false}, // 1m and 2m have left
		{22*time.Minute + time.Second, 1, false}, // exactly one window after 12m1s: it has left too
		{22*time.Minute + 2*time.Second, 2, false},
		{22*time.Minute + 3*time.Second, 3, true},
		{45 * time.Minute, 1, false}, // all have left
	}
	for i, s := range steps {
		n, giveUp := b.exit(t0.Add(s.at))
		if n != s.n || giveUp != s.giveUp {
			t.Fatalf("step %d (exit at %s): n %d give up %v, want %d %v", i, s.at, n, giveUp, s.n, s.giveUp)
		}
	}
	if u := b.used(t0.Add(45 * time.Minute)); u != 1 {
		t.Fatalf("used %d, want 1", u)
	}
	b.reset()
	if n, _ := b.exit(t0.Add(45 * time.Minute)); n != 1 {
		t.Fatalf("after reset: n %d, want 1", n)
	}
}

// A process that exits is restarted after a backoff that doubles with each
// restart within the window (plus jitter); the events say how it ended.
func TestSupervisorRestartsWithBackoff(t *testing.T) {
	r := startSupervisor(t, testSupervise(), &fakeStarter{})
	if ev := r.expect(t, childStart); ev.Pid != 100 {
		t.Fatalf("first start: pid %d", ev.Pid)
	}
	r.clk.Advance(90 * time.Second)
	r.st.proc().exit(Exit{Code: 3})
	ex := r.expect(t, childExit)
	if ex.Pid != 100 || ex.Reason != reasonExitCode || ex.Exit.Code != 3 || ex.Uptime != 90*time.Second || ex.Restarts != 0 {
		t.Fatalf("exit: %+v", ex)
	}
	rs := r.expect(t, childRestart)
	if rs.Restarts != 1 || rs.Backoff < time.Second || rs.Backoff >= 1250*time.Millisecond {
		t.Fatalf("first restart: %+v, want restarts 1 and a backoff in [1s, 1.25s)", rs)
	}
	if ev := r.restartAfter(t, rs.Backoff); ev.Pid != 101 {
		t.Fatalf("restart: pid %d", ev.Pid)
	}

	r.st.proc().exit(Exit{Code: -1, Signal: "SIGKILL"})
	ex = r.expect(t, childExit)
	if ex.Reason != reasonSignal || ex.Exit.Signal != "SIGKILL" || ex.Restarts != 1 {
		t.Fatalf("exit by a signal: %+v", ex)
	}
	rs = r.expect(t, childRestart)
	if rs.Restarts != 2 || rs.Backoff < 2*time.Second || rs.Backoff >= 2500*time.Millisecond {
		t.Fatalf("second restart: %+v, want restarts 2 and a backoff in [2s, 2.5s)", rs)
	}
	r.restartAfter(t, rs.Backoff)

	r.st.proc().exit(Exit{Code: 0}) // exiting cleanly is still unexpected
	r.expect(t, childExit)
	if rs = r.expect(t, childRestart); rs.Backoff < 4*time.Second || rs.Backoff >= 5*time.Second {
		t.Fatalf("third restart: %+v", rs)
	}
}

// The same seed gives the same jitter; another seed another.
func TestSupervisorJitterIsSeeded(t *testing.T) {
	backoffs := func(seed uint64) []time.Duration {
		st := &fakeStarter{}
		clk := newFakeClock()
		var out []time.Duration
		s := newSupervisor([]string{"x"}, testSupervise(), st.start, clk, seed, zaptest.NewLogger(t), func(ev childEvent) {
			if ev.Kind == childRestart {
				out = append(out, ev.Backoff)
			}
		})
		for range 4 {
			s.afterExit(childEvent{Kind: childExit, Reason: reasonExitCode, Exit: Exit{Code: 1}})
			s.cancelRetry()
		}
		return out
	}
	a, b, c := backoffs(7), backoffs(7), backoffs(8)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("seed 7 twice: %v and %v", a, b)
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Fatalf("seeds 7 and 8 gave the same backoffs %v", a)
	}
}

// max_restarts restarts within the window, then the next exit gives up:
// no restart is scheduled and nothing starts, whatever the clock does.
func TestSupervisorGivesUp(t *testing.T) {
	cfg := testSupervise()
	cfg.MaxRestarts, cfg.Window = 2, time.Minute
	r := startSupervisor(t, cfg, &fakeStarter{})
	r.expect(t, childStart)
	for i := 1; i <= 2; i++ {
		r.st.proc().exit(Exit{Code: 1})
		r.expect(t, childExit)
		rs := r.expect(t, childRestart)
		if rs.Restarts != i {
			t.Fatalf("restart %d: %+v", i, rs)
		}
		r.restartAfter(t, rs.Backoff)
	}
	r.st.proc().exit(Exit{Code: 1})
	if ex := r.expect(t, childExit); ex.Restarts != 2 {
		t.Fatalf("last exit: %+v", ex)
	}
	if g := r.expect(t, childGiveUp); g.Restarts != 2 {
		t.Fatalf("give up: %+v", g)
	}
	if p := r.clk.pending(); len(p) != 0 {
		t.Fatalf("%d timers pending after giving up", len(p))
	}
	r.clk.Advance(time.Hour)
	if err := r.sup.repair(); err != nil { // a round trip through Run: it handled everything before
		t.Fatal(err)
	}
	if ev := r.next(t); ev.Kind != childRepair {
		t.Fatalf("after giving up and an hour: %s %+v, want nothing before the repair", ev.Kind, ev)
	}
}

// Exits further apart than the window never use up the budget, and the
// backoff starts again from backoff_min.
func TestSupervisorWindowSlides(t *testing.T) {
	cfg := testSupervise()
	cfg.MaxRestarts, cfg.Window = 2, time.Minute
	r := startSupervisor(t, cfg, &fakeStarter{})
	r.expect(t, childStart)
	for i := range 5 {
		r.st.proc().exit(Exit{Code: 1})
		r.expect(t, childExit)
		rs := r.expect(t, childRestart)
		if rs.Restarts != 1 || rs.Backoff >= 1250*time.Millisecond {
			t.Fatalf("exit %d, a window after the previous one: %+v, want restart 1 of the window at about backoff_min", i, rs)
		}
		r.restartAfter(t, rs.Backoff)
		r.clk.Advance(time.Minute) // the exit leaves the window
	}
	// Two quick exits within the window: the budget (2) is used up by the
	// second restart, and the third exit gives up.
	for _, want := range []childEventKind{childRestart, childRestart, childGiveUp} {
		r.st.proc().exit(Exit{Code: 1})
		r.expect(t, childExit)
		ev := r.expect(t, want)
		if want == childRestart {
			r.restartAfter(t, ev.Backoff)
		}
	}
}

// Repair after giving up resets the budget and starts the process at once;
// it is refused unless the supervisor gave up, and once it stopped.
func TestSupervisorRepair(t *testing.T) {
	cfg := testSupervise()
	cfg.MaxRestarts = 1
	r := startSupervisor(t, cfg, &fakeStarter{})
	r.expect(t, childStart)
	if err := r.sup.repair(); !errors.Is(err, ErrNotFailed) {
		t.Fatalf("repair while running: %v, want ErrNotFailed", err)
	}
	r.st.proc().exit(Exit{Code: 1})
	r.expect(t, childExit)
	rs := r.expect(t, childRestart)
	if err := r.sup.repair(); !errors.Is(err, ErrNotFailed) {
		t.Fatalf("repair while a restart is pending: %v, want ErrNotFailed", err)
	}
	r.restartAfter(t, rs.Backoff)
	r.st.proc().exit(Exit{Code: 1})
	r.expect(t, childExit)
	r.expect(t, childGiveUp)

	if err := r.sup.repair(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, childRepair)
	if ev := r.expect(t, childStart); ev.Pid != 102 {
		t.Fatalf("start after repair: %+v", ev)
	}
	// The budget is fresh: the next exit is restart 1 of the window, at
	// about backoff_min, although two exits happened moments ago.
	r.st.proc().exit(Exit{Code: 1})
	if ex := r.expect(t, childExit); ex.Restarts != 0 {
		t.Fatalf("exit after repair: %+v", ex)
	}
	if rs := r.expect(t, childRestart); rs.Restarts != 1 || rs.Backoff >= 1250*time.Millisecond {
		t.Fatalf("restart after repair: %+v", rs)
	}

	r.cancel()
	<-r.done
	if err := r.sup.repair(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("repair after Run returned: %v, want ErrNotRunning", err)
	}
}

// On stop: SIGTERM first; SIGKILL only once stop_grace has passed on the
// clock; Run returns after the process has exited.
func TestSupervisorStopOrder(t *testing.T) {
	t.Run("ignores SIGTERM", func(t *testing.T) {
		r := startSupervisor(t, testSupervise(), &fakeStarter{})
		r.expect(t, childStart)
		p := r.st.proc()
		r.cancel()
		// The grace timer is the first timer of this run.
		poll.Until(t, 5*time.Second, "the grace timer", func() bool { return len(r.clk.pending()) > 0 })
		if s := p.signals(); len(s) != 1 || s[0] != syscall.SIGTERM {
			t.Fatalf("signals before stop_grace: %v, want [SIGTERM]", s)
		}
		if d := r.clk.last().d; d != 10*time.Second {
			t.Fatalf("grace timer %s, want stop_grace 10s", d)
		}
		r.clk.Advance(10*time.Second - time.Nanosecond)
		if s := p.signals(); len(s) != 1 {
			t.Fatalf("signals just before stop_grace: %v", s)
		}
		r.clk.Advance(time.Nanosecond)
		ex := r.expect(t, childExit)
		if ex.Reason != reasonStop || !ex.Killed || ex.Exit.Signal != "SIGKILL" {
			t.Fatalf("exit: %+v", ex)
		}
		if s := p.signals(); len(s) != 2 || s[1] != syscall.SIGKILL {
			t.Fatalf("signals: %v, want [SIGTERM SIGKILL]", s)
		}
		<-r.done
	})
	t.Run("exits on SIGTERM", func(t *testing.T) {
		r := startSupervisor(t, testSupervise(), &fakeStarter{exitOnTerm: true})
		r.expect(t, childStart)
		p := r.st.proc()
		r.cancel()
		ex := r.expect(t, childExit)
		if ex.Reason != reasonStop || ex.Killed || ex.Exit.Code != 0 {
			t.Fatalf("exit: %+v", ex)
		}
		<-r.done
		if s := p.signals(); len(s) != 1 || s[0] != syscall.SIGTERM {
			t.Fatalf("signals: %v, want [SIGTERM]", s)
		}
		if len(r.clk.pending()) != 0 {
			t.Fatal("the grace timer was not stopped")
		}
	})
	t.Run("nothing running", func(t *testing.T) {
		r := startSupervisor(t, testSupervise(), &fakeStarter{})
		r.expect(t, childStart)
		r.st.proc().exit(Exit{Code: 1})
		r.expect(t, childExit)
		r.expect(t, childRestart)
		r.cancel()
		<-r.done
		if len(r.clk.pending()) != 0 {
			t.Fatal("the pending restart was not cancelled")
		}
		select {
		case ev := <-r.events:
			t.Fatalf("event after stopping with no process: %+v", ev)
		default:
		}
	})
}

// Once quiesced (the agent drains) nothing is restarted: a pending restart
// is cancelled, and an exit is only reported.
func TestSupervisorQuiesce(t *testing.T) {
	r := startSupervisor(t, testSupervise(), &fakeStarter{})
	r.expect(t, childStart)
	r.st.proc().exit(Exit{Code: 1})
	r.expect(t, childExit)
	rs := r.expect(t, childRestart)
	r.sup.quiesce()
	if err := r.sup.repair(); !errors.Is(err, ErrNotRunning) { // also a round trip: quiesce is handled
		t.Fatalf("repair while quiesced: %v, want ErrNotRunning", err)
	}
	if len(r.clk.pending()) != 0 {
		t.Fatal("the pending restart survived quiesce")
	}
	r.clk.Advance(rs.Backoff)

	// Quiesced while running: the exit is reported, nothing else.
	r2 := startSupervisor(t, testSupervise(), &fakeStarter{})
	r2.expect(t, childStart)
	r2.sup.quiesce()
	r2.st.proc().exit(Exit{Code: 2})
	if ex := r2.expect(t, childExit); ex.Reason != reasonExitCode || ex.Exit.Code != 2 {
		t.Fatalf("exit: %+v", ex)
	}
	r2.cancel()
	<-r2.done
	select {
	case ev := <-r2.events:
		t.Fatalf("event after a quiesced exit: %+v", ev)
	default:
	}
	select {
	case ev := <-r.events:
		t.Fatalf("event after quiesce: %+v", ev)
	default:
	}
}

// A command that cannot be started counts as an exit (start_error) and is
// retried with backoff like one that crashed.
func TestSupervisorStartError(t *testing.T) {
	cfg := testSupervise()
	cfg.MaxRestarts = 1
	notFound := errors.New(`exec: "orders-pipeline": executable file not found in $PATH`)
	r := startSupervisor(t, cfg, &fakeStarter{failures: []error{notFound, notFound}})
	ex := r.expect(t, childExit)
	if ex.Reason != reasonStartError || ex.Err != notFound || ex.Pid != 0 {
		t.Fatalf("exit: %+v", ex)
	}
	rs := r.expect(t, childRestart)
	r.clk.Advance(rs.Backoff)
	r.expect(t, childExit)
	r.expect(t, childGiveUp)
}

// Every path that could restart notices quiesce, and the first to notice
// cancels a pending restart; Run's loop is not needed for it.
func TestSupervisorQuiesceNoticed(t *testing.T) {
	clk := newFakeClock()
	st := &fakeStarter{}
	var events []childEvent
	s := newSupervisor([]string{"x"}, testSupervise(), st.start, clk, 1, zaptest.NewLogger(t), func(ev childEvent) { events = append(events, ev) })
	s.afterExit(childEvent{Kind: childExit, Reason: reasonExitCode, Exit: Exit{Code: 1}})
	if len(clk.pending()) != 1 {
		t.Fatal("no restart pending")
	}
	s.quiesce()
	if err := s.onRepair(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("repair: %v", err)
	}
	if len(clk.pending()) != 0 {
		t.Fatal("the pending restart survived")
	}
	s.afterExit(childEvent{Kind: childExit, Reason: reasonExitCode, Exit: Exit{Code: 1}})
	if len(clk.pending()) != 0 || events[len(events)-1].Kind != childExit {
		t.Fatalf("after an exit while quiesced: %d timers, last event %+v", len(clk.pending()), events[len(events)-1])
	}
}

// A rolling restart's restart stops the process (SIGTERM: an exit the
// agent asked for, using no restart budget) and starts a new one; once
// the agent is shutting down it is refused.
func TestSupervisorRestart(t *testing.T) {
	r := startSupervisor(t, testSupervise(), &fakeStarter{exitOnTerm: true})
	first := r.expect(t, childStart)
	p := r.st.proc()
	done := make(chan error, 1)
	go func() { done <- r.sup.restart() }()
	ex := r.expect(t, childExit)
	if ex.Reason != reasonStop || ex.unexpected() || ex.Restarts != 0 {
		t.Fatalf("exit of a restart: %+v", ex)
	}
	if s := p.signals(); len(s) != 1 || s[0] != syscall.SIGTERM {
		t.Fatalf("signals: %v, want [SIGTERM]", s)
	}
	if st := r.expect(t, childStart); st.Pid == first.Pid {
		t.Fatalf("the restart started no new process: %+v", st)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.sup.quiesce()
	if err := r.sup.restart(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("restart while quiesced: %v, want ErrNotRunning", err)
	}
	r.cancel()
	<-r.done
}

// A pause (set stop) stops the process like a shutdown (SIGTERM, SIGKILL
// after stop_grace), uses no restart budget and starts nothing until
// resume; resume starts a fresh process with a fresh budget. Repair and
// a rolling restart are refused while paused.
func TestSupervisorPauseResume(t *testing.T) {
	cfg := testSupervise()
	cfg.MaxRestarts = 1
	r := startSupervisor(t, cfg, &fakeStarter{})
	r.expect(t, childStart)
	// One restart used: the budget is spent.
	r.st.proc().exit(Exit{Code: 1})
	r.expect(t, childExit)
	r.restartAfter(t, r.expect(t, childRestart).Backoff)
	p := r.st.proc()

	paused := make(chan error, 1)
	go func() { paused <- r.sup.pause() }()
	poll.Until(t, 5*time.Second, "the grace timer", func() bool { return len(r.clk.pending()) == 1 })
	if s := p.signals(); len(s) != 1 || s[0] != syscall.SIGTERM {
		t.Fatalf("signals before stop_grace: %v, want [SIGTERM]", s)
	}
	r.clk.Advance(cfg.StopGrace)
	ex := r.expect(t, childExit)
	if ex.Reason != reasonStop || ex.unexpected() || !ex.Killed {
		t.Fatalf("exit of a pause: %+v", ex)
	}
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if err := r.sup.pause(); err != nil { // nothing runs: at once
		t.Fatalf("pause again: %v", err)
	}
	if err := r.sup.repair(); !errors.Is(err, ErrNotFailed) {
		t.Fatalf("repair while paused: %v, want ErrNotFailed", err)
	}
	if err := r.sup.restart(); !errors.Is(err, errPaused) {
		t.Fatalf("restart while paused: %v, want errPaused", err)
	}
	r.clk.Advance(time.Hour)
	if err := r.sup.pause(); err != nil { // a round trip: Run handled the hour
		t.Fatal(err)
	}
	select {
	case ev := <-r.events:
		t.Fatalf("event while paused: %+v", ev)
	default:
	}

	if err := r.sup.resume(); err != nil {
		t.Fatal(err)
	}
	if ev := r.expect(t, childStart); ev.Pid != 102 {
		t.Fatalf("start after resume: %+v", ev)
	}
	// A fresh budget: the next exit is restart 1, not a give-up.
	r.st.proc().exit(Exit{Code: 1})
	if ex := r.expect(t, childExit); ex.Restarts != 0 {
		t.Fatalf("exit after resume: %+v", ex)
	}
	if rs := r.expect(t, childRestart); rs.Restarts != 1 {
		t.Fatalf("restart after resume: %+v", rs)
	}
	// Resume while not paused and a restart is pending: the process
	// starts now, and the pending restart is cancelled.
	if err := r.sup.resume(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, childStart)
	if len(r.clk.pending()) != 0 {
		t.Fatal("the pending restart survived resume")
	}
	// Resume while a process runs changes nothing.
	if err := r.sup.resume(); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-r.events:
		t.Fatalf("event after resuming a running process: %+v", ev)
	default:
	}
}

// A pause forgets a give-up, and resume starts the process again; once
// the agent shuts down (quiesce) both are refused, and shutdown with a
// paused supervisor stops nothing.
func TestSupervisorPauseAfterGiveUp(t *testing.T) {
	cfg := testSupervise()
	cfg.MaxRestarts = 0
	r := startSupervisor(t, cfg, &fakeStarter{exitOnTerm: true})
	r.expect(t, childStart)
	r.st.proc().exit(Exit{Code: 1})
	r.expect(t, childExit)
	r.expect(t, childGiveUp)
	if err := r.sup.pause(); err != nil {
		t.Fatal(err)
	}
	if err := r.sup.repair(); !errors.Is(err, ErrNotFailed) {
		t.Fatalf("repair while paused after a give-up: %v, want ErrNotFailed", err)
	}
	if err := r.sup.resume(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, childStart)
	if err := r.sup.pause(); err != nil {
		t.Fatal(err)
	}
	r.expect(t, childExit)

	r.sup.quiesce()
	if err := r.sup.resume(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("resume while shutting down: %v, want ErrNotRunning", err)
	}
	if err := r.sup.pause(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("pause while shutting down: %v, want ErrNotRunning", err)
	}
	r.cancel()
	<-r.done
	if err := r.sup.resume(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("resume after Run: %v, want ErrNotRunning", err)
	}
	select {
	case ev := <-r.events:
		t.Fatalf("event after stopping a paused supervisor: %+v", ev)
	default:
	}
}
