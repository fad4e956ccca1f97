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

const agentUsage = `Usage: keyway agent [-c FILE] [flags] [-- CMD [ARGS...]]

Runs the sidecar beside one replica: joins the gossip cluster, probes the
replica's readiness and advertises its lifecycle state (starting, ready,
recovering) to every proxy. On SIGINT or SIGTERM it drains: it advertises
draining, waits until every proxy reports no request in flight to the
replica (or drain.timeout), advertises stopped, leaves and exits.

With -- CMD ARGS..., the agent also runs the replica: it starts CMD in a
process group of its own (output passed through), restarts it when it
exits (backoff supervise.backoff_min to supervise.backoff_max), gives up
after supervise.max_restarts restarts within supervise.window (state
failed), and on SIGINT or SIGTERM stops it only once drained: SIGTERM,
then SIGKILL after supervise.stop_grace.

Every configuration key is a flag (written with - or --); the file is
optional. Example without a file, for a proxy whose gossip is on this
machine's loopback (gossip off loopback needs a key: gossip.key_file or
KEYWAY_GOSSIP_KEY, and the fleet's credentials, docs/membership.md):

  keyway agent --replica.set orders --replica.addr 127.0.0.1:9001 \
    --gossip.bind_addr 127.0.0.1 --gossip.join 127.0.0.1:7946

and supervising the replica:

  keyway agent --replica.set orders --replica.name orders-1 --replica.addr 127.0.0.1:9001 \
    --gossip.bind_addr 127.0.0.1 --gossip.join 127.0.0.1:7946 \
    -- keyway replica --name orders-1 --listen 127.0.0.1:9001

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
	args, command, supervise := splitCommand(args)
	switch {
	case supervise && len(command) == 0:
		return usageError{"nothing after --: write the replica's command after it, e.g. keyway agent … -- keyway replica --name orders-0 --listen 127.0.0.1:9001, or drop the -- to supervise no process"}
	case supervise && command[0] == "":
		return usageError{"the command after -- is an empty string: write the replica's program there, e.g. -- keyway replica --name orders-0"}
	}
	if err := parseArgs(fs, args, stderr, func() {
		fmt.Fprint(fs.Output(), agentUsage)
		keys.PrintDefaults(fs.Output())
		fmt.Fprint(fs.Output(), agentPrecedence)
	}); err != nil {
		return err
	}
	cfg, err := config.LoadAgent(file, keys.Options()...)
	if err != nil {
		return agentFileHint(err, file)
	}
	cfg.Command = command
	if check {
		fmt.Fprintln(stdout, config.AgentSummary(cfg))
		return nil
	}
	return explainBind(serveAgent(ctx, cfg, stdout, stderr), file, agentListeners(cfg))
}

// serveAgent runs one agent until ctx is done and it has drained.
func serveAgent(ctx context.Context, cfg agent.Config, stdout, stderr io.Writer) error {
	node, err := server.NewAgent(cfg, server.Options{Stdout: stdout, Stderr: stderr, Version: versionString()})
	if err != nil {
		return err
	}
	return node.Run(ctx)
}

// splitCommand splits the agent's arguments at the first "--": the flags
// before it, and the replica's command after it (supervise reports that
// there was a "--").
func splitCommand(args []string) (flags, command []string, supervise bool) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:], true
		}
	}
	return args, nil, false
}
