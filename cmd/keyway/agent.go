package main

import (
	"context"
	"flag"
	"fmt"
	"io"

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

// runAgent is `keyway agent`.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var file string
	var check bool
	fs.StringVar(&file, "c", "", "agent configuration `FILE` (YAML); optional")
	fs.StringVar(&file, "config", "", "same as -c `FILE`")
	fs.BoolVar(&check, "check", false, "load and validate the configuration, print a one-line summary and exit")
	keys := config.NewAgentFlags(fs)
	if err := parseArgs(fs, args, stderr, func() {
		fmt.Fprint(stderr, agentUsage)
		keys.PrintDefaults(stderr)
		fmt.Fprint(stderr, agentPrecedence)
	}); err != nil {
		return err
	}
	cfg, err := config.LoadAgent(file, keys.Options()...)
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
