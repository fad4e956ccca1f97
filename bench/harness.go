package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"keyway/proxy"
)

// Config is what one harness run measures. Zero values are not defaults:
// main fills every field from its flags.
type Config struct {
	Duration        time.Duration `json:"duration"`         // each throughput run
	Warmup          time.Duration `json:"warmup"`           // load before each throughput and latency run, not measured
	Connections     int           `json:"connections"`      // client connections of the throughput runs
	Rates           []int         `json:"rates"`            // fixed rates of the latency runs, requests/s
	LatencyDuration time.Duration `json:"latency_duration"` // each latency run
	Replicas        int           `json:"replicas"`
	Body            int           `json:"body_bytes"`
	Keys            int           `json:"keys"`
	Rounds          int           `json:"rounds"`
	Targets         []string      `json:"targets"`
	IdleConns       int           `json:"idle_conns"` // 0 skips the idle-connection memory test
	// IdleHold is how long the idle connections stay open before their
	// RSS is read: memory per idle connection as it stays, not right
	// after the burst that opened them (keyway parks connections idle
	// for server.park_idle_after and gives their memory back after).
	IdleHold time.Duration `json:"idle_hold"`
	// SparseConns keep-alive connections each send one request every
	// SparsePeriod (sparseRun); 0 skips the run.
	SparseConns  int           `json:"sparse_conns"`
	SparsePeriod time.Duration `json:"sparse_period"`
	LoadGen      string        `json:"loadgen"`  // auto, wrk or vegeta
	Pin          bool          `json:"pin"`      // proxy on CPU 0, everything else on CPU 1
	Syscalls     bool          `json:"syscalls"` // count system calls per request with perf stat during an extra run in the last round
	Profile      time.Duration `json:"profile"`  // keyway CPU profile taken during an extra throughput run in the last round; 0: none
	// TLS adds, for every proxy in every round, the same proxy on a fresh
	// process terminating TLS 1.3: idle memory, keep-alive throughput and a
	// new connection (full handshake) per request, plus a plain
	// new-connection run as the baseline (tls.go).
	TLS bool `json:"tls"`
	// ForwardHeaders makes HAProxy and nginx add the forwarding headers
	// keyway adds by default (X-Forwarded-For, -Proto, -Host and an
	// X-Request-Id where the client sent none), so that they do keyway's
	// work per request. Off, they add none (their usual configuration).
	ForwardHeaders bool `json:"forward_headers,omitempty"`
	// Saturation replaces every other measurement with the saturation
	// mode (saturation.go): replicas with a fixed service capacity, and
	// each proxy loaded past it.
	Saturation bool      `json:"saturation"`
	Sat        SatConfig `json:"saturation_config"`
	// Pair replaces every other measurement with the paired mode
	// (pair.go): the two targets named here run at once on the proxy's
	// core, each under its own load at every rate of Rates.
	Pair []string `json:"pair,omitempty"`
	// PairAlternate > 0 makes the paired mode measure the two targets in
	// turn instead of at once: slices of this length, A B B A A B ...,
	// each target alone on the proxy's core while it is loaded (the full
	// run's regime), the two still within the same seconds of the round.
	PairAlternate time.Duration `json:"pair_alternate,omitempty"`
	// Instructions > 0 replaces every other measurement with the
	// instruction-count mode (instructions.go): each proxy under
	// cachegrind, this many requests.
	Instructions int `json:"instructions,omitempty"`
	// Bodies replaces every other measurement with the body-throughput
	// mode (bodies.go): each target and size on a fresh process, one
	// streaming replica, BodyConns connections sending bodies of the
	// size for Duration.
	Bodies    []proxy.ByteSize `json:"bodies,omitempty"`
	BodyConns int              `json:"body_conns,omitempty"`
	// Restarts replaces every other measurement with the restart mode
	// (restarts.go): what a restart, upgrade or reload of a proxy costs in
	// requests under open-loop load.
	Restarts  bool           `json:"restarts,omitempty"`
	Restart   *RestartConfig `json:"restart_config,omitempty"`
	OutDir    string         `json:"-"`
	Keyway    string         `json:"-"`                    // a prebuilt keyway binary; "" builds one
	KeywayRev string         `json:"keyway_rev,omitempty"` // build keyway from this git revision instead of the working tree
	Repo      string         `json:"-"`                    // module root, for building keyway
	Race      bool           `json:"-"`                    // build keyway with -race (the smoke test under -race)
	Log       io.Writer      `json:"-"`                    // progress; nil discards
}

// Harness runs the measurements of one Config.
type Harness struct {
	cfg      Config
	dir      string // scratch: configs, logs, binaries
	replicas []*replica
	targets  []*target
	notes    []string
	loadgen  string
	nofile   uint64 // RLIMIT_NOFILE in force, inherited by the proxies
	proxyCPU int    // -1: not pinned
	loadCPU  int
	tls      *tlsFiles // with cfg.TLS: the run's certificate
	log      io.Writer
}

// Run measures every target over cfg.Rounds rounds and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkPlatform(); err != nil {
		return nil, err
	}
	h := &Harness{cfg: cfg, log: cfg.Log, proxyCPU: -1, loadCPU: -1}
	if h.log == nil {
		h.log = io.Discard
	}
	dir, err := os.MkdirTemp("", "keyway-bench-")
	if err != nil {
		return nil, err
	}
	if os.Getenv("KEYWAY_BENCH_KEEP") != "" {
		// Kept for a closer look (cachegrind and perf files, configs).
		fmt.Fprintf(h.log, "KEYWAY_BENCH_KEEP: the run's files stay in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	h.dir = dir

	// The harness shares its core with the load generator and the
	// replicas; collecting vegeta's garbage less often leaves them more.
	defer debug.SetGCPercent(debug.SetGCPercent(400))

	rep := &Report{Started: time.Now().UTC(), Config: cfg, Env: environment()}
	rep.Env.LoadStart = loadAvg()

	// Build before pinning, so the build has both cores.
	bin := cfg.Keyway
	if bin == "" {
		h.logf("building keyway")
		if bin, rep.Env.KeywaySource, err = buildKeyway(ctx, cfg.Repo, cfg.KeywayRev, dir, cfg.Race); err != nil {
			return nil, err
		}
	} else {
		rep.Env.KeywaySource = "prebuilt binary " + bin
	}
	var pair [2]*target
	if len(cfg.Pair) > 0 {
		// Built before pinning too (keyway@REV).
		if pair, err = h.pairTargets(ctx, cfg.Pair, bin); err != nil {
			return nil, err
		}
	} else if h.targets, h.notes, err = newTargets(cfg.Targets, bin); err != nil {
		return nil, err
	}
	if cfg.TLS {
		if h.tls, err = writeCert(dir); err != nil {
			return nil, fmt.Errorf("TLS certificate: %w", err)
		}
		if slices.Contains(cfg.Targets, "direct") {
			h.notes = append(h.notes, "TLS: direct has no TLS figures (the replicas speak plain HTTP)")
		}
		if _, err := exec.LookPath("openssl"); err != nil {
			h.notes = append(h.notes, "TLS: openssl not installed, so what OpenSSL (wrk's library) negotiates was not checked; apt-get install -y openssl")
		}
	}
	h.loadgen = cfg.LoadGen
	if h.loadgen == "auto" && len(cfg.Bodies) == 0 { // the body mode has its own client
		h.loadgen = "vegeta"
		if _, err := exec.LookPath("wrk"); err == nil {
			h.loadgen = "wrk"
		} else {
			h.notes = append(h.notes, "wrk not installed: throughput measured with vegeta (closed loop), which costs more client CPU per request than wrk; install wrk for comparable numbers")
		}
	}
	if cfg.Pin {
		_, tsErr := exec.LookPath("taskset")
		switch {
		case runtime.NumCPU() < 2:
			h.notes = append(h.notes, fmt.Sprintf("not pinned: %d CPU", runtime.NumCPU()))
		case tsErr != nil:
			h.notes = append(h.notes, "not pinned: taskset not installed")
		default:
			if err := pinSelf(1); err != nil {
				h.notes = append(h.notes, "not pinned: "+err.Error())
			} else {
				h.proxyCPU, h.loadCPU = 0, 1
				runtime.GOMAXPROCS(1)
			}
		}
	}
	// The harness holds the idle client connections and a proxy their
	// other ends, each in its own process.
	need := uint64(cfg.IdleConns + 4096)
	if h.nofile, err = raiseNoFile(need); err != nil || h.nofile < need {
		h.notes = append(h.notes, fmt.Sprintf("RLIMIT_NOFILE is %d, %d wanted for %d idle connections (%v)", h.nofile, need, cfg.IdleConns, err))
	}

	conc, service := 0, time.Duration(0)
	if cfg.Restarts {
		// The mode's cases name their targets (restartCases).
		h.targets = slices.DeleteFunc(h.targets, func(t *target) bool { return t.name != "keyway" && t.name != "haproxy" })
	}
	if cfg.Saturation {
		conc, service = cfg.Sat.Concurrency, cfg.Sat.Service
		h.targets = slices.DeleteFunc(h.targets, func(t *target) bool {
			if why, ok := satSkipped[t.name]; ok {
				h.notes = append(h.notes, why)
				return true
			}
			return false
		})
		if len(h.targets) == 0 {
			return nil, errors.New("saturation: no target left to measure (keyway and haproxy are measured)")
		}
	}
	nrep := cfg.Replicas
	if len(cfg.Bodies) > 0 {
		nrep = 1 // the body mode's one streaming replica (bodies.go)
	}
	for i := range nrep {
		var r *replica
		var err error
		if len(cfg.Bodies) > 0 {
			r, err = startBodyReplica("r" + strconv.Itoa(i))
		} else {
			r, err = startReplica("r"+strconv.Itoa(i), cfg.Keys, conc, service)
		}
		if err != nil {
			return nil, err
		}
		defer r.close()
		h.replicas = append(h.replicas, r)
	}
	for _, t := range h.targets {
		rep.Env.Versions = append(rep.Env.Versions, t.name+": "+t.version)
	}
	switch {
	case cfg.Restarts:
		var notes []string
		rep.RestartRuns, notes = h.measureRestarts(ctx)
		h.notes = append(h.notes, notes...)
	case cfg.Instructions > 0:
		rep.Instr = h.measureInstructions(ctx)
	case len(cfg.Bodies) > 0:
		rep.BodyRuns = h.measureBodies(ctx)
	case len(cfg.Pair) > 0:
		for _, t := range pair {
			rep.Env.Versions = append(rep.Env.Versions, t.name+": "+t.version)
		}
		rep.PairRuns = h.measurePairs(ctx, pair)
	default:
		h.measureRounds(ctx, rep)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep.Notes = h.notes
	rep.Env.LoadEnd = loadAvg()
	rep.Finished = time.Now().UTC()
	rep.summarise()
	return rep, nil
}

// measureRounds runs every round of the default and the saturation
// modes into rep.Runs, the targets' order rotating each round so that no
// target always runs first.
func (h *Harness) measureRounds(ctx context.Context, rep *Report) {
	for round := range h.cfg.Rounds {
		for i := range h.targets {
			t := h.targets[(i+round)%len(h.targets)]
			var run TargetRun
			if h.cfg.Saturation {
				run = h.measureSaturation(ctx, t, round)
			} else {
				run = h.measure(ctx, t, round)
			}
			rep.Runs = append(rep.Runs, run)
			if ctx.Err() != nil {
				return
			}
		}
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Duration < time.Second {
		errs = append(errs, errors.New("duration must be at least 1s"))
	}
	if c.Connections < 1 || c.Replicas < 1 || c.Keys < 1 || c.Rounds < 1 || c.Body < 0 || c.IdleConns < 0 || c.IdleHold < 0 || c.SparseConns < 0 || (c.SparseConns > 0 && c.SparsePeriod <= 0) {
		errs = append(errs, errors.New("connections, replicas, keys and rounds must be at least 1; body, idle-conns, idle-hold and sparse-conns at least 0; sparse-period above 0"))
	}
	for _, r := range c.Rates {
		if r < 1 {
			errs = append(errs, fmt.Errorf("rate %d: must be at least 1", r))
		}
	}
	if len(c.Rates) > 0 && c.LatencyDuration <= 0 {
		errs = append(errs, errors.New("latency-duration must be positive"))
	}
	if c.Saturation {
		if err := c.Sat.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Instructions < 0 || c.Instructions > 0 && (len(c.Pair) > 0 || c.Saturation || c.TLS) {
		errs = append(errs, errors.New("-instructions takes a count of requests, and cannot be combined with -pair, -saturation or -tls"))
	}
	if len(c.Pair) > 0 {
		switch {
		case len(c.Pair) != 2:
			errs = append(errs, fmt.Errorf("pair: %d targets, want 2", len(c.Pair)))
		case len(c.Rates) == 0:
			errs = append(errs, errors.New("-pair needs at least one rate (-rates 1000,3000)"))
		case c.Saturation || c.TLS:
			errs = append(errs, errors.New("-pair cannot be combined with -saturation or -tls"))
		case c.LatencyDuration <= 0:
			errs = append(errs, errors.New("-pair needs a positive -latency-duration"))
		case c.PairAlternate < 0 || c.PairAlternate > c.LatencyDuration/2:
			errs = append(errs, fmt.Errorf("-pair-alternate %v: want 0 (both targets at once) or a slice of at most half of -latency-duration (%v), e.g. 500ms", c.PairAlternate, c.LatencyDuration))
		}
	} else if c.PairAlternate != 0 {
		errs = append(errs, errors.New("-pair-alternate needs -pair"))
	} else if len(c.Targets) == 0 {
		errs = append(errs, errors.New("no targets"))
	}
	if c.Restarts {
		switch {
		case c.Restart == nil:
			errs = append(errs, errors.New("-restarts: no restart configuration"))
		case c.Saturation || len(c.Pair) > 0 || c.Instructions > 0 || len(c.Bodies) > 0 || c.TLS:
			errs = append(errs, errors.New("-restarts cannot be combined with -saturation, -pair, -instructions, -bodies or -tls"))
		default:
			if err := c.Restart.validate(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(c.Bodies) > 0 {
		if c.BodyConns < 1 {
			errs = append(errs, fmt.Errorf("-body-conns %d: must be at least 1", c.BodyConns))
		}
		if c.Saturation || len(c.Pair) > 0 || c.Instructions > 0 || c.TLS {
			errs = append(errs, errors.New("-bodies cannot be combined with -saturation, -pair, -instructions or -tls"))
		}
		for _, n := range c.Bodies {
			if n < 1 || n > maxBodySize {
				errs = append(errs, fmt.Errorf("-bodies: %s: want 1B..1GiB", n))
			}
		}
	}
	switch c.LoadGen {
	case "auto", "wrk", "vegeta":
	default:
		errs = append(errs, fmt.Errorf("loadgen %q: want auto, wrk or vegeta", c.LoadGen))
	}
	return errors.Join(errs...)
}

func (h *Harness) logf(format string, args ...any) {
	fmt.Fprintf(h.log, "%s bench: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// buildKeyway builds the real binary from the module at repo: from its
// working tree, or, with rev, from that git revision exported into dir.
// It returns the binary and a description of the source it was built from.
func buildKeyway(ctx context.Context, repo, rev, dir string, race bool) (bin, source string, err error) {
	src := repo
	if rev != "" {
		src = filepath.Join(dir, "src")
		if err := os.MkdirAll(src, 0o755); err != nil {
			return "", "", err
		}
		archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", repo, rev, src)
		if b, err := archive.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("export keyway at %s: %w\n%s", rev, err, b)
		}
	}
	source = describeSource(ctx, repo, rev)
	bin = filepath.Join(dir, "keyway")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.CommandContext(ctx, goBin, append(args, "./cmd/keyway")...)
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build ./cmd/keyway: %w\n%s", err, b)
	}
	return bin, source, nil
}

// describeSource names the commit keyway was built from and, for a working
// tree, the files changed since (outside bench/ and docs/).
func describeSource(ctx context.Context, repo, rev string) string {
	git := func(args ...string) string {
		b, err := exec.CommandContext(ctx, "git", append([]string{"-C", repo}, args...)...).Output()
		if err != nil {
			return ""
		}
		return strings.TrimRight(string(b), "\n") // porcelain lines start with a space
	}
	if rev != "" {
		return "git " + rev + " = " + git("rev-parse", "--short=12", rev)
	}
	head := git("rev-parse", "--short=12", "HEAD")
	if head == "" {
		return "working tree (not a git checkout)"
	}
	var dirty []string
	for _, l := range strings.Split(git("status", "--porcelain", "--", ".", ":!bench", ":!docs"), "\n") {
		if len(l) > 3 {
			dirty = append(dirty, l[3:])
		}
	}
	if len(dirty) == 0 {
		return "working tree at " + head
	}
	return "working tree at " + head + " with uncommitted changes in " + strings.Join(dirty, ", ")
}

// running is a target ready for load.
type running struct {
	addr  string
	admin string    // keyway's admin listener
	p     *proc     // nil for direct
	tls   *tlsFiles // non-nil: the target terminates TLS
}

// start starts t in front of the replicas (terminating TLS with tf unless
// nil) and waits until it proxies a request. A port taken by someone else
// between freePort and the bind is retried with a new one.
func (h *Harness) start(ctx context.Context, t *target, maxConns int, tf *tlsFiles) (*running, error) {
	if t.config == nil {
		return &running{addr: h.replicas[0].addr()}, nil
	}
	var last error
	for attempt := range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		admin, err := freePort()
		if err != nil {
			return nil, err
		}
		env := &targetEnv{maxConns: maxConns, adminPort: admin, nofile: h.nofile, tls: tf, fwd: h.cfg.ForwardHeaders, bodies: bodyTargetEnv(h.cfg.Bodies)}
		if h.cfg.Saturation {
			env.sat = &satTargetConfig{concurrency: h.cfg.Sat.Concurrency, service: h.cfg.Sat.Service}
		}
		for _, r := range h.replicas {
			env.replicas = append(env.replicas, r.addr())
		}
		tdir := filepath.Join(h.dir, fmt.Sprintf("%s-%d", dirName(t.name), attempt))
		if tf != nil {
			tdir += "-tls"
		}
		if err := os.MkdirAll(tdir, 0o755); err != nil {
			return nil, err
		}
		args, err := t.config(tdir, port, env)
		if err != nil {
			return nil, err
		}
		penv := t.env
		if t.name == "caddy" {
			penv = append(penv[:len(penv):len(penv)], "HOME="+tdir, "XDG_CONFIG_HOME="+tdir, "XDG_DATA_HOME="+tdir)
		}
		penv = append(penv[:len(penv):len(penv)], env.procEnv...)
		p, err := startProc(t.name, tdir, h.proxyCPU, penv, append([]string{t.bin}, args...)...)
		if err != nil {
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		var rconf *tls.Config
		if tf != nil {
			rconf = tf.clientConfig()
		}
		if err := waitReady(ctx, addr, 15*time.Second, p.alive, rconf); err != nil {
			p.stop(5 * time.Second)
			last = fmt.Errorf("%s did not start: %w\n%s", t.name, err, p.tail(1500))
			continue
		}
		r := &running{addr: addr, p: p, tls: tf}
		if t.name == "keyway" {
			r.admin = net.JoinHostPort("127.0.0.1", strconv.Itoa(admin))
		}
		return r, nil
	}
	return nil, last
}

// dirName is a target's name as a directory name: "keyway@HEAD (A)"
// becomes "keyway-HEAD--A-".
func dirName(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, name)
}

func (r *running) stop() {
	if r.p != nil {
		r.p.stop(10 * time.Second)
	}
}

// measure runs every measurement of one target in one round: memory with
// idle connections on a fresh process, then throughput, CPU, peak RSS and
// routing on another fresh process, then latency at each fixed rate; with
// -tls, then the TLS measurements (measureTLS).
func (h *Harness) measure(ctx context.Context, t *target, round int) TargetRun {
	run := TargetRun{Round: round + 1, Target: t.name, LoadAvg: loadAvg()}
	fail := func(what string, err error) {
		run.Failures = append(run.Failures, what+": "+err.Error())
		h.logf("%s round %d: %s failed: %v", t.name, round+1, what, err)
	}
	h.measurePlain(ctx, t, round, &run, fail)
	if h.tls != nil && t.config != nil && !t.noTLS && ctx.Err() == nil {
		h.measureTLS(ctx, t, round, &run)
	}
	return run
}

func (h *Harness) measurePlain(ctx context.Context, t *target, round int, run *TargetRun, fail func(string, error)) {
	maxConns := h.cfg.IdleConns + 2048

	if h.cfg.IdleConns > 0 && t.config != nil {
		if ir, err := h.measureIdle(ctx, t, maxConns, nil, round == h.cfg.Rounds-1); err != nil {
			fail("idle connections", err)
		} else {
			run.Idle = &ir
			h.logf("%s round %d: %d idle connections, %.0f bytes each", t.name, round+1, ir.Conns, ir.BytesPerConn)
		}
	}

	rt, err := h.start(ctx, t, maxConns, nil)
	if err != nil {
		fail("start", err)
		return
	}
	defer rt.stop()

	seed := round*1000 + 1
	plain := loadSpec{}
	if h.cfg.Warmup > 0 {
		if _, err := h.throughput(ctx, rt, plain, h.cfg.Warmup, seed+7); err != nil {
			fail("warm-up", err)
			return
		}
	}
	for _, r := range h.replicas {
		r.reset()
	}
	tr, err := h.loadRun(ctx, rt, plain, h.cfg.Duration, seed)
	if err != nil {
		fail("throughput", err)
	} else {
		if rt.p != nil {
			if mem, err := treeMem(rt.p.pid()); err != nil {
				fail("proxy stats", err)
			} else {
				tr.PeakRSSBytes = mem.hwm
			}
		}
		reps := h.replicas
		if t.config == nil {
			reps = reps[:1]
		}
		tr.Routing = measureRouting(reps)
		run.Throughput = &tr
		h.logf("%s round %d: %.0f req/s (%s), proxy CPU %.0f%%, %.1f µs/req, errors %d", t.name, round+1, tr.RPS, tr.Tool, 100*tr.CPUUtil, tr.CPUPerReqUS, tr.Errors)
	}
	if rt.admin != "" && h.cfg.Profile > 0 && round == h.cfg.Rounds-1 {
		// An extra, unrecorded run, so that profiling costs no measured
		// throughput.
		profile := make(chan error, 1)
		go func() { profile <- h.saveProfile(ctx, rt.admin) }()
		if _, err := h.throughput(ctx, rt, plain, h.cfg.Profile+time.Second, seed+11); err != nil {
			fail("profiled run", err)
		}
		if err := <-profile; err != nil {
			fail("profile", err)
		}
	}
	if rt.p != nil && h.cfg.Syscalls && round == h.cfg.Rounds-1 {
		if per, err := h.countSyscalls(ctx, rt, min(h.cfg.Duration, 5*time.Second), seed+13); err != nil {
			fail("syscall count", err)
		} else {
			run.Syscalls = per
			h.logf("%s round %d: %.2f system calls per request", t.name, round+1, per["all"])
		}
		for _, rate := range h.cfg.Rates {
			per, err := h.countSyscallsAtRate(ctx, rt, rate, min(h.cfg.LatencyDuration, 5*time.Second), uint64(seed+19+rate))
			if err != nil {
				fail(fmt.Sprintf("syscall count at %d/s", rate), err)
				continue
			}
			if run.SyscallsAtRate == nil {
				run.SyscallsAtRate = map[int]map[string]float64{}
			}
			run.SyscallsAtRate[rate] = per
			h.logf("%s round %d: %.2f system calls, %.2f context switches per request at %d/s", t.name, round+1, per["all"], per["context-switches"], rate)
		}
	}
	for _, rate := range h.cfg.Rates {
		pid := 0
		if rt.p != nil {
			pid = rt.p.pid()
		}
		lr, err := runLatency(ctx, rt.addr, &h.cfg, rate, min(h.cfg.Warmup, time.Second), h.cfg.LatencyDuration, uint64(seed+rate), pid)
		if err != nil {
			fail(fmt.Sprintf("latency at %d/s", rate), err)
			continue
		}
		run.Latency = append(run.Latency, lr)
		cpu := ""
		if lr.CPUPerReqUS != nil && lr.CPUUtil != nil {
			cpu = fmt.Sprintf(", proxy CPU %.0f%%, %.1f µs/req", 100**lr.CPUUtil, *lr.CPUPerReqUS)
		}
		held := ""
		if lr.UnderRate {
			held = " (UNDER RATE)"
		}
		h.logf("%s round %d: %d/s p50 %.3f p99 %.3f p99.9 %.3f max %.3f ms, errors %d%s; sent %.0f/s%s, send lag p99 %.1f ms", t.name, round+1, rate, lr.P50, lr.P99, lr.P999, lr.Max, lr.Errors, cpu, lr.AchievedRate, held, lr.SendLagP99)
	}
	if h.cfg.SparseConns > 0 && rt.p != nil {
		sr, err := runSparse(ctx, rt.addr, h.cfg.SparseConns, h.cfg.Keys, h.cfg.SparsePeriod, h.cfg.SparsePeriod+time.Second, h.cfg.LatencyDuration, rt.p.pid())
		if err != nil {
			fail("sparse clients", err)
		} else {
			run.Sparse = &sr
			h.logf("%s round %d: %d connections each sending every %v: %.0f req/s, proxy CPU %.0f%%, %.1f µs/req, errors %d", t.name, round+1, sr.Conns, h.cfg.SparsePeriod, sr.Rate, 100*sr.CPUUtil, sr.CPUPerReqUS, sr.Errors)
		}
	}
	// The plain baseline of the handshake run, last because it leaves
	// thousands of closed connections behind.
	if h.tls != nil && rt.p != nil {
		if nc, err := h.newConnRun(ctx, rt, loadSpec{newConn: true}, seed+17); err != nil {
			fail("new connection per request", err)
		} else {
			run.NewConn = &nc
			h.logf("%s round %d: plain, new connection per request: %.0f conn/s, proxy CPU %.0f%%, %.1f µs/conn, errors %d", t.name, round+1, nc.RPS, 100*nc.CPUUtil, nc.CPUPerReqUS, nc.Errors)
		}
	}
	if rt.p != nil && !rt.p.alive() {
		fail("process", fmt.Errorf("%s exited during the run: %v\n%s", t.name, rt.p.err, rt.p.tail(1500)))
	}
}

// measureTLS measures t terminating TLS: memory with idle TLS connections
// on a fresh process, then, on another fresh process, what it negotiates,
// keep-alive throughput and CPU per request, and the handshake run (a new
// connection, so a full handshake, per request).
func (h *Harness) measureTLS(ctx context.Context, t *target, round int, run *TargetRun) {
	tr := &tlsTargetRun{}
	run.TLS = tr
	fail := func(what string, err error) {
		run.Failures = append(run.Failures, "TLS "+what+": "+err.Error())
		h.logf("%s round %d: TLS %s failed: %v", t.name, round+1, what, err)
	}
	maxConns := h.cfg.IdleConns + 2048
	if h.cfg.IdleConns > 0 {
		if ir, err := h.measureIdle(ctx, t, maxConns, h.tls, false); err != nil {
			fail("idle connections", err)
		} else {
			tr.Idle = &ir
			h.logf("%s round %d: %d idle TLS connections, %.0f bytes each", t.name, round+1, ir.Conns, ir.BytesPerConn)
		}
	}
	rt, err := h.start(ctx, t, maxConns, h.tls)
	if err != nil {
		fail("start", err)
		return
	}
	defer rt.stop()
	if p, err := probeTLS(ctx, rt.addr, h.tls); err != nil {
		fail("probe", err)
	} else {
		tr.Probe = p
		h.logf("%s round %d: TLS negotiated %s", t.name, round+1, p)
	}

	seed := round*1000 + 101
	ka := loadSpec{tls: h.tls}
	if h.cfg.Warmup > 0 {
		if _, err := h.throughput(ctx, rt, ka, h.cfg.Warmup, seed+7); err != nil {
			fail("warm-up", err)
			return
		}
	}
	if tp, err := h.loadRun(ctx, rt, ka, h.cfg.Duration, seed); err != nil {
		fail("throughput", err)
	} else {
		tr.Throughput = &tp
		h.logf("%s round %d: TLS keep-alive: %.0f req/s (%s), proxy CPU %.0f%%, %.1f µs/req, errors %d", t.name, round+1, tp.RPS, tp.Tool, 100*tp.CPUUtil, tp.CPUPerReqUS, tp.Errors)
	}
	if hs, err := h.newConnRun(ctx, rt, loadSpec{tls: h.tls, newConn: true}, seed+17); err != nil {
		fail("handshakes", err)
	} else {
		tr.NewConn = &hs
		h.logf("%s round %d: TLS, full handshake per request: %.0f handshakes/s, proxy CPU %.0f%%, %.1f µs/handshake, errors %d", t.name, round+1, hs.RPS, 100*hs.CPUUtil, hs.CPUPerReqUS, hs.Errors)
	}
	if rt.p != nil && !rt.p.alive() {
		fail("process", fmt.Errorf("%s exited during the run: %v\n%s", t.name, rt.p.err, rt.p.tail(1500)))
	}
}

// newConnRun is a closed-loop run with a new connection per request, after
// an unmeasured warm-up of the same kind of up to 1s.
func (h *Harness) newConnRun(ctx context.Context, rt *running, spec loadSpec, seed int) (throughputRun, error) {
	if w := min(h.cfg.Warmup, time.Second); w > 0 {
		if _, err := h.throughput(ctx, rt, spec, w, seed+1); err != nil {
			return throughputRun{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	return h.loadRun(ctx, rt, spec, h.cfg.Duration, seed)
}

// loadRun is a measured closed-loop run: the load, and the proxy's CPU
// time during it from /proc.
func (h *Harness) loadRun(ctx context.Context, rt *running, spec loadSpec, d time.Duration, seed int) (throughputRun, error) {
	var cpu0, sys0 float64
	if rt.p != nil {
		var err error
		if cpu0, sys0, err = treeCPUSys(rt.p.pid()); err != nil {
			return throughputRun{}, fmt.Errorf("proxy stats: %w", err)
		}
	}
	tr, err := h.throughput(ctx, rt, spec, d, seed)
	if err != nil {
		return tr, err
	}
	if rt.p != nil {
		cpu1, sys1, err := treeCPUSys(rt.p.pid())
		if err != nil {
			return tr, fmt.Errorf("proxy stats: %w", err)
		}
		tr.setCPU(cpu1 - cpu0)
		if tr.Requests > 0 {
			tr.SysPerReqUS = (sys1 - sys0) / float64(tr.Requests) * 1e6
		}
	}
	return tr, nil
}

func (h *Harness) throughput(ctx context.Context, rt *running, spec loadSpec, d time.Duration, seed int) (throughputRun, error) {
	if spec.newConn {
		return runNewConns(ctx, rt.addr, &h.cfg, spec, d, uint64(seed))
	}
	if h.loadgen == "wrk" {
		return runWrk(ctx, h.dir, h.loadCPU, rt.addr, &h.cfg, spec, d, seed)
	}
	return runVegetaMax(ctx, rt.addr, &h.cfg, spec, d, uint64(seed))
}

// measureIdle starts a fresh process, measures its RSS, opens the idle
// connections, measures again and stops it. For keyway it also records the
// Go runtime's split of the memory and, in the last round with -profile, a
// heap profile with the connections open.
func (h *Harness) measureIdle(ctx context.Context, t *target, maxConns int, tf *tlsFiles, last bool) (idleRun, error) {
	rt, err := h.start(ctx, t, maxConns, tf)
	if err != nil {
		return idleRun{}, err
	}
	defer rt.stop()
	// A few requests first so that the pools and buffers every request
	// needs exist before the baseline.
	warm, err := openIdle(ctx, rt.addr, 32, h.cfg.Keys, tf)
	if err != nil {
		return idleRun{}, fmt.Errorf("warm-up: %w", err)
	}
	closeAll(warm)
	before, err := settledRSS(ctx, rt.p.pid(), 3*time.Second)
	if err != nil {
		return idleRun{}, err
	}
	var goBefore *goMem
	if rt.admin != "" {
		if goBefore, err = scrapeGoMem(ctx, rt.admin); err != nil {
			return idleRun{}, err
		}
	}
	start := time.Now()
	conns, err := openIdle(ctx, rt.addr, h.cfg.IdleConns, h.cfg.Keys, tf)
	if err != nil {
		return idleRun{}, err
	}
	defer closeAll(conns)
	opened := time.Since(start)
	select {
	case <-ctx.Done():
		return idleRun{}, ctx.Err()
	case <-time.After(h.cfg.IdleHold):
	}
	with, err := settledRSS(ctx, rt.p.pid(), 5*time.Second)
	if err != nil {
		return idleRun{}, err
	}
	ir := idleRun{
		Conns: len(conns), RSSBefore: before, RSSWith: with, OpenSeconds: opened.Seconds(),
		BytesPerConn: float64(with-before) / float64(len(conns)), GoBefore: goBefore,
	}
	if rt.admin != "" {
		if ir.GoWith, err = scrapeGoMem(ctx, rt.admin); err != nil {
			return idleRun{}, err
		}
		if last && h.cfg.Profile > 0 {
			b, err := httpGet(ctx, "http://"+rt.admin+"/debug/pprof/heap")
			if err != nil {
				return idleRun{}, err
			}
			if err := h.saveOutput("keyway-heap-idle.prof", b); err != nil {
				return idleRun{}, err
			}
		}
	}
	return ir, nil
}

// saveOutput writes a file into the output directory.
func (h *Harness) saveOutput(name string, b []byte) error {
	if err := os.MkdirAll(h.cfg.OutDir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(h.cfg.OutDir, name)
	h.logf("%s written", path)
	return os.WriteFile(path, b, 0o644)
}

// saveProfile takes a CPU profile of keyway through its admin listener
// while load runs and writes it to the output directory.
func (h *Harness) saveProfile(ctx context.Context, admin string) error {
	secs := max(1, int(h.cfg.Profile.Seconds()))
	b, err := httpGet(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs))
	if err != nil {
		return err
	}
	return h.saveOutput("keyway-cpu.prof", b)
}

// environment records what the numbers were measured on.
func environment() Env {
	e := Env{GoVersion: runtime.Version(), CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return e
}
