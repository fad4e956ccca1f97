package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The restart mode (-restarts): what an operator's restart or upgrade of
// a proxy costs in requests. For each case and round, a fresh proxy
// process serves keyed POSTs sent open loop (restartLoad); -restart-before
// into the load the harness performs the case's operation, waits until it
// is over (the new process accepts, the old one has exited), and keeps the
// load on for -restart-after. Every request's outcome is recorded, and
// the run reports what failed, by class and by when it was sent relative
// to the signal, with the times of the operation's events.
//
//	sigterm-start   SIGTERM, then start the new process at once, again every
//	                -restart-retry while it cannot bind the port
//	wait-start      SIGTERM, wait for the exit, start (systemctl restart
//	                without a socket unit)
//	activated       as wait-start, but the harness holds the listening socket
//	                and passes it to each process as systemd does (LISTEN_FDS)
//	upgrade         SIGUSR2: keyway's binary upgrade (tableflip)
//	sighup          SIGHUP: a configuration reload, the zero baseline
//	sigterm-exit    SIGTERM alone, once per -restart-exit-drain-idle value:
//	                the time to exit under load
//	haproxy-reload  HAProxy's master-worker reload (SIGUSR2 to the master);
//	                haproxy-reload-idle-close adds option idle-close-on-response

// restartCaseNames are the cases, in the order they run and are reported.
var restartCaseNames = []string{"sigterm-start", "wait-start", "activated", "upgrade", "sighup", "sigterm-exit", "haproxy-reload", "haproxy-reload-idle-close"}

// RestartConfig is the restart mode's shape; see the -restart-* flags.
type RestartConfig struct {
	Cases   []string      `json:"cases"`
	Rate    int           `json:"rate"`           // requests per second, open loop
	Conns   int           `json:"conns"`          // the client pool's connections, at most
	Before  time.Duration `json:"before"`         // load before the signal
	After   time.Duration `json:"after"`          // load after the operation is over
	Timeout time.Duration `json:"client_timeout"` // the client gives a request up after this
	// DrainIdle is keyway's server.drain_idle in every case but
	// sigterm-exit, which runs once with each of ExitDrainIdles.
	DrainIdle      time.Duration   `json:"drain_idle"`
	ExitDrainIdles []time.Duration `json:"exit_drain_idles"`
	// ShutdownTimeout is keyway's server.shutdown_timeout and HAProxy's
	// hard-stop-after: the longest a stop may take.
	ShutdownTimeout time.Duration `json:"shutdown_timeout"`
	Retry           time.Duration `json:"start_retry"` // sigterm-start: a failed start is retried after this
	// Warm opens all Conns connections of the client pool before the
	// load (warmPool) and leaves them idle for warmIdle: then all but
	// the few the load keeps busy are idle when the signal comes, longer
	// than keyway's server.park_idle_after (2s), so parked.
	Warm bool `json:"warm_pool"`
	// IdleConns more keep-alive connections are opened before the load,
	// each carrying one request, and then stay silent to the end: clients
	// that hold a connection but send nothing, which a stopping proxy
	// keeps for its grace (keyway's drain_idle) or closes.
	IdleConns int `json:"idle_conns"`
}

// warmIdle is how long the warmed pool stays idle before the load starts.
const warmIdle = time.Second

func (c *RestartConfig) validate() error {
	var errs []error
	if c.Rate < 1 || c.Rate > 100000 {
		errs = append(errs, fmt.Errorf("-restart-rate %d: want 1..100000", c.Rate))
	}
	if c.Conns < 1 || c.IdleConns < 0 {
		errs = append(errs, fmt.Errorf("-restart-conns %d, -restart-idle-conns %d: want at least 1 and 0", c.Conns, c.IdleConns))
	}
	if c.Before < 100*time.Millisecond || c.After < 0 || c.Timeout < 100*time.Millisecond {
		errs = append(errs, errors.New("-restart-before and -restart-timeout must be at least 100ms, -restart-after at least 0"))
	}
	for _, d := range append([]time.Duration{c.DrainIdle}, c.ExitDrainIdles...) {
		if d < 0 || d > 10*time.Minute {
			errs = append(errs, fmt.Errorf("drain_idle %v: want 0..10m (keyway's range)", d))
		}
	}
	if c.ShutdownTimeout < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("-restart-shutdown-timeout %v: must be at least 100ms (keyway's floor)", c.ShutdownTimeout))
	}
	if c.Retry < time.Millisecond {
		errs = append(errs, fmt.Errorf("-restart-retry %v: must be at least 1ms", c.Retry))
	}
	if len(c.Cases) == 0 {
		errs = append(errs, errors.New("-restart-cases: no case"))
	}
	for _, n := range c.Cases {
		if !slices.Contains(restartCaseNames, n) {
			errs = append(errs, fmt.Errorf("-restart-cases: unknown case %q (known: %s)", n, strings.Join(restartCaseNames, ", ")))
		}
	}
	if slices.Contains(c.Cases, "sigterm-exit") && len(c.ExitDrainIdles) == 0 {
		errs = append(errs, errors.New("sigterm-exit needs at least one -restart-exit-drain-idle value"))
	}
	return errors.Join(errs...)
}

// parseCases reads -restart-cases: comma-separated names, "all" for every
// case; the order is restartCaseNames'.
func parseCases(s string) []string {
	var want []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "all" {
			return slices.Clone(restartCaseNames)
		} else if f != "" && !slices.Contains(want, f) {
			want = append(want, f)
		}
	}
	slices.SortStableFunc(want, func(a, b string) int {
		return cmpIndex(slices.Index(restartCaseNames, a), slices.Index(restartCaseNames, b))
	})
	return want
}

// cmpIndex orders indexes, unknown ones (-1) last.
func cmpIndex(a, b int) int {
	if a < 0 {
		a = 1 << 30
	}
	if b < 0 {
		b = 1 << 30
	}
	return a - b
}

// parseDurations reads a comma-separated list of durations (5s,1s).
func parseDurations(flagName, s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// restartTargetConfig is what a proxy's configuration gets in the restart
// mode (keywayConfig, haproxyConfig).
type restartTargetConfig struct {
	drainIdle       time.Duration // keyway's server.drain_idle
	shutdownTimeout time.Duration // keyway's server.shutdown_timeout, HAProxy's hard-stop-after
	idleClose       bool          // HAProxy: option idle-close-on-response
}

// restartCase is one case as it runs: a kind of operation on a target.
type restartCase struct {
	name      string // in the report: "upgrade", "sigterm-exit drain_idle=1s"
	kind      string // one of restartCaseNames
	target    *target
	drainIdle time.Duration // keyway
	idleClose bool          // HAProxy
}

// restartCases expands the configured cases over the targets at hand:
// keyway's cases need keyway; HAProxy's are skipped with a note when it
// is not installed or not among -targets.
func restartCases(c RestartConfig, targets []*target) (cases []restartCase, notes []string) {
	find := func(name string) *target {
		for _, t := range targets {
			if t.name == name {
				return t
			}
		}
		return nil
	}
	kw, hap := find("keyway"), find("haproxy")
	for _, kind := range c.Cases {
		switch {
		case strings.HasPrefix(kind, "haproxy"):
			if hap == nil {
				notes = append(notes, kind+" skipped: haproxy not installed or not in -targets")
				continue
			}
			cases = append(cases, restartCase{name: kind, kind: "haproxy-reload", target: hap, idleClose: kind == "haproxy-reload-idle-close"})
		case kw == nil:
			notes = append(notes, kind+" skipped: keyway not in -targets")
		case kind == "sigterm-exit":
			for _, d := range c.ExitDrainIdles {
				cases = append(cases, restartCase{name: "sigterm-exit drain_idle=" + d.String(), kind: kind, target: kw, drainIdle: d})
			}
		default:
			cases = append(cases, restartCase{name: kind, kind: kind, target: kw, drainIdle: c.DrainIdle})
		}
	}
	return cases, notes
}

// RestartRun is one case in one round. Times are in milliseconds from the
// signal (a negative send time: sent before it).
type RestartRun struct {
	Round     int     `json:"round"`
	Case      string  `json:"case"`
	Target    string  `json:"target"`
	DrainIdle string  `json:"drain_idle,omitempty"` // keyway's server.drain_idle
	LoadAvg   string  `json:"loadavg"`
	Seconds   float64 `json:"seconds"` // the load's length
	// What the load sent and got: Failed = every request without a 2xx
	// answer, Errors by class (no answer), NonOK by status (an answer
	// other than 2xx). FailedBefore is those sent before the signal.
	Sent         int            `json:"sent"`
	OK           int            `json:"ok_2xx"`
	Failed       int            `json:"failed"`
	Errors       map[string]int `json:"errors,omitempty"`
	NonOK        map[string]int `json:"non_2xx,omitempty"`
	FailedBefore int            `json:"failed_before_signal"`
	// The send times of the first and last failed request.
	FirstFailMs *float64 `json:"first_failure_sent_ms,omitempty"`
	LastFailMs  *float64 `json:"last_failure_sent_ms,omitempty"`
	// Latency of the 2xx answers, from each request's scheduled send.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
	// SendLagMaxMs is how late the load sent its latest request against
	// the schedule (the load side's stalls).
	SendLagMaxMs float64 `json:"send_lag_max_ms"`
	// ReadyMs: the new process's first accept (keyway: its "proxy
	// listening" line, logged once it accepts; sighup: "configuration
	// reloaded"; HAProxy: the master's "Loading success." as the harness
	// read it). OldExitMs: the old process's exit (HAProxy: the old
	// worker's). StartAfterExitMs: ReadyMs − OldExitMs.
	ReadyMs          *float64 `json:"ready_ms,omitempty"`
	OldExitMs        *float64 `json:"old_exit_ms,omitempty"`
	StartAfterExitMs *float64 `json:"ready_after_old_exit_ms,omitempty"`
	// OldExited: the old process exited within the shutdown timeout and
	// ten seconds; OldExitStatus is how.
	OldExited     *bool  `json:"old_exited,omitempty"`
	OldExitStatus string `json:"old_exit_status,omitempty"`
	// Attempts is sigterm-start's starts until one could bind.
	Attempts     int    `json:"start_attempts,omitempty"`
	AttemptError string `json:"failed_start_error,omitempty"`
	// Events are the processes' log lines that time the operation, in ms
	// from the signal ("old: proxy shutting down", ...).
	Events map[string]float64 `json:"events_ms,omitempty"`
	// The old keyway process's drain: connections still open when the
	// grace ended, and idle ones closed then ("proxy drained").
	DrainOpenAfterGrace *int `json:"open_after_grace,omitempty"`
	DrainClosedWaiting  *int `json:"closed_waiting,omitempty"`
	// The kernel's TcpExt ListenOverflows and ListenDrops
	// (/proc/net/netstat, the whole network namespace) over the run.
	ListenOverflows int64 `json:"listen_overflows"`
	ListenDrops     int64 `json:"listen_drops"`
	// IdleConns silent connections were open before the signal
	// (-restart-idle-conns); IdleClosed of them had been closed by the
	// proxy when the load ended.
	IdleConns  int `json:"idle_conns,omitempty"`
	IdleClosed int `json:"idle_closed,omitempty"`
	// ReplicaRequests is what the replicas served over the load.
	ReplicaRequests int64            `json:"replica_requests"`
	Failures        []restartFailure `json:"failures,omitempty"` // the first maxFailuresListed of each class
	Notes           []string         `json:"notes,omitempty"`
	Failure         string           `json:"failure,omitempty"` // the run could not be completed
}

// restartFailure is one request without a 2xx answer.
type restartFailure struct {
	SentMs float64 `json:"sent_ms"` // scheduled send, from the signal
	DoneMs float64 `json:"done_ms"` // when it failed, from the signal
	Class  string  `json:"class"`   // an error class, or "status"
	Status int     `json:"status,omitempty"`
	Reused bool    `json:"reused_conn"`     // on a connection that had carried a request
	Wrote  bool    `json:"request_written"` // the request was written whole
	Error  string  `json:"error,omitempty"`
}

// maxFailuresListed bounds the failures of one class (or of the non-2xx
// answers) kept per run.
const maxFailuresListed = 100

// msOf is d in milliseconds.
func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ptr[T any](v T) *T { return &v }

// countOutcomes fills run's request figures from the load's outcomes;
// sig is the signal's time from the load's start.
func countOutcomes(run *RestartRun, outs []reqOutcome, sig time.Duration) {
	run.Sent, run.OK, run.Failed, run.FailedBefore = len(outs), 0, 0, 0
	run.Errors, run.NonOK, run.Failures = nil, nil, nil
	var lat []time.Duration
	var lag time.Duration
	listed := map[string]int{}
	for _, o := range outs {
		lag = max(lag, o.Lag)
		if !o.failed() {
			run.OK++
			lat = append(lat, o.Latency)
			continue
		}
		run.Failed++
		if o.Due < sig {
			run.FailedBefore++
		}
		f := restartFailure{SentMs: msOf(o.Due - sig), DoneMs: msOf(o.Due + o.Latency - sig), Class: o.Class, Reused: o.Reused, Wrote: o.Wrote, Error: o.Err}
		if o.Class == "" {
			f.Class, f.Status = "status", o.Status
			if run.NonOK == nil {
				run.NonOK = map[string]int{}
			}
			run.NonOK[strconv.Itoa(o.Status)]++
		} else {
			if run.Errors == nil {
				run.Errors = map[string]int{}
			}
			run.Errors[o.Class]++
		}
		if run.FirstFailMs == nil {
			run.FirstFailMs = ptr(f.SentMs)
		}
		run.LastFailMs = ptr(f.SentMs)
		if listed[f.Class]++; listed[f.Class] <= maxFailuresListed {
			run.Failures = append(run.Failures, f)
		}
	}
	run.SendLagMaxMs = msOf(lag)
	if len(lat) > 0 {
		slices.Sort(lat)
		run.P50Ms, run.P99Ms, run.MaxMs = msOf(nearestRank(lat, 0.50)), msOf(nearestRank(lat, 0.99)), msOf(lat[len(lat)-1])
	}
}

// nearestRank is the p-quantile of sorted by the nearest-rank method.
func nearestRank(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// activationCommand is how the harness starts bin with args as systemd's
// socket activation would, with nfiles sockets as fds 3, 4, ... (passed
// as ExtraFiles) named names (LISTEN_FDNAMES, colon-separated): a shell
// sets LISTEN_PID to its own PID and execs bin, so that the PID is
// bin's (systemd sets it to the service's main PID).
func activationCommand(bin string, args []string, nfiles int, names string) (argv, env []string) {
	argv = append([]string{"/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin}, args...)
	env = []string{"LISTEN_FDS=" + strconv.Itoa(nfiles), "LISTEN_FDNAMES=" + names}
	return argv, env
}

// parseNetstat returns the counters of one section ("TcpExt") of
// /proc/net/netstat: pairs of lines, names then values.
func parseNetstat(text, section string) map[string]int64 {
	out := map[string]int64{}
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, ok1 := strings.CutPrefix(lines[i], section+":")
		vals, ok2 := strings.CutPrefix(lines[i+1], section+":")
		if !ok1 || !ok2 {
			continue
		}
		n, v := strings.Fields(names), strings.Fields(vals)
		for j := range min(len(n), len(v)) {
			if x, err := strconv.ParseInt(v[j], 10, 64); err == nil {
				out[n[j]] = x
			}
		}
		i++
	}
	return out
}

// listenCounters reads the kernel's ListenOverflows and ListenDrops.
func listenCounters() (overflows, drops int64, err error) {
	b, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return 0, 0, err
	}
	m := parseNetstat(string(b), "TcpExt")
	return m["ListenOverflows"], m["ListenDrops"], nil
}

// logLine is one line of a process's output and when the harness read it.
type logLine struct {
	text string
	seen time.Time
}

// at is when the line was written: keyway's JSON lines carry it ("ts",
// to the millisecond); for others, when the harness read the line.
func (l logLine) at() time.Time {
	if strings.HasPrefix(l.text, "{") {
		var v struct {
			TS string `json:"ts"`
		}
		if json.Unmarshal([]byte(l.text), &v) == nil {
			if t, err := time.Parse(time.RFC3339Nano, v.TS); err == nil {
				return t
			}
		}
	}
	return l.seen
}

// logWatch reads a process's output file as it grows. It is not safe for
// concurrent use.
type logWatch struct {
	path    string
	off     int64
	partial []byte
	lines   []logLine
}

// poll reads what was appended since the last poll.
func (w *logWatch) poll() {
	f, err := os.Open(w.path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(w.off, io.SeekStart); err != nil {
		return
	}
	b, err := io.ReadAll(f)
	if err != nil || len(b) == 0 {
		return
	}
	w.off += int64(len(b))
	now := time.Now()
	w.partial = append(w.partial, b...)
	for {
		i := slices.Index(w.partial, '\n')
		if i < 0 {
			break
		}
		w.lines = append(w.lines, logLine{text: string(w.partial[:i]), seen: now})
		w.partial = w.partial[i+1:]
	}
}

// find returns the first line from index from on that contains s.
func (w *logWatch) find(from int, s string) (logLine, int, bool) {
	for i := from; i < len(w.lines); i++ {
		if strings.Contains(w.lines[i].text, s) {
			return w.lines[i], i, true
		}
	}
	return logLine{}, 0, false
}

// errProcExited is waitLine's error when the process exited first.
var errProcExited = errors.New("the process exited")

// waitLine polls w every millisecond until a line from index from on
// contains s, the process exits (exited closes; nil: not watched) or the
// deadline passes.
func waitLine(ctx context.Context, w *logWatch, from int, s string, exited <-chan struct{}, deadline time.Time) (logLine, error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		w.poll()
		if l, _, ok := w.find(from, s); ok {
			return l, nil
		}
		select {
		case <-exited:
			w.poll()
			if l, _, ok := w.find(from, s); ok {
				return l, nil
			}
			return logLine{}, errProcExited
		default:
		}
		if time.Now().After(deadline) {
			return logLine{}, fmt.Errorf("no line %q within the deadline", s)
		}
		select {
		case <-ctx.Done():
			return logLine{}, ctx.Err()
		case <-tick.C:
		}
	}
}

// waitUntil polls cond every millisecond until it holds or the deadline
// passes, and reports whether it held.
func waitUntil(ctx context.Context, deadline time.Time, cond func() bool) bool {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	return true
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// countClosed returns how many of conns the other end has closed: a read
// that does not time out at once meets their EOF or reset. Nothing else
// arrives on a silent keep-alive connection.
func countClosed(conns []net.Conn) int {
	n := 0
	var b [1]byte
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		_, err := c.Read(b[:])
		var ne net.Error
		if !(errors.As(err, &ne) && ne.Timeout()) {
			n++
		}
	}
	return n
}

// readPIDFile returns the PID in file, or 0.
func readPIDFile(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// exitStatus describes how a harness-started process ended.
func exitStatus(p *proc) string {
	if p.err == nil {
		return "exit 0"
	}
	var ee interface{ ExitCode() int }
	if errors.As(p.err, &ee) && ee.ExitCode() >= 0 {
		return "exit " + strconv.Itoa(ee.ExitCode())
	}
	return p.err.Error()
}

// restartState is one run's processes and files.
type restartState struct {
	h       *Harness
	c       restartCase
	dir     string
	port    int
	addr    string
	args    []string // the target's command line, without the binary
	env     []string // the target's extra environment
	pidFile string   // keyway's --pid-file (upgrade)
	socket  *os.File // activated: the listening socket the harness holds
	procs   []*proc  // started by the harness: stopped at the end
	foreign []int    // started by a process of the run (an upgrade's new one): stopped at the end by PID
}

// newRestartState writes the case's configuration for a fresh port.
func (h *Harness) newRestartState(c restartCase, round int) (*restartState, error) {
	dir := filepath.Join(h.dir, fmt.Sprintf("restart-%s-%d", dirName(c.name), round+1))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &restartState{h: h, c: c, dir: dir, port: port, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	env := &targetEnv{maxConns: 4096, nofile: h.nofile, restart: &restartTargetConfig{
		drainIdle: c.drainIdle, shutdownTimeout: h.cfg.Restart.ShutdownTimeout, idleClose: c.idleClose}}
	for _, r := range h.replicas {
		env.replicas = append(env.replicas, r.addr())
	}
	if s.args, err = c.target.config(dir, port, env); err != nil {
		return nil, err
	}
	s.env = append(slices.Clone(c.target.env), env.procEnv...)
	if c.kind == "upgrade" {
		s.pidFile = filepath.Join(dir, "keyway.pid")
		s.args = append(s.args, "--pid-file", s.pidFile)
	}
	if c.kind == "activated" {
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			return nil, err
		}
		// File returns a duplicate: the socket listens as long as the
		// harness holds it, whichever process serves it.
		s.socket, err = ln.(*net.TCPListener).File()
		ln.Close()
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// start starts one process of the target (its output in name.log).
func (s *restartState) start(name string) (*proc, error) {
	argv := append([]string{s.c.target.bin}, s.args...)
	var files []*os.File
	env := s.env
	if s.socket != nil {
		var aenv []string
		argv, aenv = activationCommand(s.c.target.bin, s.args, 1, "proxy")
		env = append(slices.Clone(env), aenv...)
		files = []*os.File{s.socket}
	}
	p, err := startProcFiles(name, s.dir, s.h.proxyCPU, env, files, argv...)
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, p)
	return p, nil
}

// close stops every process of the run, the foreign ones by PID, and
// closes the held socket.
func (s *restartState) close() {
	for _, pid := range s.foreign {
		stopPID(pid, 10*time.Second)
	}
	for _, p := range s.procs {
		p.stop(10 * time.Second)
	}
	if s.socket != nil {
		s.socket.Close()
	}
}

// restartOp is what the operation of one run observed.
type restartOp struct {
	signal   time.Time
	ready    time.Time // the new process's first accept; zero: none
	oldExit  time.Time // zero: the old process did not exit
	old      *proc     // keyway: the old process, for its exit status and log
	oldMark  int       // lines of the old process's log before the signal
	oldLog   *logWatch
	attempts int
	startErr string // sigterm-start: why the first failed start failed
	status   string // HAProxy: the old worker's exit as the master logged it
	events   map[string]time.Time
	err      error // the operation did not complete
}

// measureRestarts runs every round of the restart mode: in each, every
// case in an order that rotates by round, each on fresh processes.
func (h *Harness) measureRestarts(ctx context.Context) ([]RestartRun, []string) {
	cases, notes := restartCases(*h.cfg.Restart, h.targets)
	if err := setSubreaper(); err != nil {
		notes = append(notes, "the harness could not become a subreaper ("+err.Error()+"): an upgrade's new process is stopped by PID but not reaped")
	}
	var out []RestartRun
	for round := range h.cfg.Rounds {
		for i := range cases {
			if ctx.Err() != nil {
				return out, notes
			}
			c := cases[(i+round)%len(cases)]
			run := h.restartRun(ctx, c, round)
			out = append(out, run)
			if run.Failure != "" {
				h.logf("%s round %d: failed: %s", c.name, round+1, run.Failure)
				continue
			}
			h.logf("%s round %d: sent %d, 2xx %d, failed %d %v %v; ready %s, old exit %s", c.name, round+1,
				run.Sent, run.OK, run.Failed, run.Errors, run.NonOK, fmtMs(run.ReadyMs), fmtMs(run.OldExitMs))
		}
	}
	return out, notes
}

// fmtMs formats an optional time in ms.
func fmtMs(v *float64) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf("%.0f ms", *v)
}

// restartRun measures one case in one round.
func (h *Harness) restartRun(ctx context.Context, c restartCase, round int) (run RestartRun) {
	rc := h.cfg.Restart
	run = RestartRun{Round: round + 1, Case: c.name, Target: c.target.name, LoadAvg: loadAvg()}
	if c.target.name == "keyway" {
		run.DrainIdle = c.drainIdle.String()
	}
	s, err := h.newRestartState(c, round)
	if err != nil {
		run.Failure = "setup: " + err.Error()
		return run
	}
	defer s.close()
	first, err := s.start("first")
	if err != nil {
		run.Failure = err.Error()
		return run
	}
	if err := waitReady(ctx, s.addr, 15*time.Second, first.alive, nil); err != nil {
		run.Failure = fmt.Sprintf("%s did not start: %v\n%s", c.target.name, err, first.tail(1500))
		return run
	}
	firstLog := &logWatch{path: first.logs}
	if s.pidFile != "" && !waitUntil(ctx, time.Now().Add(10*time.Second), func() bool { return readPIDFile(s.pidFile) == first.pid() }) {
		run.Failure = "the PID file did not name the process"
		return run
	}
	load := newRestartLoad(s.addr, rc.Rate, rc.Conns, rc.Timeout, h.cfg.Keys, h.cfg.Body, uint64(round*100+slices.Index(restartCaseNames, c.kind)+1))
	if rc.Warm {
		if err := load.warmPool(rc.Conns); err != nil {
			run.Failure = "opening the client pool: " + err.Error()
			return run
		}
		sleepCtx(ctx, warmIdle)
	}
	if rc.IdleConns > 0 {
		idle, err := openIdle(ctx, s.addr, rc.IdleConns, h.cfg.Keys, nil)
		if err != nil {
			run.Failure = "opening the idle connections: " + err.Error()
			return run
		}
		defer closeAll(idle)
		defer func() { run.IdleConns, run.IdleClosed = len(idle), countClosed(idle) }()
	}
	for _, r := range h.replicas {
		r.reset()
	}
	of0, dr0, nsErr := listenCounters()
	load.startSending()
	sleepCtx(ctx, rc.Before)
	var op restartOp
	switch c.kind {
	case "sigterm-start":
		op = s.sigtermStart(ctx, first, firstLog)
	case "wait-start", "activated":
		op = s.waitStart(ctx, first, firstLog)
	case "upgrade":
		op = s.upgrade(ctx, first, firstLog)
	case "sighup":
		op = s.signalOnly(ctx, first, firstLog, sigReload, "configuration reloaded")
	case "sigterm-exit":
		op = s.signalOnly(ctx, first, firstLog, syscall.SIGTERM, "")
	case "haproxy-reload":
		op = s.haproxyReload(ctx, first, firstLog)
	}
	if c.kind == "sigterm-exit" {
		load.stopSending() // nothing listens any more
	} else {
		sleepCtx(ctx, rc.After)
	}
	end := time.Now()
	outs := load.wait()
	run.Seconds = end.Sub(load.start).Seconds()
	if nsErr == nil {
		if of1, dr1, err := listenCounters(); err == nil {
			run.ListenOverflows, run.ListenDrops = of1-of0, dr1-dr0
		}
	}
	for _, r := range h.replicas {
		run.ReplicaRequests += r.reqs.Load()
	}
	if op.signal.IsZero() {
		op.signal = end
	}
	countOutcomes(&run, outs, load.since(op.signal))
	op.fill(&run)
	if op.err != nil {
		run.Failure = op.err.Error()
	}
	if err := ctx.Err(); err != nil && run.Failure == "" {
		run.Failure = err.Error()
	}
	return run
}

// fill records the operation's times and the old process's drain in run.
func (op *restartOp) fill(run *RestartRun) {
	since := func(t time.Time) *float64 {
		if t.IsZero() {
			return nil
		}
		return ptr(msOf(t.Sub(op.signal)))
	}
	run.ReadyMs, run.OldExitMs = since(op.ready), since(op.oldExit)
	if run.ReadyMs != nil && run.OldExitMs != nil {
		run.StartAfterExitMs = ptr(*run.ReadyMs - *run.OldExitMs)
	}
	run.Attempts, run.AttemptError = op.attempts, op.startErr
	if op.old != nil || op.status != "" {
		run.OldExited = ptr(!op.oldExit.IsZero())
		run.OldExitStatus = op.status
		if op.old != nil && !op.old.alive() {
			run.OldExitStatus = exitStatus(op.old)
		}
	}
	if op.oldLog != nil {
		op.oldLog.poll()
		for i := op.oldMark; i < len(op.oldLog.lines); i++ {
			l := op.oldLog.lines[i]
			for _, msg := range []string{"proxy shutting down", "proxy drained", "proxy stopped", "upgrade: the new process serves; this one stops accepting and drains"} {
				if strings.Contains(l.text, `"msg":"`+msg+`"`) {
					if op.events == nil {
						op.events = map[string]time.Time{}
					}
					if _, ok := op.events["old: "+msg]; !ok {
						op.events["old: "+msg] = l.at()
					}
				}
			}
			if strings.Contains(l.text, `"msg":"proxy drained"`) {
				var v struct {
					Open    *int `json:"open_after_grace"`
					Waiting *int `json:"closed_waiting"`
				}
				if json.Unmarshal([]byte(l.text), &v) == nil {
					run.DrainOpenAfterGrace, run.DrainClosedWaiting = v.Open, v.Waiting
				}
			}
			if (strings.Contains(l.text, `"level":"warn"`) || strings.Contains(l.text, `"level":"error"`)) && len(run.Notes) < 5 {
				run.Notes = append(run.Notes, "log: "+l.text)
			}
		}
	}
	for k, t := range op.events {
		if run.Events == nil {
			run.Events = map[string]float64{}
		}
		run.Events[k] = msOf(t.Sub(op.signal))
	}
}

// maxStop is how long the harness waits for a stopping process.
func (s *restartState) maxStop() time.Duration {
	return s.h.cfg.Restart.ShutdownTimeout + 10*time.Second
}

// listening is keyway's line once its listener accepts.
const listening = `"msg":"proxy listening"`

// sigtermStart: SIGTERM, and at once a new process, started again every
// Retry while it fails (the old process holds the port until it stops
// accepting).
func (s *restartState) sigtermStart(ctx context.Context, old *proc, oldLog *logWatch) restartOp {
	oldLog.poll()
	op := restartOp{old: old, oldLog: oldLog, oldMark: len(oldLog.lines), signal: time.Now()}
	if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		op.err = err
		return op
	}
	deadline := op.signal.Add(s.maxStop())
	for {
		at := time.Now()
		op.attempts++
		p, err := s.start(fmt.Sprintf("new-%d", op.attempts))
		if err != nil {
			op.err = err
			return op
		}
		l, err := waitLine(ctx, &logWatch{path: p.logs}, 0, listening, p.exited, deadline)
		if err == nil {
			op.ready = l.at()
			break
		}
		if !errors.Is(err, errProcExited) {
			op.err = fmt.Errorf("new process: %w", err)
			return op
		}
		if op.startErr == "" {
			op.startErr = lastLine(p.tail(600))
		}
		if time.Now().After(deadline) {
			op.err = fmt.Errorf("no start succeeded within %v of SIGTERM (%d attempts)", s.maxStop(), op.attempts)
			return op
		}
		sleepCtx(ctx, time.Until(at.Add(s.h.cfg.Restart.Retry)))
	}
	op.waitOldExit(ctx, deadline)
	return op
}

// lastLine is the last line of s.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// waitOldExit waits for the old process's exit until deadline.
func (op *restartOp) waitOldExit(ctx context.Context, deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-op.old.exited:
		op.oldExit = op.old.exitAt
	case <-t.C:
	case <-ctx.Done():
	}
}

// waitStart: SIGTERM, wait for the exit, start the new process (on the
// held socket when activated).
func (s *restartState) waitStart(ctx context.Context, old *proc, oldLog *logWatch) restartOp {
	oldLog.poll()
	op := restartOp{old: old, oldLog: oldLog, oldMark: len(oldLog.lines), signal: time.Now()}
	if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		op.err = err
		return op
	}
	op.waitOldExit(ctx, op.signal.Add(s.maxStop()))
	if op.oldExit.IsZero() {
		op.err = fmt.Errorf("the old process did not exit within %v", s.maxStop())
		return op
	}
	p, err := s.start("new")
	if err != nil {
		op.err = err
		return op
	}
	l, err := waitLine(ctx, &logWatch{path: p.logs}, 0, listening, p.exited, time.Now().Add(15*time.Second))
	if err != nil {
		op.err = fmt.Errorf("new process: %w\n%s", err, p.tail(1500))
		return op
	}
	op.ready = l.at()
	return op
}

// upgrade: SIGUSR2; the new process (the old one's child) logs "proxy
// listening" into the same output once it accepts and writes its PID to
// the PID file; the old one drains and exits.
func (s *restartState) upgrade(ctx context.Context, old *proc, oldLog *logWatch) restartOp {
	oldLog.poll()
	op := restartOp{old: old, oldLog: oldLog, oldMark: len(oldLog.lines), signal: time.Now()}
	if err := old.cmd.Process.Signal(sigUpgrade); err != nil {
		op.err = err
		return op
	}
	deadline := op.signal.Add(s.maxStop())
	newPID := func() bool { p := readPIDFile(s.pidFile); return p != 0 && p != old.pid() }
	if waitUntil(ctx, deadline, newPID) {
		s.foreign = append(s.foreign, readPIDFile(s.pidFile))
	} else {
		op.err = errors.New("no new process wrote the PID file")
	}
	// Both processes write the same output: the line after the signal
	// is the new process's.
	if l, err := waitLine(ctx, oldLog, op.oldMark, listening, nil, deadline); err == nil {
		op.ready = l.at()
	} else if op.err == nil {
		op.err = fmt.Errorf("new process: %w", err)
	}
	op.waitOldExit(ctx, deadline)
	return op
}

// signalOnly sends sig; with line, the operation is over when the
// process logs it, else when the process exits.
func (s *restartState) signalOnly(ctx context.Context, p *proc, log *logWatch, sig os.Signal, line string) restartOp {
	log.poll()
	op := restartOp{old: p, oldLog: log, oldMark: len(log.lines), signal: time.Now()}
	if err := p.cmd.Process.Signal(sig); err != nil {
		op.err = err
		return op
	}
	deadline := op.signal.Add(s.maxStop())
	if line != "" {
		op.old = nil // it goes on serving
		l, err := waitLine(ctx, log, op.oldMark, `"msg":"`+line+`"`, p.exited, deadline)
		if err != nil {
			op.err = err
		} else {
			op.ready = l.at()
		}
		return op
	}
	op.waitOldExit(ctx, deadline)
	if op.oldExit.IsZero() {
		op.err = fmt.Errorf("the process did not exit within %v", s.maxStop())
	}
	return op
}

var (
	haproxyForked = regexp.MustCompile(`New worker \(([0-9]+)\) forked`)
	haproxyFormer = regexp.MustCompile(`Former worker \(([0-9]+)\) exited with (.*)`)
)

// haproxyReload: SIGUSR2 to HAProxy's master, which re-executes itself
// and forks a new worker that takes the listeners over from the old one
// (-x sockpair@); the old worker stops (soft stop) and exits. The times
// are when the harness read the master's lines ("Loading success.") and
// the old worker's exit (a pidfd).
func (s *restartState) haproxyReload(ctx context.Context, master *proc, log *logWatch) restartOp {
	op := restartOp{events: map[string]time.Time{}}
	l, err := waitLine(ctx, log, 0, "New worker", master.exited, time.Now().Add(10*time.Second))
	if err != nil {
		op.err = fmt.Errorf("haproxy's first worker: %w", err)
		return op
	}
	m := haproxyForked.FindStringSubmatch(l.text)
	if m == nil {
		op.err = fmt.Errorf("haproxy's first worker: %q", l.text)
		return op
	}
	oldPID, _ := strconv.Atoi(m[1])
	exited, err := watchExit(oldPID)
	if err != nil {
		op.err = fmt.Errorf("watch haproxy's worker %d: %w", oldPID, err)
		return op
	}
	log.poll()
	mark := len(log.lines)
	op.signal = time.Now()
	if err := master.cmd.Process.Signal(sigUpgrade); err != nil {
		op.err = err
		return op
	}
	deadline := op.signal.Add(s.maxStop())
	if l, err := waitLine(ctx, log, mark, "Loading success.", master.exited, deadline); err == nil {
		op.ready = l.seen
	} else {
		op.err = fmt.Errorf("haproxy's new worker: %w", err)
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case at := <-exited:
		op.oldExit = at
	case <-t.C:
	case <-ctx.Done():
	}
	op.status = "running"
	if !op.oldExit.IsZero() {
		op.status = "exited"
		if l, err := waitLine(ctx, log, mark, "Former worker ("+m[1]+")", master.exited, time.Now().Add(time.Second)); err == nil {
			if f := haproxyFormer.FindStringSubmatch(l.text); f != nil {
				op.status = f[2]
			}
		}
	}
	for _, l := range log.lines[mark:] {
		if strings.Contains(l.text, "Reloading HAProxy") {
			op.events["master: Reloading HAProxy"] = l.seen
		}
		if strings.Contains(l.text, "New worker") {
			op.events["master: New worker forked"] = l.seen
		}
	}
	return op
}
