package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"keyway/admin"
	"keyway/config"
	"keyway/server"
)

// Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad configuration.
const (
	exitRuntime = 1
	exitConfig  = 2
)

// usageError is a command-line mistake (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// errHelpShown ends a command after --help printed its usage (exit 0 from
// main's point of view is wrong for scripts that asked for a real run, so
// it exits 2 like flag's default, but prints nothing more).
var errHelpShown = errors.New("help shown")

func exitCode(err error) int {
	var ce *config.Error
	var ue usageError
	switch {
	case errors.Is(err, errHelpShown), errors.As(err, &ce), errors.As(err, &ue):
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
  keyway scale --set S --replicas N   change a set's declared replica count, fleet-wide
  keyway create -f SET.json     create a replica set at run time, fleet-wide
  keyway stop --set S           stop a set: drained on every proxy, 503 for its requests, processes stopped
  keyway start --set S          start a stopped set again
  keyway delete --set S         delete a set none of whose replicas runs (stop it first)
  keyway runtime [export|clear --set S]  the fleet's run-time state; write it back to the file
  keyway repair --set S         restart a set's replicas that gave up, lift every proxy's holds
  keyway restart --set S        rolling restart: one replica at a time, drained first, no request lost
  keyway version                print the version

Run 'keyway COMMAND --help' for a command's flags.
`

// run is the whole program behind main, testable: it parses args, loads
// the configuration and runs the components until ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
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
	case "restart":
		return runRestart(rest, stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, versionString())
		return nil
	case "help", "--help", "-h":
		fmt.Fprint(stdout, topUsage)
		return nil
	default:
		fmt.Fprint(stderr, topUsage)
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
}

func versionString() string {
	v, rev := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
		return fmt.Sprintf("keyway %s%s %s", v, rev, bi.GoVersion)
	}
	return "keyway " + v
}

const precedenceNote = `
Precedence: built-in defaults < the file < KEYWAY_* environment variables
(e.g. KEYWAY_LISTEN, KEYWAY_ADMIN_LISTEN, KEYWAY_LOG_LEVEL) < flags.
See docs/configuration.md for every key.
`

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, usage string) error {
	return parseArgs(fs, args, stderr, func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
		fmt.Fprint(stderr, precedenceNote)
	})
}

// parseArgs parses a command's flags, printing usage for --help; no
// positional arguments are allowed.
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer, usage func()) error {
	fs.SetOutput(stderr)
	fs.Usage = usage
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelpShown
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
	}
	return nil
}

func loadConfig(cf *config.ProxyFlags, extra ...config.Option) (config.Config, error) {
	if cf.File == "" {
		return config.Config{}, usageError{"no configuration file: pass -c FILE (try examples/minimal.yaml)"}
	}
	return config.Load(cf.File, append(cf.Options(), extra...)...)
}

func runValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	cf := config.NewProxyFlags(fs)
	if err := parseFlags(fs, args, stderr, "Usage: keyway validate -c FILE [flags]\n\nChecks a configuration file, prints a one-line summary and exits 0, or\nprints every problem and exits 2.\n\n"); err != nil {
		return err
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
	fmt.Fprintln(stdout, config.Summary(cfg))
	return nil
}

func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	cf := config.NewProxyFlags(fs)
	if err := parseFlags(fs, args, stderr, "Usage: keyway proxy -c FILE [flags]\n\nRuns the proxy until SIGINT or SIGTERM, then drains in-flight requests.\nSIGHUP re-reads FILE (with the same flags and environment) and applies\nthe replica sets, log.level, admin.token_file and the TLS keys and files\nwithout dropping a connection; a file changing any other key is refused whole and logged.\n\n"); err != nil {
		return err
	}
	// First, so that a SIGHUP during startup waits for the node instead of
	// killing the process (its default action).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	cfg, err := loadConfig(cf)
	if err != nil {
		return err
	}
	node, err := server.NewProxy(cfg, server.Options{
		Stdout: stdout, Stderr: stderr, Version: versionString(),
		File: cf.File, Load: func() (config.Config, error) { return loadConfig(cf) },
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	return node.Run(ctx)
}
