package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/internal/buildinfo"
	"keyway/server"

	"go.uber.org/zap"
)

// Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad configuration.
const (
	exitRuntime = 1
	exitConfig  = 2
)

// usageError is a command-line mistake (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// helpRequested ends a command whose flags asked for --help (-h): run
// prints its usage to stdout and returns nil (exit 0), as for `keyway
// help`; usage and the flags' problems go to stderr only for a mistake.
type helpRequested struct{ usage []byte }

func (helpRequested) Error() string { return "help requested" }

func exitCode(err error) int {
	var ce *config.Error
	var ue usageError
	var be *bindError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce), errors.As(err, &ue), errors.As(err, &be):
		return exitConfig
	}
	return exitRuntime
}

const topUsage = `keyway — a load-balancing HTTP ingress proxy for pipeline replica sets.

Usage:
  keyway demo                   run a proxy and three demo replicas on loopback
  keyway replica --name NAME    run one demo replica (a stand-in pipeline job)
  keyway proxy -c FILE          run the proxy
  keyway agent [-c FILE]        run the sidecar beside one replica (every key is also a flag)
  keyway validate -c FILE       check a configuration file and exit
  keyway status                 replica sets, phases and replicas of a running proxy (--admin ADDR)
  keyway members                gossip members a running proxy knows (--admin ADDR)
  keyway route --set S --key K  where a key goes now and why (--admin ADDR)
  keyway plan --set S --add R --remove R  what adding or removing ring members would move (nothing changes)
  keyway drain --set S --replica R    take a replica out of rotation on every proxy (--token-file F)
  keyway undrain --set S --replica R  end that drain
  keyway reload                 make a running proxy re-read its configuration file (like SIGHUP)
  keyway scale --set S --replicas N   change a set's replica count, fleet-wide (with run: start or stop jobs)
  keyway jobs --set S           the jobs of a set whose replicas keyway runs (its run section)
  keyway create -f SET.json     create a replica set at run time, fleet-wide
  keyway stop --set S           stop a set: drained on every proxy, 503 for its requests, processes stopped
  keyway start --set S          start a stopped set again
  keyway delete --set S         delete a set none of whose replicas runs (stop it first)
  keyway runtime [export|clear --set S]  the fleet's run-time state; write it back to the file
  keyway repair --set S         restart a set's replicas that gave up, lift every proxy's holds
  keyway restart --set S        rolling restart: one replica at a time, drained first, no request lost
                                (--force: no wait for requests in flight; --ack: clear a failed restart's mark)
  keyway audit --set S --key K  what happened to a key's partition, across every proxy's runs (audit trail)
                                (audit sets, audit runs SET; --from s3://BUCKET/PREFIX or a directory)
  keyway keys --sets S,... --out DIR  make the fleet's signing keys (credentials files, Secrets); --rotate, --add-set
  keyway certs --out DIR        make throw-away TLS certificates for trying TLS (the files the examples name)
  keyway version                print the version

Run 'keyway COMMAND --help' for a command's flags.
`

// topCommands are the commands topUsage lists, in its order.
func topCommands() []string {
	var out []string
	for _, m := range topCommandRE.FindAllStringSubmatch(topUsage, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

var (
	topCommandRE  = regexp.MustCompile(`(?m)^  keyway (\w+)`)
	commandWordRE = regexp.MustCompile(`^[a-z|]+$`) // "runtime", "clear", "stop|start": not a flag or an argument
)

// tokenCommands are the commands that need the admin token, as their
// usage says: each synopsis line of a command's usage ("Usage: keyway
// drain --set SET ... [--token-file FILE]") that takes --token-file names
// one, or two for "keyway stop|start", and a subcommand with its command
// ("runtime clear"). TestTokenCommands checks that the synopses take
// --token-file exactly where the flags do.
func tokenCommands() []string {
	var out []string
	for _, cmd := range topCommands() {
		h, ok := errors.AsType[helpRequested](runCommand(context.Background(), []string{cmd, "--help"}, io.Discard, io.Discard))
		if !ok {
			continue
		}
		for _, line := range strings.Split(string(h.usage), "\n") {
			line = strings.TrimSpace(strings.TrimPrefix(line, "Usage:"))
			rest, ok := strings.CutPrefix(line, "keyway ")
			if !ok || !strings.Contains(rest, "--token-file") {
				continue
			}
			var words []string
			for _, w := range strings.Fields(rest) {
				if !commandWordRE.MatchString(w) {
					break
				}
				words = append(words, w)
			}
			for _, name := range strings.Split(strings.Join(words, " "), "|") {
				if !slices.Contains(out, name) {
					out = append(out, name)
				}
			}
		}
	}
	return out
}

// run is the whole program behind main, testable: it parses args, loads
// the configuration and runs the components until ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := runCommand(ctx, args, stdout, stderr)
	if h, ok := errors.AsType[helpRequested](err); ok {
		_, err = stdout.Write(h.usage)
	}
	return err
}

// runCommand runs the command args[0].
func runCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, topUsage)
		return usageError{"no command given"}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "proxy":
		return runProxy(ctx, rest, stdout, stderr)
	case "validate":
		return runValidate(rest, stdout, stderr)
	case "agent":
		return runAgent(ctx, rest, stdout, stderr)
	case "replica":
		return runReplica(ctx, rest, stdout, stderr)
	case "demo":
		return runDemo(ctx, rest, stdout, stderr)
	case "status":
		return runStatus(rest, stdout, stderr)
	case "members":
		return runMembers(rest, stdout, stderr)
	case "route":
		return runRoute(rest, stdout, stderr)
	case "plan":
		return runPlan(rest, stdout, stderr)
	case "drain", "undrain":
		return runDrain(rest, cmd == "drain", stdout, stderr)
	case "reload":
		return runReload(rest, stdout, stderr)
	case "scale":
		return runScale(rest, stdout, stderr)
	case "create":
		return runCreate(rest, stdout, stderr)
	case "stop", "start":
		return runStopStart(rest, cmd == "stop", stdout, stderr)
	case "delete":
		return runDelete(rest, stdout, stderr)
	case "runtime":
		return runRuntime(rest, stdout, stderr)
	case "repair":
		return runRepair(rest, stdout, stderr)
	case "jobs":
		return runJobs(rest, stdout, stderr)
	case "restart":
		return runRestart(rest, stdout, stderr)
	case "keys":
		return runKeys(rest, stdout, stderr)
	case "audit":
		return runAudit(ctx, rest, stdout, stderr)
	case "certs":
		return runCerts(rest, stdout, stderr)
	case "version", "--version", "-v":
		fs := flag.NewFlagSet("version", flag.ContinueOnError)
		if err := parseArgs(fs, rest, stderr, func() { fmt.Fprint(fs.Output(), versionUsage) }); err != nil {
			return err
		}
		fmt.Fprintln(stdout, versionString())
		return nil
	case "help", "--help", "-h":
		if len(rest) > 0 && rest[0] != "help" && !strings.HasPrefix(rest[0], "-") {
			return runCommand(ctx, []string{rest[0], "--help"}, stdout, stderr) // keyway help CMD
		}
		fmt.Fprint(stdout, topUsage)
		return nil
	default:
		fmt.Fprint(stderr, topUsage)
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
}

// versionString is the line `keyway version` prints and every node logs
// at start (buildinfo: stamped by make build, or what Go recorded).
func versionString() string { return buildinfo.Get().String() }

const versionUsage = `Usage: keyway version

Prints the version, the git commit, the build date and the Go version of
this binary, e.g.

  keyway v1.2.0 commit 0123456789ab built 2026-11-30T19:00:00Z go1.26.8

'make build' (and the Dockerfile) stamp them; a binary built with plain
'go build' shows what Go recorded: the commit when built in a git checkout,
"(devel)" as the version. /metrics says the same: keyway_build_info.
`

const precedenceNote = `
Precedence: built-in defaults < the file < KEYWAY_* environment variables
(e.g. KEYWAY_LISTEN, KEYWAY_ADMIN_LISTEN, KEYWAY_LOG_LEVEL) < flags.
See docs/configuration.md for every key.
`

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, usage string) error {
	return parseArgs(fs, args, stderr, func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), precedenceNote)
	})
}

// parseArgs parses a command's flags. usage writes to fs.Output(): for
// --help (-h) it ends up on stdout and the command ends with exit 0 (a
// helpRequested error that run turns into the usage text); for a bad flag
// on stderr, after the flag's problem (exit 2). No positional arguments
// are allowed: a lone file name where -c FILE is meant gets a hint.
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer, usage func()) error {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	fs.Usage = usage
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return helpRequested{usage: buf.Bytes()}
	case err != nil:
		_, _ = stderr.Write(buf.Bytes())
		return usageError{err.Error()}
	case fs.NArg() == 0:
		return nil
	}
	if c := fs.Lookup("c"); c != nil && c.Value.String() == "" && looksLikeFile(fs.Arg(0)) {
		return usageError{fmt.Sprintf("unexpected argument %q: did you mean -c %s? (keyway %s takes its configuration file with -c FILE, and flags before any other argument)",
			fs.Arg(0), fs.Arg(0), fs.Name())}
	}
	return usageError{fmt.Sprintf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
}

// looksLikeFile reports whether a stray argument is probably a
// configuration file: a YAML name, or a file that exists.
func looksLikeFile(arg string) bool {
	if ext := strings.ToLower(filepath.Ext(arg)); ext == ".yaml" || ext == ".yml" {
		return true
	}
	fi, err := os.Stat(arg)
	return err == nil && fi.Mode().IsRegular()
}

func loadConfig(cf *config.ProxyFlags, extra ...config.Option) (config.Config, error) {
	if cf.File == "" {
		return config.Config{}, usageError{"no configuration file: pass -c FILE (try examples/minimal.yaml)"}
	}
	cfg, err := config.Load(cf.File, append(cf.Options(), extra...)...)
	return cfg, proxyFileHint(err, cf.File)
}

func runValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	cf := config.NewProxyFlags(fs)
	previous := fs.String("previous", "", "the configuration `FILE` running now: warn about what the change would do (a removed set whose requests would go to another set)")
	if err := parseFlags(fs, args, stderr, "Usage: keyway validate -c FILE [--previous FILE] [flags]\n\nChecks a configuration file, prints a one-line summary and exits 0, or\nprints every problem and exits 2. An agent's file (keys replica, probe,\ndrain, supervise) is checked as keyway agent --check -c FILE does.\nWith --previous, the file a proxy runs now, it also warns when a replica\nset the new file removes would have its requests go to another set.\n\n"); err != nil {
		return err
	}
	if cf.File != "" {
		if kind, agentKeys, _ := fileKind(cf.File); kind == config.KindAgent {
			return validateAgentFile(cf, agentKeys, stdout)
		}
	}
	// The TLS files are read and checked as the listeners will.
	cfg, err := loadConfig(cf, config.WithFileChecks())
	if err != nil {
		return err
	}
	// What keyway proxy would refuse at start beyond the file's own rules:
	// the admin token (read from its file or the environment).
	if err := admin.CheckToken(cfg.Admin, nil); err != nil {
		return usageError{err.Error()}
	}
	// Valid but unsafe (tls.insecure_skip_verify) or probably a mistake.
	for _, w := range cfg.Warnings() {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if *previous != "" {
		old, err := config.Load(*previous, cf.Options()...)
		if err != nil {
			return usageError{fmt.Sprintf("--previous: %v", err)}
		}
		for _, w := range config.FallThroughs(old, cfg) {
			fmt.Fprintln(stderr, "warning:", w)
		}
	}
	fmt.Fprintln(stdout, config.Summary(cfg))
	return nil
}

// moveGossip moves an upgrade's new process's gossip to the configured
// port once the old process has exited (and with it its gossip member),
// retrying while the port is still taken (a slow exit) for up to
// upgradeTimeout.
func moveGossip(ctx context.Context, h *handover, node *server.ProxyNode, port, advertise int) {
	log := node.Logger().Named("upgrade")
	log.Info("gossiping from a free port until the old process, which holds gossip port, has exited", zap.Int("port", port))
	if err := h.WaitForParent(ctx); err != nil && ctx.Err() != nil {
		return
	}
	deadline := time.Now().Add(upgradeTimeout)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := node.MoveGossip(ctx, port, advertise)
		if err == nil || ctx.Err() != nil {
			return
		}
		if time.Now().After(deadline) {
			log.Warn("gossip stays on its free port: the configured one is still taken; it is used again at the next restart", zap.Int("port", port), zap.Error(err))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// upgradesEnabled is set by main: binary upgrades (tableflip) need a
// process of keyway's own, started once; commands run in-process by tests
// get none.
var upgradesEnabled bool

// upgradeTimeout bounds how long an upgrade waits for the new process to
// be ready (it holds its accepts for up to 30s until it can route).
const upgradeTimeout = time.Minute

const proxyUsage = `Usage: keyway proxy -c FILE [flags]

Runs the proxy until SIGINT or SIGTERM, then stops gracefully: it stops
accepting, answers the requests in flight with Connection: close, gives
idle keep-alive connections server.drain_idle to send one more request
(answered with close), and exits as soon as no connection is left.
SIGHUP re-reads FILE (with the same flags and environment) and applies
the replica sets, log.level, admin.token_file, the TLS keys and files and
the fleet credentials (gossip.credentials_file, gossip.signatures)
without dropping a connection; a file changing any other key is refused whole and logged.
SIGUSR1 reopens the access log file (log.access.path) after a rotation.
SIGUSR2 upgrades the binary without losing a request: the executable at
the path keyway was started from runs with the same arguments, inherits
the listening sockets, and once it has joined gossip and can route, this
process stops accepting and drains as for SIGTERM. With systemd socket
activation (LISTEN_FDS) keyway serves the sockets systemd passes: the
one named proxy (FileDescriptorName=) or bound to listen, and the one
named admin or bound to admin.listen. See docs/operations.md. Example:

  keyway proxy -c examples/minimal.yaml

`

func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	cf := config.NewProxyFlags(fs)
	pidFile := fs.String("pid-file", "", "write the PID of the process that serves to `FILE` once it is ready (after an upgrade, the new process's)")
	if err := parseFlags(fs, args, stderr, proxyUsage); err != nil {
		return err
	}
	// First, so that a SIGHUP or SIGUSR1 during startup waits for the node
	// instead of killing the process (their default action).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	usr1 := make(chan os.Signal, 1)
	notifyReopen(usr1)
	defer signal.Stop(usr1)
	usr2 := make(chan os.Signal, 1)
	notifyUpgrade(usr2)
	defer signal.Stop(usr2)

	cfg, err := loadConfig(cf)
	if err != nil {
		return err
	}
	// Before anything is opened or started: this may exec.
	keepSysmonAwake(cfg.Server.RuntimeDeepSleep, stderr)
	h, err := newHandover(upgradesEnabled, *pidFile)
	if err != nil {
		return err
	}
	defer h.close()
	// The old process of an upgrade holds the gossip port until it has
	// drained, and this one must be in the cluster before it takes over:
	// it gossips from a free port meanwhile, and moves to the configured
	// one once the old process has exited.
	gossipPort, gossipAdvertise := cfg.Gossip.BindPort, cfg.Gossip.AdvertisePort
	movePort := h.Upgrading() && cfg.Gossip.Enabled && gossipPort != 0
	var firstJoin []string
	if movePort {
		cfg.Gossip.BindPort, cfg.Gossip.AdvertisePort = 0, 0
		// It joins the old process first: that may be the only other
		// member (a proxy that joins nobody, its agents joined to it).
		firstJoin = []string{oldGossipAddr(cfg.Gossip.Config, gossipPort, gossipAdvertise)}
	}
	// A plain stop of a process whose socket systemd holds keeps accepting
	// through the drain grace: the next process gets the socket only once
	// this one has exited, and clients would wait in the kernel's queue
	// meanwhile. After an upgrade the new process accepts: stop at once.
	var upgraded atomic.Bool
	node, err := server.NewProxy(cfg, server.Options{
		Stdout: stdout, Stderr: stderr, Version: versionString(),
		File: cf.File, Load: func() (config.Config, error) { return loadConfig(cf) },
		Listen: h.Listen, HoldAccepts: h.Upgrading() || h.HasActivated(), GossipFirstJoin: firstJoin,
		AcceptWhileDraining: func() bool { return !upgraded.Load() && h.SystemdHolds("proxy") },
	})
	if err != nil {
		return explainBind(err, cf.File, proxyListeners(cfg))
	}
	if err := h.Unused(); err != nil {
		node.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// A stop closes the copies of the listening sockets kept for an
		// upgrade as the listeners close theirs: else the kernel would go
		// on completing connections that nobody accepts, and reset them at
		// exit.
		<-ctx.Done()
		h.close()
	}()
	go func() {
		// Once the proxy serves: an upgrade's old process stops, the PID
		// file and systemd learn this process.
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for !node.HandedOver() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		if err := h.Ready(); err != nil {
			node.Logger().Warn("ready, but not told", zap.Error(err))
		}
		if movePort {
			moveGossip(ctx, h, node, gossipPort, gossipAdvertise)
		}
	}()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-usr2:
				log := node.Logger().Named("upgrade")
				log.Info("upgrade: starting the new process", zap.Strings("argv", os.Args))
				if err := h.Upgrade(); err != nil {
					log.Error("upgrade failed; this process goes on serving", zap.Error(err))
					continue
				}
				log.Info("upgrade: the new process serves; this one stops accepting and drains")
				upgraded.Store(true)
				cancel()
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_, _ = node.Reload("SIGHUP") // logged, counted and audited inside
			}
		}
	}()
	// Apart from reloads: a reopen waits for a write in progress, which a
	// stalled disk can make long.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-usr1:
				_ = node.ReopenLogs() // log rotation; logged and counted inside
			}
		}
	}()
	return explainBind(node.Run(ctx), cf.File, proxyListeners(cfg))
}
