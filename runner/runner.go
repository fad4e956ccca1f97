// Package runner is the local runner: it makes a replica set's `run`
// section true on one machine. For every replica a set asks for it starts
// one `keyway agent … -- CMD` (in a process group of its own), which
// supervises the replica's process as any agent does (restarts with
// backoff, gives up as failed, drains before it stops it) and announces
// it by gossip. Scaling in stops the highest ordinals as removals: the
// agent drains the replica on every proxy, waits for its drain probe and
// leaves for good, so its keys move at once.
//
// The agents outlive their proxy: a restart or binary upgrade of the proxy
// leaves them running, and the next runner adopts them by name. Each agent
// holds a lock file (STATE_DIR/.runner/REPLICA.lock) while it runs, so a
// lock that can be taken has no agent, whatever became of the process
// that started it. One runner per state directory and host: the runner
// holds STATE_DIR/.runner/lock, and a second proxy on the machine routes
// without running anything until the lock is free.
//
// The runner's loop (Run) compares what the sets ask for (Apply) with the
// agents that run, every second and on every change, and starts, adopts
// or stops agents until they agree.
package runner

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/internal/flock"
)

// Want is what one set asks of the runner: Replicas jobs run by Spec.
type Want struct {
	Set      string
	Replicas int
	Spec     Spec
}

// AgentBase is what every agent the runner starts shares with its proxy:
// how it joins and authenticates to the gossip cluster, and its logs.
type AgentBase struct {
	// Join returns the gossip addresses an agent joins (this proxy's own
	// first); called when an agent starts.
	Join          func() []string
	BindAddr      string
	AdvertiseAddr string
	Label         string
	KeyFile       string
	Insecure      bool
	Credentials   string // gossip.credentials_file
	Signatures    string
	Profile       string
	LogLevel      string
	LogFormat     string
	// ExitWithParent makes every agent exit once its proxy has (the
	// demo): agent exit_with_parent.
	ExitWithParent bool
}

// Options are a Runner's dependencies.
type Options struct {
	// Executable is the keyway binary the agents run; "" means this
	// process's own (os.Executable).
	Executable string
	Agent      AgentBase
	Logger     *zap.Logger
	// Event receives the runner's events (job start, adopt, stop, exit),
	// for the audit trail; nil: none.
	Event func(set, replica string, fields map[string]any)
	// Adopted hears the gossip addresses of agents an earlier proxy
	// process started, when this runner adopts them: the proxy joins
	// them, which may be the only members it can reach (a proxy that
	// joins nobody, restarted). Nil: none.
	Adopted func(gossip []string)
	// StopOnExit makes Run stop every job it runs before it returns (the
	// demo). Default false: the agents outlive the proxy.
	StopOnExit bool
	// StateDir is the state directory of sets whose run section names
	// none; "" means the default (StateDir).
	StateDir string
	// Registerer receives keyway_jobs{set,state}; nil: not exported.
	Registerer prometheus.Registerer
	// Interval is how often the loop looks at the agents. Default 1s.
	Interval time.Duration
	// Ready says when the loop may start and stop agents: once this
	// proxy knows the fleet's run-time state (its scales and run-time
	// sets). Nil: at once.
	Ready func() bool
	// OrphanGrace is how long after Run starts an agent that no set asks
	// for is left running (a run-time set this proxy has not heard of
	// yet). Default 30s.
	OrphanGrace time.Duration
}

// Runner runs the jobs of the sets with a run section. Build it with New,
// run it with Run, tell it what the sets ask for with Apply. Safe for
// concurrent use.
type Runner struct {
	opts  Options
	exe   string
	log   *zap.Logger
	wakeC chan struct{}

	mu      sync.Mutex
	applied bool                 // Apply was called
	wants   map[string]Want      // by set
	seen    map[string]bool      // replicas asked for since Run started
	dirs    map[string]*dirState // by state directory
	jobs    map[string]*job      // by replica name
	started time.Time            // when Run started
	stopped bool                 // Run has returned

	gauge    *prometheus.GaugeVec // keyway_jobs{set,state}
	exported map[string]bool      // sets with series
}

// jobStates are the states a job is counted in (Job.State).
var jobStates = []string{"running", "stopping", "starting", "backoff", "failed"}

// dirState is one state directory: this runner holds its lock or not.
type dirState struct {
	lock   *flock.Lock
	holder string // who holds it when this runner does not
	err    string // why it cannot be used
}

// New builds a runner; it starts nothing.
func New(opts Options) (*Runner, error) {
	exe := opts.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("runner: this program's path (for the agents): %w", err)
		}
	}
	opts.Interval = cmp.Or(opts.Interval, time.Second)
	opts.OrphanGrace = cmp.Or(opts.OrphanGrace, 30*time.Second)
	r := &Runner{
		opts: opts, exe: exe, log: cmp.Or(opts.Logger, zap.NewNop()), wakeC: make(chan struct{}, 1),
		wants: map[string]Want{}, seen: map[string]bool{}, dirs: map[string]*dirState{}, jobs: map[string]*job{},
		exported: map[string]bool{},
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyway_jobs",
			Help: "Jobs (replica agents) this proxy's runner runs for sets with a run section, by state: running, stopping (scaled in, draining), starting, backoff (exited, started again soon), failed (cannot be started).",
		}, []string{"set", "state"}),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(r.gauge); err != nil {
			return nil, fmt.Errorf("runner metrics: %w", err)
		}
	}
	return r, nil
}

// export sets keyway_jobs from the jobs, and drops the series of sets
// this runner no longer runs. r.mu is held.
func (r *Runner) export() {
	counts := map[string]map[string]int{}
	for set, w := range r.wants {
		if d := r.dirs[w.Spec.StateDir]; d != nil && d.lock != nil {
			counts[set] = map[string]int{}
		}
	}
	for _, j := range r.jobs {
		if c := counts[j.set]; c != nil {
			c[j.view().State]++
		}
	}
	for set := range r.exported {
		if counts[set] == nil {
			r.gauge.DeletePartialMatch(prometheus.Labels{"set": set})
			delete(r.exported, set)
		}
	}
	for set, c := range counts {
		for _, st := range jobStates {
			r.gauge.WithLabelValues(set, st).Set(float64(c[st]))
		}
		r.exported[set] = true
	}
}

// Apply replaces what the sets ask for: one Want per set with a run
// section (a set left out asks for nothing: its jobs stop).
func (r *Runner) Apply(wants []Want) {
	r.mu.Lock()
	r.applied = true
	r.wants = make(map[string]Want, len(wants))
	for _, w := range wants {
		if w.Spec.Enabled() {
			if w.Spec.StateDir == "" {
				w.Spec.StateDir = r.opts.StateDir
			}
			w.Spec.StateDir = StateDir(w.Spec)
			r.wants[w.Set] = w
			for i := range w.Replicas {
				r.seen[ReplicaName(w.Set, i)] = true
			}
		}
	}
	r.mu.Unlock()
	r.wake()
}

func (r *Runner) wake() {
	select {
	case r.wakeC <- struct{}{}:
	default:
	}
}

// StateDir returns the state directory a spec's jobs use: its state_dir,
// or the default.
func StateDir(s Spec) string {
	if s.StateDir != "" {
		return s.StateDir
	}
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		// systemd's StateDirectory=; several are separated by ':'.
		d, _, _ = strings.Cut(d, ":")
		return filepath.Join(d, "run")
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "keyway", "run")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "keyway", "run")
	}
	return filepath.Join(os.TempDir(), "keyway-run")
}

// Run runs the loop until ctx is done. Then it releases its locks and
// returns, leaving the agents running (they outlive the proxy), unless
// Options.StopOnExit.
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	r.started = time.Now()
	r.mu.Unlock()
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		r.reconcile()
		select {
		case <-ctx.Done():
			if r.opts.StopOnExit {
				r.stopAll()
			}
			r.release()
			return nil
		case <-t.C:
		case <-r.wakeC:
		}
	}
}

// release lets go of the locks and marks the runner stopped: it starts and
// stops nothing more (its children's exits are still reaped).
func (r *Runner) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	r.gauge.Reset() // this process runs nothing any more
	for _, d := range r.dirs {
		if d.lock != nil {
			d.lock.Close()
			d.lock = nil
		}
	}
}

// stopAll stops every job this runner holds and waits for them, at most
// each one's drain and stop bounds and a few seconds.
func (r *Runner) stopAll() {
	r.mu.Lock()
	var waits []*job
	for _, j := range r.jobs {
		if j.alive() {
			r.retire(j, "the proxy is stopping (demo)")
			waits = append(waits, j)
		}
	}
	r.mu.Unlock()
	for _, j := range waits {
		deadline := time.Now().Add(j.stopBound())
		for j.alive() && time.Now().Before(deadline) {
			select {
			case <-j.exited:
			case <-time.After(100 * time.Millisecond):
			}
		}
		if j.alive() {
			j.kill()
		}
	}
}

// runnerDir is where the runner keeps its own files in a state directory.
func runnerDir(stateDir string) string { return filepath.Join(stateDir, ".runner") }

// reconcile makes the jobs agree with the wants, once.
func (r *Runner) reconcile() {
	if r.opts.Ready != nil && !r.opts.Ready() {
		return // called without r.mu: Ready takes its own locks
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.applied || r.stopped {
		return
	}
	defer r.export()
	// The directories in use, and their locks.
	want := map[string]bool{}
	for _, w := range r.wants {
		want[w.Spec.StateDir] = true
	}
	for dir := range want {
		if r.dirs[dir] == nil {
			r.dirs[dir] = &dirState{}
		}
		r.lockDir(dir, r.dirs[dir])
	}
	// Adopt agents found running under held directories.
	for dir, d := range r.dirs {
		if d.lock != nil {
			r.adoptFrom(dir)
		}
	}
	now := time.Now()
	// Start what is asked for and missing.
	for _, w := range r.wants {
		d := r.dirs[w.Spec.StateDir]
		if d == nil || d.lock == nil {
			continue
		}
		for i := range w.Replicas {
			name := ReplicaName(w.Set, i)
			j := r.jobs[name]
			if j == nil {
				j = &job{set: w.Set, replica: name, ordinal: i, dir: w.Spec.StateDir}
				r.jobs[name] = j
			}
			j.spec = w.Spec
			if j.alive() {
				continue
			}
			if j.adopted {
				// An agent an earlier process started is gone: how it ended
				// is not ours to know. It is started again after a backoff,
				// as a child of this process would be.
				j.adopted = false
				j.restarts++
				j.lastExit = "exited (started by an earlier proxy process: its exit status is unknown)"
				j.retryAt = now.Add(backoff(j.restarts))
				r.log.Warn("adopted agent exited; starting it again after a backoff", zap.String("set", j.set), zap.String("replica", j.replica),
					zap.Int("agent_pid", j.pid), zap.Time("retry_at", j.retryAt))
				r.event(j, map[string]any{"event": "exit", "agent_pid": j.pid, "exit": j.lastExit, "restarts": j.restarts})
				continue
			}
			if !j.retryAt.IsZero() && now.Before(j.retryAt) {
				continue
			}
			r.start(j)
		}
	}
	// Stop what is no longer asked for.
	for name, j := range r.jobs {
		if r.wanted(j) {
			continue
		}
		if !j.alive() {
			delete(r.jobs, name)
			continue
		}
		if !r.seen[name] && now.Sub(r.started) < r.opts.OrphanGrace {
			continue // perhaps a set this proxy has not heard of yet
		}
		if !j.retiring {
			r.retire(j, "no longer asked for")
		} else if now.Sub(j.retired) > j.stopBound() {
			r.log.Warn("agent still running after its drain and stop bounds; killing it", zap.String("replica", name), zap.Int("pid", j.pid))
			j.kill()
		}
	}
}

// wanted reports whether a set asks for j's replica.
func (r *Runner) wanted(j *job) bool {
	w, ok := r.wants[j.set]
	return ok && j.ordinal >= 0 && j.ordinal < w.Replicas && w.Spec.StateDir == j.dir
}

// lockDir takes a state directory's lock when this runner does not hold
// it yet.
func (r *Runner) lockDir(dir string, d *dirState) {
	if d.lock != nil {
		return
	}
	if err := os.MkdirAll(runnerDir(dir), 0o700); err != nil {
		d.err = fmt.Sprintf("state_dir %s: %v", dir, err)
		return
	}
	l, err := flock.TryLock(filepath.Join(runnerDir(dir), "lock"))
	switch {
	case errors.Is(err, flock.ErrLocked):
		b, _ := os.ReadFile(filepath.Join(runnerDir(dir), "lock"))
		holder := strings.TrimSpace(string(b))
		if holder != d.holder {
			r.log.Info("another process runs the jobs of this state directory; this proxy routes only, and takes over when it stops",
				zap.String("state_dir", dir), zap.String("holder", holder))
		}
		d.holder, d.err = holder, ""
		return
	case err != nil:
		d.err = fmt.Sprintf("state_dir %s: %v", dir, err)
		return
	}
	_ = l.Write([]byte(fmt.Sprintf("pid %d", os.Getpid())))
	d.lock, d.holder, d.err = l, "", ""
	r.log.Info("running the jobs of this state directory", zap.String("state_dir", dir))
}

// adoptFrom adopts the agents that hold their locks in a state directory
// and that this runner has no job for: they were started by an earlier
// proxy process.
func (r *Runner) adoptFrom(dir string) {
	var gossip []string
	defer func() {
		if len(gossip) > 0 && r.opts.Adopted != nil {
			go r.opts.Adopted(gossip) // not under r.mu: it joins over the network
		}
	}()
	locks, _ := filepath.Glob(filepath.Join(runnerDir(dir), "*.lock"))
	for _, path := range locks {
		name := strings.TrimSuffix(filepath.Base(path), ".lock")
		if j := r.jobs[name]; j != nil && j.alive() {
			continue
		}
		held, b, err := flock.Held(path)
		if err != nil || !held {
			continue
		}
		var h AgentLock
		if json.Unmarshal(b, &h) != nil || h.Pid <= 0 || h.Replica != name {
			continue
		}
		j := &job{set: h.Set, replica: name, ordinal: ordinalOf(h.Set, name), dir: dir, pid: h.Pid, lockPath: path,
			since: h.Started, adopted: true, addr: h.Addr}
		if old := r.jobs[name]; old != nil {
			j.restarts, j.lastExit, j.spec = old.restarts, old.lastExit, old.spec
		}
		r.jobs[name] = j
		if h.Gossip != "" {
			gossip = append(gossip, h.Gossip)
		}
		r.log.Info("agent adopted", zap.String("set", h.Set), zap.String("replica", name), zap.Int("pid", h.Pid), zap.String("addr", h.Addr))
		r.event(j, map[string]any{"event": "adopt", "agent_pid": h.Pid, "addr": h.Addr})
	}
}

// AgentLock is what an agent writes into its lock file (agent
// lock_file): who holds it. The runner reads it to adopt the agent.
type AgentLock struct {
	Pid     int       `json:"pid"`
	Set     string    `json:"set"`
	Replica string    `json:"replica"`
	Addr    string    `json:"addr"`
	Started time.Time `json:"started"`
	// Gossip is the agent's gossip address, once its member runs: a
	// proxy that adopts the agent joins it there.
	Gossip string `json:"gossip,omitempty"`
}

func (r *Runner) event(j *job, fields map[string]any) {
	if r.opts.Event != nil {
		r.opts.Event(j.set, j.replica, fields)
	}
}

// retire stops a job as a removal: SIGTERM to its agent, which drains the
// replica on every proxy, waits for its drain probe, stops the process
// and leaves for good. r.mu is held.
func (r *Runner) retire(j *job, why string) {
	j.retiring, j.retired = true, time.Now()
	r.log.Info("stopping job", zap.String("set", j.set), zap.String("replica", j.replica), zap.Int("pid", j.pid), zap.String("why", why))
	r.event(j, map[string]any{"event": "stop", "agent_pid": j.pid, "why": why})
	if err := j.signalTerm(); err != nil {
		r.log.Warn("SIGTERM not delivered to the agent", zap.String("replica", j.replica), zap.Int("pid", j.pid), zap.Error(err))
	}
}

// Status says whether this runner runs a set's jobs.
type Status struct {
	// Runs is true when the set has a run section here.
	Runs bool `json:"runs"`
	// Here is true when this process runs the jobs (it holds the state
	// directory's lock).
	Here bool `json:"here"`
	// StateDir is the set's state directory.
	StateDir string `json:"state_dir,omitempty"`
	// Holder names the process that holds the lock when this one does
	// not; Error says why the directory cannot be used.
	Holder string `json:"holder,omitempty"`
	Error  string `json:"error,omitempty"`
	// Wanted is the number of jobs asked for.
	Wanted int `json:"wanted"`
}

// Job is one replica's job as the runner sees it. A plain value.
type Job struct {
	Set     string `json:"set"`
	Replica string `json:"replica"`
	Ordinal int    `json:"ordinal"`
	// State is the agent's: "running", "stopping" (retired: draining,
	// then leaving), "starting" (not up yet), "backoff" (it exited; it
	// is started again at RetryAt), or "failed" (it cannot be started:
	// Error says why).
	State    string    `json:"state"`
	AgentPid int       `json:"agent_pid,omitempty"`
	Addr     string    `json:"addr,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	Adopted  bool      `json:"adopted,omitempty"`
	// Restarts counts the agent's restarts by this runner; LastExit says
	// how the last one ended.
	Restarts int       `json:"agent_restarts"`
	LastExit string    `json:"agent_last_exit,omitempty"`
	RetryAt  time.Time `json:"retry_at,omitzero"`
	Error    string    `json:"error,omitempty"`
	StateDir string    `json:"state_dir"`
	Log      string    `json:"log"`
}

// Jobs returns a set's jobs, in ordinal order, and whether and where this
// runner runs them.
func (r *Runner) Jobs(set string) ([]Job, Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.wants[set]
	st := Status{Runs: ok}
	if !ok {
		return nil, st
	}
	st.StateDir, st.Wanted = w.Spec.StateDir, w.Replicas
	if d := r.dirs[w.Spec.StateDir]; d != nil {
		st.Here, st.Holder, st.Error = d.lock != nil, d.holder, d.err
	}
	var out []Job
	for _, j := range r.jobs {
		if j.set == set {
			out = append(out, j.view())
		}
	}
	slices.SortFunc(out, func(a, b Job) int { return cmp.Compare(a.Ordinal, b.Ordinal) })
	return out, st
}

// Pending returns how many of a set's jobs are asked for and not yet
// running (starting, backoff or failed to start) on this runner; 0 when
// it does not run them.
func (r *Runner) Pending(set string) int {
	jobs, st := r.Jobs(set)
	if !st.Here {
		return 0
	}
	n := st.Wanted
	for _, j := range jobs {
		if j.Ordinal < st.Wanted && j.State == "running" {
			n--
		}
	}
	return n
}

func (j *job) view() Job {
	v := Job{Set: j.set, Replica: j.replica, Ordinal: j.ordinal, AgentPid: j.pid, Addr: j.addr, Since: j.since, Adopted: j.adopted,
		Restarts: j.restarts, LastExit: j.lastExit, Error: j.err, StateDir: filepath.Join(j.dir, j.replica),
		Log: filepath.Join(runnerDir(j.dir), j.replica+".log")}
	switch {
	case j.retiring && j.alive():
		v.State = "stopping"
	case j.alive():
		v.State = "running"
	case j.err != "":
		v.State = "failed"
	case !j.retryAt.IsZero():
		v.State, v.RetryAt = "backoff", j.retryAt
	default:
		v.State = "starting"
	}
	if !j.alive() {
		v.AgentPid = 0
	}
	return v
}

// backoff is the delay before an agent's n-th restart (n >= 1).
func backoff(n int) time.Duration {
	d := time.Second << min(n-1, 5)
	return min(d, 30*time.Second)
}

// portsGiven returns the ports the other replicas of j's state directory
// have: their jobs' addresses and their kept ports. r.mu is held.
func (r *Runner) portsGiven(j *job) map[int]bool {
	out := map[int]bool{}
	for _, o := range r.jobs {
		if o != j && o.addr != "" {
			if _, ps, err := net.SplitHostPort(o.addr); err == nil {
				if n, err := strconv.Atoi(ps); err == nil {
					out[n] = true
				}
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(runnerDir(j.dir), "*.port"))
	for _, f := range files {
		if strings.TrimSuffix(filepath.Base(f), ".port") == j.replica {
			continue
		}
		if b, err := os.ReadFile(f); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				out[n] = true
			}
		}
	}
	return out
}

// port returns the port of a job: port_base + ordinal, or the free port
// it was given when first started (kept in STATE_DIR/.runner/REPLICA.port).
func (r *Runner) port(j *job) (int, error) {
	if j.spec.PortBase > 0 {
		return j.spec.PortBase + j.ordinal, nil
	}
	file := filepath.Join(runnerDir(j.dir), j.replica+".port")
	if b, err := os.ReadFile(file); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 && p < 65536 && portFree(j.spec.Host, p) {
			return p, nil
		}
	}
	// A port just given to another replica is free until that replica
	// binds it: the kernel may offer it again. Skip the ports this
	// directory's replicas have.
	taken := r.portsGiven(j)
	p := 0
	for range 50 {
		cand, err := freePort(j.spec.Host)
		if err != nil {
			return 0, err
		}
		if !taken[cand] {
			p = cand
			break
		}
	}
	if p == 0 {
		return 0, fmt.Errorf("no free port on %s that no other replica has", j.spec.Host)
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(p)+"\n"), 0o600); err != nil {
		return 0, err
	}
	return p, nil
}
