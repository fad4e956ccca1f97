package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"keyway/agent"
	"keyway/config"
	"keyway/server"
)

const agentUsage = `Usage: keyway agent [-c FILE] [flags]

Runs the sidecar beside one replica: joins the gossip cluster, probes the
replica's readiness and advertises its lifecycle state (starting, ready,
recovering) to every proxy. On SIGINT or SIGTERM it drains: it advertises
draining, waits until every proxy reports no request in flight to the
replica (or drain.timeout), advertises stopped, leaves and exits.

Every configuration key is a flag (written with - or --); the file is
optional. Example without a file:

  keyway agent --replica.set orders --replica.addr 127.0.0.1:9001 --gossip.join 127.0.0.1:7946

Flags:
`

const agentPrecedence = `
Precedence: built-in defaults < the file (-c) < KEYWAY_AGENT_* environment
variables (KEYWAY_AGENT_ + the key's path in upper case, dots as
underscores: replica.addr -> KEYWAY_AGENT_REPLICA_ADDR) < flags. Lists
(gossip.join) take comma-separated values; a list flag may be repeated.
KEYWAY_GOSSIP_KEY holds the gossip encryption key(s), as for the proxy.
See docs/agent.md for every key.
`

// keyFlag is the flag of one agent configuration key. It keeps the raw
// text; the config loader parses it like a value from the environment.
type keyFlag struct {
	path        string
	isBool      bool
	isList      bool
	placeholder string // names the value in --help; "" for booleans
	values      []string
}

func (f *keyFlag) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.values, ",")
}

func (f *keyFlag) Set(s string) error {
	if f.isList {
		f.values = append(f.values, s)
	} else {
		f.values = []string{s}
	}
	return nil
}

// IsBoolFlag lets "--drain.remove" stand for "--drain.remove=true".
func (f *keyFlag) IsBoolFlag() bool { return f.isBool }

// placeholders name a flag's value in --help, by key type.
var placeholders = map[string]string{"string": "STRING", "int": "N", "duration": "DURATION", "list": "LIST"}

// agentKeyFlags defines one flag per agent configuration key, named by its
// path ("--replica.addr", "--gossip.join").
func agentKeyFlags(fs *flag.FlagSet) []*keyFlag {
	var out []*keyFlag
	for _, f := range config.DescribeAgent() {
		kf := &keyFlag{path: f.Path, isBool: f.Type == "bool", isList: f.Type == "list", placeholder: placeholders[f.Type]}
		fs.Var(kf, f.Path, fmt.Sprintf("%s (default %s; $%s)", f.Doc, f.Default, f.Env))
		out = append(out, kf)
	}
	return out
}

// printAgentFlags lists the flags as "--name VALUE" and their usage.
func printAgentFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if kf, ok := f.Value.(*keyFlag); ok {
			name = kf.placeholder
		}
		if name != "" {
			name = " " + name
		}
		dashes := "--"
		if len(f.Name) == 1 {
			dashes = "-"
		}
		fmt.Fprintf(w, "  %s%s%s\n    \t%s\n", dashes, f.Name, name, usage)
	})
}

// runAgent is `keyway agent`.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var file string
	var check bool
	fs.StringVar(&file, "c", "", "agent configuration `FILE` (YAML); optional")
	fs.StringVar(&file, "config", "", "same as -c `FILE`")
	fs.BoolVar(&check, "check", false, "load and validate the configuration, print a one-line summary and exit")
	keys := agentKeyFlags(fs)
	if err := parseArgs(fs, args, stderr, func() {
		fmt.Fprint(stderr, agentUsage)
		printAgentFlags(stderr, fs)
		fmt.Fprint(stderr, agentPrecedence)
	}); err != nil {
		return err
	}
	var opts []config.Option
	for _, k := range keys {
		if len(k.values) > 0 {
			opts = append(opts, config.WithFlag("--"+k.path, k.path, k.String()))
		}
	}
	cfg, err := config.LoadAgent(file, opts...)
	if err != nil {
		return err
	}
	if check {
		fmt.Fprintln(stdout, config.AgentSummary(cfg))
		return nil
	}
	return serveAgent(ctx, cfg, stdout, stderr)
}

// serveAgent runs one agent until ctx is done and it has drained.
func serveAgent(ctx context.Context, cfg agent.Config, stdout, stderr io.Writer) error {
	node, err := server.NewAgent(cfg, server.Options{Stdout: stdout, Stderr: stderr, Version: versionString()})
	if err != nil {
		return err
	}
	return node.Run(ctx)
}
