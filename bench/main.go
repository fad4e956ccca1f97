// Command bench is keyway's side-by-side load harness: it starts counting
// replicas on loopback, puts keyway (the real binary), gofloor (a minimal
// fasthttp proxy, the floor for Go: floor.go), HAProxy, nginx and Caddy in
// front of them in turn, each configured for one core and hashing on
// X-Key, and measures throughput, CPU per request, latency and proxy CPU
// per request at fixed rates, CPU for sparse keep-alive clients, key
// affinity, balance and memory, interleaving the targets over several
// rounds.
//
//	go run ./bench                              # every installed target, defaults below
//	go run ./bench -rounds 1 -duration 5s -targets direct,keyway
//	go run ./bench -tls -rates "" -targets keyway,haproxy,nginx,caddy   # plus TLS termination
//	go run ./bench -bodies 1MiB,64MiB -targets keyway,haproxy,nginx  # body throughput instead
//	go run ./bench -restarts -rounds 5          # what restarts and upgrades cost in requests
//
// It prints markdown tables and writes results.json, results.md and one
// latency percentile plot per rate (latency-RATE.svg) to -out. Method and
// results: docs/benchmarks.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "floor-proxy" {
		// The gofloor target (floor.go), started by the harness.
		if err := floorProxyMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench floor-proxy:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	var rates, targets string
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of each throughput (wrk) run")
	fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "unmeasured load before each throughput run (and up to 1s before each latency run)")
	fs.IntVar(&cfg.Connections, "connections", 64, "client connections of the throughput runs")
	fs.StringVar(&rates, "rates", "1000,3000", "fixed request rates of the open-loop latency runs (latency and proxy CPU per request at that rate), comma-separated; empty: none")
	fs.DurationVar(&cfg.LatencyDuration, "latency-duration", 10*time.Second, "length of each latency run")
	fs.IntVar(&cfg.Replicas, "replicas", 3, "replicas behind each proxy")
	fs.IntVar(&cfg.Body, "body", 1024, "request body size in bytes")
	fs.IntVar(&cfg.Keys, "keys", 10000, "distinct X-Key values, drawn uniformly")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "rounds; targets are interleaved within each round")
	fs.StringVar(&targets, "targets", strings.Join(targetNames, ","), "targets to measure, comma-separated; a proxy that is not installed is skipped with a note")
	fs.IntVar(&cfg.IdleConns, "idle-conns", 10000, "idle keep-alive client connections for the memory test; 0 skips it")
	fs.IntVar(&cfg.SparseConns, "sparse-conns", 2000, "keep-alive connections of the sparse-client run, each sending one request every -sparse-period (proxies only, measured for -latency-duration); 0 skips it")
	fs.DurationVar(&cfg.SparsePeriod, "sparse-period", 3*time.Second, "how often each connection of the sparse-client run sends")
	fs.DurationVar(&cfg.IdleHold, "idle-hold", 15*time.Second, "how long the idle connections stay open before their memory is read (then it is read once it settles)")
	fs.StringVar(&cfg.LoadGen, "loadgen", "auto", "throughput load generator: wrk, vegeta, or auto (wrk when installed)")
	fs.BoolVar(&cfg.Pin, "pin", true, "pin the proxy to CPU 0 and the harness, replicas and load generator to CPU 1")
	fs.BoolVar(&cfg.Syscalls, "syscalls", false, "count each proxy's system calls per request with perf stat during an extra load run in the last round (needs perf and tracefs)")
	fs.BoolVar(&cfg.TLS, "tls", false, "also measure every proxy terminating TLS 1.3 (fresh processes, same rounds): keep-alive CPU per request, full handshakes per second and CPU per handshake (a new connection per request, with a plain-HTTP baseline), memory per idle TLS connection")
	fs.BoolVar(&cfg.ForwardHeaders, "forward-headers", false, "make HAProxy and nginx add the forwarding headers keyway adds by default (X-Forwarded-For, -Proto, -Host, X-Request-Id), so that every proxy does the same work per request; off, they add none")
	fs.DurationVar(&cfg.Profile, "profile", 0, "if > 0, take a keyway CPU profile this long (admin /debug/pprof/profile) during an extra load run in the last round, saved as keyway-cpu.prof in -out")
	fs.StringVar(&cfg.OutDir, "out", filepath.Join("bench", "results"), "output directory")
	fs.StringVar(&cfg.Keyway, "keyway", "", "a prebuilt keyway binary; empty: go build ./cmd/keyway")
	fs.StringVar(&cfg.KeywayRev, "keyway-rev", "", "build keyway from this git revision (e.g. HEAD) instead of the working tree")
	fs.BoolVar(&cfg.Saturation, "saturation", false, "saturation mode instead of the other measurements: replicas with a fixed service capacity, each proxy (keyway, haproxy) loaded open loop at each -sat-levels multiple of it; see docs/benchmarks.md")
	fs.IntVar(&cfg.Sat.Concurrency, "sat-concurrency", 2, "saturation: requests one replica serves at once")
	fs.DurationVar(&cfg.Sat.Service, "sat-service", 20*time.Millisecond, "saturation: service time of one request; capacity = replicas × sat-concurrency ÷ sat-service")
	satLevels := fs.String("sat-levels", "1,2,4", "saturation: load levels, multiples of capacity, comma-separated")
	fs.Float64Var(&cfg.Sat.BaseFactor, "sat-base-factor", 0.5, "saturation: the unloaded rate before and after each level, multiple of capacity")
	fs.DurationVar(&cfg.Sat.Base, "sat-base", 3*time.Second, "saturation: length of the unloaded phase before each level (its p99 is the reference)")
	fs.DurationVar(&cfg.Sat.Duration, "sat-duration", 10*time.Second, "saturation: length of each overload phase")
	fs.DurationVar(&cfg.Sat.Recovery, "sat-recovery", 30*time.Second, "saturation: length of the unloaded phase after the drop, in which the time to recover is measured")
	fs.DurationVar(&cfg.Sat.Timeout, "sat-timeout", 10*time.Second, "saturation: the load generator's timeout per request")
	fs.Float64Var(&cfg.Sat.Bound, "sat-recovery-bound", 1.5, "saturation: recovered when the sliding-window p99 is within this multiple of the base p99")
	cfg.Sat.Window, cfg.Sat.Step, cfg.Sat.Hold = 500*time.Millisecond, 100*time.Millisecond, time.Second
	pair := fs.String("pair", "", "paired mode instead of the other measurements: two targets A,B (a proxy of -targets, or keyway@REV built from a git revision) run at once on the proxy's core, each under its own open-loop load at every -rates rate for -latency-duration, fresh processes each round; prints A ÷ B CPU per request and p50 per round's median (see docs/benchmarks.md)")
	fs.DurationVar(&cfg.PairAlternate, "pair-alternate", 0, "paired mode: measure A and B in turn, in slices of this length (A B B A A B ...), each alone on the proxy's core while loaded, instead of both at once; 0: at once (a target can wait two slices for its next turn: keep that under keyway's server.park_idle_after, 2s, so that its client connections do not park in between; 500ms does)")
	fs.IntVar(&cfg.Instructions, "instructions", 0, "instruction-count mode instead of the other measurements: each proxy of -targets under valgrind's cachegrind, a short and a long run on fresh processes, this many requests apart (2000 is plenty); prints instructions per request and the functions they go to (needs valgrind)")
	bodies := fs.String("bodies", "", "body-throughput mode instead of the other measurements: request body sizes, comma-separated (1MiB,64MiB); each target streams POSTs of each size from -body-conns connections for -duration to one replica that reads and drops them, a fresh process per target and size; prints MB/s, proxy CPU per GB, MB/s per proxy core and peak RSS (see docs/benchmarks.md)")
	fs.IntVar(&cfg.BodyConns, "body-conns", 4, "body mode: concurrent client connections, each sending one body after the other")
	fs.BoolVar(&cfg.Restarts, "restarts", false, "restart mode instead of the other measurements: what a restart, binary upgrade or reload of keyway (and HAProxy's master-worker reload) costs in requests, under open-loop keyed POSTs, a fresh process per case and round (see docs/benchmarks.md)")
	rc := &RestartConfig{}
	restartCasesFlag := fs.String("restart-cases", "all", "restart mode: cases, comma-separated, or all: "+strings.Join(restartCaseNames, ", "))
	fs.IntVar(&rc.Rate, "restart-rate", 1000, "restart mode: requests per second, open loop")
	fs.IntVar(&rc.Conns, "restart-conns", 64, "restart mode: keep-alive connections of the client pool, at most")
	fs.DurationVar(&rc.Before, "restart-before", 2*time.Second, "restart mode: load before the signal")
	fs.DurationVar(&rc.After, "restart-after", 3*time.Second, "restart mode: load after the operation is over (the new process accepts and the old one has exited)")
	fs.DurationVar(&rc.Timeout, "restart-timeout", 5*time.Second, "restart mode: the client gives a request up after this (a timeout), counted from its scheduled send")
	fs.DurationVar(&rc.DrainIdle, "restart-drain-idle", 5*time.Second, "restart mode: keyway's server.drain_idle in every case but sigterm-exit (5s is keyway's default)")
	exitDrain := fs.String("restart-exit-drain-idle", "5s,1s", "restart mode: sigterm-exit runs once with each of these server.drain_idle values, comma-separated")
	fs.DurationVar(&rc.ShutdownTimeout, "restart-shutdown-timeout", 30*time.Second, "restart mode: keyway's server.shutdown_timeout and HAProxy's hard-stop-after (30s is keyway's default)")
	fs.BoolVar(&rc.Warm, "restart-warm", true, "restart mode: open every connection of the client pool (-restart-conns) before the load, 1s before it starts; the load keeps a few of them busy and the others idle (parked by keyway) when the signal comes; false: the pool opens only what the load needs")
	fs.IntVar(&rc.IdleConns, "restart-idle-conns", 0, "restart mode: also open this many keep-alive connections before the load, each carrying one request, silent afterwards (clients holding an idle connection: keyway keeps them for server.drain_idle when it stops)")
	fs.DurationVar(&rc.Retry, "restart-retry", 10*time.Millisecond, "restart mode, sigterm-start: a start that failed (port still held) is retried this long after it began")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	var err error
	if cfg.Rates, err = parseRates(rates); err != nil {
		return err
	}
	if cfg.Sat.Factors, err = parseFactors(*satLevels); err != nil {
		return err
	}
	if cfg.Pair, err = parsePair(*pair); err != nil {
		return err
	}
	if cfg.Bodies, err = parseBodies(*bodies); err != nil {
		return err
	}
	if cfg.Restarts {
		targetsSet := false
		fs.Visit(func(f *flag.Flag) { targetsSet = targetsSet || f.Name == "targets" })
		if !targetsSet {
			targets = "keyway,haproxy" // the proxies the mode measures
		}
		rc.Cases = parseCases(*restartCasesFlag)
		if rc.ExitDrainIdles, err = parseDurations("-restart-exit-drain-idle", *exitDrain); err != nil {
			return err
		}
		cfg.Restart = rc
	}
	for _, t := range strings.Split(targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			cfg.Targets = append(cfg.Targets, t)
		}
	}
	if cfg.Keyway == "" || len(cfg.Pair) > 0 {
		if cfg.Repo, err = moduleRoot(); err != nil {
			return err
		}
	}
	if !*quiet {
		cfg.Log = stderr
	}
	rep, err := Run(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, rep.Markdown())
	files, err := writeFiles(rep, cfg.OutDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nWritten: %s\n", strings.Join(files, ", "))
	return nil
}

func parseRates(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-rates: %q is not a positive whole number of requests per second", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// moduleRoot finds the directory holding keyway's go.mod, from the
// working directory upwards.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module keyway\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("keyway's go.mod not found above the working directory; run from the repository or pass -keyway")
		}
		dir = parent
	}
}
