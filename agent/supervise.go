package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Supervision (`keyway agent … -- CMD ARGS…`): the agent runs the
// replica's command, restarts it when it exits unexpectedly (jittered
// exponential backoff), gives up after supervise.max_restarts restarts
// within supervise.window (lifecycle state failed, until Repair), and on
// shutdown stops it only once the replica has drained: SIGTERM to its
// process group, SIGKILL after supervise.stop_grace. A set stop pauses it
// (the process is stopped the same way and not restarted, using no restart
// budget) until a set start resumes it with a fresh process.
//
// The supervisor is a loop on its own goroutine that owns the process. It
// knows nothing of gossip or lifecycle states: it counts every start,
// exit, scheduled restart, give-up and repair (keyway_agent_child_*) and
// reports it to a callback (the agent's onChild), in order, from its
// goroutine. The process is reached through
// Process and StartFunc, and time through clock, so that the state
// machine is tested with a fake process and a fake clock; StartCommand
// (exec_unix.go) is the real one.

// Process is one run of the supervised command. Wait is called once, on a
// goroutine of its own, while Signal may be called concurrently.
type Process interface {
	// Pid is the process ID, for logs and the audit trail.
	Pid() int
	// Wait blocks until the process has exited and returns how it ended.
	Wait() Exit
	// Signal sends sig to the process and the rest of its process group.
	Signal(sig syscall.Signal) error
}

// StartFunc starts one run of the command argv (argv[0] is the program).
// An error means no process was started.
type StartFunc func(argv []string) (Process, error)

// Exit says how a process ended. It is a plain value.
type Exit struct {
	// Code is the exit code, or -1 when a signal ended the process.
	Code int
	// Signal names the signal that ended the process ("SIGKILL"), or is
	// empty when it exited by itself.
	Signal string
}

// Errors of Agent.Repair.
var (
	// ErrNotSupervising: the agent runs no command (no -- CMD).
	ErrNotSupervising = errors.New("agent: no replica process is supervised (start the agent with -- CMD ARGS)")
	// ErrNotFailed: the supervisor has not given up, so there is nothing
	// to repair.
	ErrNotFailed = errors.New("agent: the replica process has not been given up on; nothing to repair")
	// ErrNotRunning: Run is not running, or the agent is shutting down.
	ErrNotRunning = errors.New("agent: not running, or shutting down")
)

// childEventKind is what happened to the supervised process.
type childEventKind uint8

const (
	childStart   childEventKind = iota + 1 // a process started
	childExit                              // a process ended, or could not be started
	childRestart                           // a restart is scheduled after Backoff
	childGiveUp                            // too many restarts within the window: no more
	childRepair                            // Repair reset the budget; a start follows
)

func (k childEventKind) String() string {
	switch k {
	case childStart:
		return "start"
	case childExit:
		return "exit"
	case childRestart:
		return "restart"
	case childGiveUp:
		return "give_up"
	case childRepair:
		return "repair"
	}
	return "unknown"
}

// How a process ended: the reason label of keyway_agent_child_exits_total
// and the reason field of the log line and the audit event.
const (
	reasonExitCode   = "exit_code"   // it exited by itself, with any code
	reasonSignal     = "signal"      // a signal the agent did not send ended it
	reasonStop       = "stop"        // the agent stopped it (shutdown, rolling restart, set stop)
	reasonStartError = "start_error" // it could not be started at all
)

var exitReasons = []string{reasonExitCode, reasonSignal, reasonStop, reasonStartError}

// childEvent is one report of the supervisor. A plain value.
type childEvent struct {
	Kind childEventKind
	Pid  int // start, exit (0 for start_error)
	// Exit, Reason, Err (start_error), Uptime and Killed (SIGKILL after
	// stop_grace) describe an exit.
	Exit   Exit
	Reason string
	Err    error
	Uptime time.Duration
	Killed bool
	// Restarts counts restarts within the window: made so far (exit,
	// give_up), or including the one scheduled (restart).
	Restarts int
	Backoff  time.Duration // restart
}

// unexpected reports whether e is an exit the agent did not ask for.
func (e childEvent) unexpected() bool { return e.Kind == childExit && e.Reason != reasonStop }

// budget counts unexpected exits within a sliding window: the restarts
// made for them, and when to give up. A plain value without a clock.
type budget struct {
	window time.Duration
	max    int         // restarts allowed within window
	exits  []time.Time // unexpected exits within the window, oldest first
}

// exit records an unexpected exit at now. It returns n, the number of
// unexpected exits within the window (now-window, now], this one
// included, which is also the number of the restart this exit would
// need; and giveUp when that restart is over the budget (n > max).
func (b *budget) exit(now time.Time) (n int, giveUp bool) {
	b.prune(now)
	b.exits = append(b.exits, now)
	return len(b.exits), len(b.exits) > b.max
}

// used returns the restarts made within the window at now.
func (b *budget) used(now time.Time) int {
	b.prune(now)
	return min(len(b.exits), b.max)
}

func (b *budget) prune(now time.Time) {
	cut := now.Add(-b.window)
	i := 0
	for i < len(b.exits) && !b.exits[i].After(cut) {
		i++
	}
	b.exits = append(b.exits[:0], b.exits[i:]...)
}

// reset forgets every exit (a repair).
func (b *budget) reset() { b.exits = b.exits[:0] }

// backoff returns the delay before the n-th restart within the window
// (n >= 1): lo doubled n-1 times, capped at hi, plus jitter (in [0, 1))
// times a quarter of that. It is a pure function.
func backoff(lo, hi time.Duration, n int, jitter float64) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d + time.Duration(float64(d)/4*jitter)
}

// clock is the supervisor's time: real, or a fake in tests.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

// timer is the part of *time.Timer the supervisor uses.
type timer interface {
	C() <-chan time.Time
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// errPaused: a set stop paused the supervisor; only a set start (resume)
// starts the process again.
var errPaused = errors.New("agent: the replica's set is stopped; its process stays stopped until the set is started")

// Supervisor runs the replica's command; see the top of this file. Build it
// with NewSupervisor and hand it to Agent.Supervise, which runs it; repair,
// restart, pause, resume and quiesce are safe for concurrent use. It must
// not be copied.
type Supervisor struct {
	argv    []string
	cfg     SuperviseConfig
	start   StartFunc
	clock   clock
	log     *zap.Logger
	metrics *childMetrics // nil: not counted
	// emit receives every event, in order, on run's goroutine. It must
	// not block for long, and must not call the supervisor.
	emit func(childEvent)

	repairs    chan chan error
	restarts   chan chan error
	pauses     chan chan error
	resumes    chan chan error
	quiesceC   chan struct{} // closed by quiesce
	quiesceOne sync.Once
	running    atomic.Bool   // run is running
	done       chan struct{} // closed when run returns

	// Owned by run's goroutine.
	rnd      *rand.Rand
	budget   budget
	proc     Process
	exited   chan Exit // the current process's Wait result
	since    time.Time // when the current process started
	retry    timer     // the pending restart, or nil
	failed   bool      // gave up; until a repair
	quiesced bool      // no more restarts: the agent is shutting down
	paused   bool      // stopped on purpose (a set stop); until resume
}

// SupervisorOptions are a Supervisor's dependencies. All are optional.
type SupervisorOptions struct {
	// Start starts the command; nil means StartCommand(os.Stdout,
	// os.Stderr). Tests pass a fake.
	Start StartFunc
	// Seed seeds the restart backoff's jitter; 0 means a random one, so
	// that agents restarted together do not restart their processes in
	// step.
	Seed uint64
	// Logger receives the supervisor's logs; nil means none.
	Logger *zap.Logger
	// Registerer receives the keyway_agent_child_* metrics; nil means
	// they are not registered.
	Registerer prometheus.Registerer
}

// NewSupervisor builds the supervisor of argv (Config.Command, not empty)
// with cfg (Config.Supervise, validated). It starts nothing: the agent
// runs it (Agent.Supervise).
func NewSupervisor(argv []string, cfg SuperviseConfig, opts SupervisorOptions) (*Supervisor, error) {
	if len(argv) == 0 {
		return nil, errors.New("agent: no command to supervise")
	}
	m := newChildMetrics()
	if opts.Registerer != nil {
		if err := m.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("agent metrics: %w", err)
		}
	}
	start := opts.Start
	if start == nil {
		start = StartCommand(os.Stdout, os.Stderr)
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s := newSupervisor(slices.Clone(argv), cfg, start, realClock{}, seed, cmp.Or(opts.Logger, zap.NewNop()), nil)
	s.metrics = m
	return s, nil
}

// newSupervisor builds a Supervisor with its clock and emit given; tests
// build theirs with it.
func newSupervisor(argv []string, cfg SuperviseConfig, start StartFunc, c clock, seed uint64, log *zap.Logger, emit func(childEvent)) *Supervisor {
	return &Supervisor{
		argv: argv, cfg: cfg, start: start, clock: c, log: log, emit: emit,
		repairs:  make(chan chan error),
		restarts: make(chan chan error),
		pauses:   make(chan chan error),
		resumes:  make(chan chan error),
		quiesceC: make(chan struct{}),
		done:     make(chan struct{}),
		rnd:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		budget:   budget{window: cfg.Window, max: cfg.MaxRestarts},
	}
}

// run starts the command, then restarts it after every unexpected exit
// (or gives up) until ctx is done; then it stops the process (SIGTERM,
// SIGKILL after stop_grace), waits for it to exit, and returns. The agent
// calls it once.
func (s *Supervisor) run(ctx context.Context) {
	s.running.Store(true)
	defer close(s.done)
	defer s.running.Store(false)
	defer func() {
		if v := recover(); v != nil {
			// The process, if any, keeps running unsupervised.
			s.log.Error("supervisor panicked", zap.Any("panic", v), zap.ByteString("stack", debug.Stack()))
		}
	}()
	s.launch()
	for {
		var retryC <-chan time.Time
		if s.retry != nil {
			retryC = s.retry.C()
		}
		select {
		case <-ctx.Done():
			s.cancelRetry()
			s.stop()
			return
		case ex := <-s.exited:
			s.onExit(ex)
		case <-retryC:
			s.retry = nil
			if !s.checkQuiesced() {
				s.launch()
			}
		case reply := <-s.repairs:
			reply <- s.onRepair()
		case reply := <-s.restarts:
			reply <- s.onRestart()
		case reply := <-s.pauses:
			reply <- s.onPause()
		case reply := <-s.resumes:
			reply <- s.onResume()
		case <-s.quiesceC:
			s.quiesceC, s.quiesced = nil, true
			s.cancelRetry()
		}
	}
}

// report counts ev and hands it to emit.
func (s *Supervisor) report(ev childEvent) {
	if s.metrics != nil {
		s.metrics.count(ev)
	}
	s.emit(ev)
}

// quiesce tells the supervisor to restart the process no more: the agent
// is draining. The process keeps running until Run's ctx is done.
func (s *Supervisor) quiesce() {
	s.quiesceOne.Do(func() { close(s.quiesceC) })
}

// repair asks Run to reset the restart budget and start the process
// again after giving up.
func (s *Supervisor) repair() error {
	if !s.running.Load() {
		return ErrNotRunning
	}
	reply := make(chan error, 1)
	select {
	case s.repairs <- reply:
		return <-reply
	case <-s.done:
		return ErrNotRunning
	}
}

// restart asks Run to stop the process (SIGTERM, SIGKILL after
// stop_grace) and start it again: a rolling restart. The stop is not an
// unexpected exit and uses no restart budget.
func (s *Supervisor) restart() error {
	if !s.running.Load() {
		return ErrNotRunning
	}
	reply := make(chan error, 1)
	select {
	case s.restarts <- reply:
		return <-reply
	case <-s.done:
		return ErrNotRunning
	}
}

// pause asks Run to stop the process (SIGTERM, SIGKILL after stop_grace)
// and to start none until resume: the replica's set is stopped. The stop
// is not an unexpected exit: it uses no restart budget and never leads to
// a give-up; a pending restart is cancelled and a give-up forgotten. It
// returns once the process has exited (at once when none runs), or
// ErrNotRunning once the agent is shutting down (its drain stops the
// process) or Run has returned.
func (s *Supervisor) pause() error { return s.ask(s.pauses) }

// resume ends a pause: unless a process still runs (a set stop abandoned
// before it stopped the process), it starts a fresh one at once with a
// fresh restart budget, whatever happened before (a give-up, a pending
// restart). It returns once the start has been attempted (a failed start
// counts as an exit, with backoff), or ErrNotRunning as pause does.
func (s *Supervisor) resume() error { return s.ask(s.resumes) }

// ask sends a request to Run and waits for its answer. Unlike repair and
// restart it does not fail before Run has started: the agent asks only
// after starting it, and the request waits for Run's loop.
func (s *Supervisor) ask(c chan chan error) error {
	reply := make(chan error, 1)
	select {
	case c <- reply:
		return <-reply
	case <-s.done:
		return ErrNotRunning
	}
}

func (s *Supervisor) onPause() error {
	if s.checkQuiesced() {
		return ErrNotRunning
	}
	s.paused, s.failed = true, false
	s.cancelRetry()
	s.stop()
	return nil
}

func (s *Supervisor) onResume() error {
	if s.checkQuiesced() {
		return ErrNotRunning
	}
	s.paused = false
	if s.proc != nil {
		return nil
	}
	s.cancelRetry()
	s.failed = false
	s.budget.reset()
	s.launch()
	return nil
}

func (s *Supervisor) onRestart() error {
	if s.checkQuiesced() {
		return ErrNotRunning
	}
	if s.paused {
		return errPaused
	}
	s.cancelRetry()
	s.stop()
	s.failed = false
	s.launch()
	return nil
}

func (s *Supervisor) onRepair() error {
	switch {
	case s.checkQuiesced():
		return ErrNotRunning
	case !s.failed: // also while paused: pause forgets a give-up
		return ErrNotFailed
	}
	s.failed = false
	s.budget.reset()
	s.report(childEvent{Kind: childRepair})
	s.launch()
	return nil
}

// launch starts a process; a failure to start counts as an unexpected
// exit.
func (s *Supervisor) launch() {
	p, err := s.start(s.argv)
	if err != nil {
		s.afterExit(childEvent{Kind: childExit, Exit: Exit{Code: -1}, Reason: reasonStartError, Err: err})
		return
	}
	s.proc, s.since = p, s.clock.Now()
	exited := make(chan Exit, 1)
	s.exited = exited
	go func() { exited <- p.Wait() }()
	s.report(childEvent{Kind: childStart, Pid: p.Pid()})
}

// onExit handles an exit the supervisor did not cause.
func (s *Supervisor) onExit(ex Exit) {
	ev := childEvent{Kind: childExit, Pid: s.proc.Pid(), Exit: ex, Reason: reasonExitCode, Uptime: s.clock.Now().Sub(s.since)}
	if ex.Signal != "" {
		ev.Reason = reasonSignal
	}
	s.proc, s.exited = nil, nil
	s.afterExit(ev)
}

// afterExit reports an unexpected exit, then schedules a restart or gives
// up. Once quiesced it only reports.
func (s *Supervisor) afterExit(ev childEvent) {
	if s.checkQuiesced() {
		ev.Restarts = s.budget.used(s.clock.Now())
		s.report(ev)
		return
	}
	n, giveUp := s.budget.exit(s.clock.Now())
	ev.Restarts = n - 1
	s.report(ev)
	if giveUp {
		s.failed = true
		s.report(childEvent{Kind: childGiveUp, Restarts: n - 1})
		return
	}
	d := backoff(s.cfg.BackoffMin, s.cfg.BackoffMax, n, s.rnd.Float64())
	s.retry = s.clock.NewTimer(d)
	s.report(childEvent{Kind: childRestart, Restarts: n, Backoff: d})
}

// checkQuiesced reports whether quiesce was called; the first time it
// notices, it cancels a pending restart.
func (s *Supervisor) checkQuiesced() bool {
	if !s.quiesced && s.quiesceC != nil {
		select {
		case <-s.quiesceC:
			s.quiesceC, s.quiesced = nil, true
			s.cancelRetry()
		default:
		}
	}
	return s.quiesced
}

func (s *Supervisor) cancelRetry() {
	if s.retry != nil {
		s.retry.Stop()
		s.retry = nil
	}
}

// stop ends the running process, if any: SIGTERM to its group, then
// SIGKILL once stop_grace has passed, and waits for it to exit.
func (s *Supervisor) stop() {
	if s.proc == nil {
		return
	}
	pid := s.proc.Pid()
	s.log.Info("stopping replica process", zap.Int("pid", pid), zap.Duration("grace", s.cfg.StopGrace))
	if err := s.proc.Signal(syscall.SIGTERM); err != nil {
		s.log.Debug("SIGTERM not delivered", zap.Int("pid", pid), zap.Error(err))
	}
	grace := s.clock.NewTimer(s.cfg.StopGrace)
	ev := childEvent{Kind: childExit, Pid: pid, Reason: reasonStop}
	select {
	case ev.Exit = <-s.exited:
		grace.Stop()
	case <-grace.C():
		s.log.Warn("replica process still running after supervise.stop_grace; sending SIGKILL", zap.Int("pid", pid), zap.Duration("grace", s.cfg.StopGrace))
		if err := s.proc.Signal(syscall.SIGKILL); err != nil {
			s.log.Debug("SIGKILL not delivered", zap.Int("pid", pid), zap.Error(err))
		}
		ev.Killed = true
		ev.Exit = <-s.exited
	}
	ev.Uptime = s.clock.Now().Sub(s.since)
	ev.Restarts = s.budget.used(s.clock.Now())
	s.proc, s.exited = nil, nil
	s.report(ev)
}
