package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"strings"

	"keyway/config"
	"keyway/demo"
	"keyway/server"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	cf := config.NewProxyFlags(fs)
	// The demo's file is optional: without -c it runs its embedded one.
	fs.Lookup("c").Usage = "configuration `FILE` (YAML); optional: without it the demo runs its embedded demo/demo.yaml"
	if err := parseFlags(fs, args, stderr, "Usage: keyway demo [-c FILE] [flags]\n\nRuns a proxy whose runner starts, for each replica set with a run section, as\nmany demo replica processes as it asks for (orders-0..2), each behind its own\nagent process, all on loopback and found by gossip, from an embedded\nconfiguration (demo/demo.yaml) or from -c FILE. keyway scale, restart and\nrepair act on those processes; they stop with the demo.\nEach demo replica answers with its name, the key keyway routed it by (its route\ncontext header) and how often it saw that key.\nFault switches on each replica's own address (ADDR in keyway status): POST /_mode?v=500|hang|ok, POST /_ready?v=false|true.\n\n"); err != nil {
		return err
	}
	var cfg config.Config
	var err error
	if cf.File != "" {
		cfg, err = loadConfig(cf)
	} else {
		cfg, err = config.LoadBytes(demo.ConfigName, demo.ConfigYAML, cf.Options()...)
	}
	if err != nil {
		return err
	}
	if !cfg.Gossip.Enabled {
		return usageError{"the demo runs its replicas behind agents: gossip.enabled must be true"}
	}
	d, err := server.NewDemo(cfg, server.Options{Stdout: stdout, Stderr: stderr, Version: versionString()})
	if err != nil {
		return explainBind(err, cf.File, proxyListeners(cfg))
	}
	printDemoHelp(stdout, cfg, d.Proxy.ProxyAddr(), d.Proxy.AdminAddr(), d.TokenFile)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-d.Proxy.GossipStarted():
			g := d.Proxy.GossipAddr()
			creds := ""
			if d.CredentialsFile != "" {
				// The fleet signs its gossip: a second proxy needs this
				// run's credentials.
				creds = " --set gossip.credentials_file=" + d.CredentialsFile
			}
			fmt.Fprintf(stdout, "gossip on %s: a second proxy can join it and will route every key the same way:\n  go run ./cmd/keyway proxy -c examples/second-proxy.yaml --join %s%s\n\n", g, g, creds)
		case <-ctx.Done():
		}
	}()
	return explainBind(d.Run(ctx), cf.File, proxyListeners(cfg))
}

// demoKeys are the keys the demo's banner suggests, by the way each is
// sent. On the embedded demo's ring (three replicas) they land on three
// different replicas, so that trying them shows keys spread out:
// TestDemoKeysSpread checks it with the balancer's placement, and fails
// if a change of the demo's ring moves them together. order-42 is on
// orders-0, which the README's walk-through of ejection relies on.
var demoKeys = struct{ header, other, path, query string }{"order-42", "order-6", "customer-8", "doc-4"}

func printDemoHelp(w io.Writer, cfg config.Config, proxyAddr, adminAddr, tokenFile string) {
	set := cfg.ReplicaSets[0]
	var names []string
	for i := 0; i < set.Replicas; i++ {
		names = append(names, fmt.Sprintf("%s-%d", set.Name, i))
	}
	fmt.Fprintf(w, "keyway demo: proxy on http://%s, replica set %q with %s (%s), each behind an agent\n", proxyAddr, set.Name, plural(set.Replicas, "demo replica", "demo replicas"), strings.Join(names, ", "))
	if adminAddr != "" {
		fmt.Fprintf(w, "admin on http://%s (/ui, /v1/, /metrics, /healthz, /readyz)\n", adminAddr)
		if tokenFile != "" {
			fmt.Fprintf(w, "admin token for this run (for %s): %s\n", strings.Join(tokenCommands(), ", "), tokenFile)
		}
	}
	k := demoKeys
	fmt.Fprintf(w, `
Try:
  curl -s -H 'X-Key: %[2]s' -d 'hello' http://%[1]s/ingest      # same key, same replica, every time
  curl -s -H 'X-Key: %[3]s'  -d 'hello' http://%[1]s/ingest      # another key, another replica
  curl -s -d 'hello' http://%[1]s/ingest/%[4]s                # key from the path segment: a third replica
  curl -s 'http://%[1]s/ingest?key=%[5]s'                          # key from the query
  curl -s -d 'hello' http://%[1]s/ingest                           # no key: round robin
  curl -s -i http://%[1]s/ingest/a%%2Fb                             # non-canonical key: 400
`, proxyAddr, k.header, k.other, k.path, k.query)
	if adminAddr != "" {
		fmt.Fprintf(w, "  curl -s http://%s/metrics | grep -E '^keyway_(requests_total|rotation_replicas|gossip_members)'\n", adminAddr)
		flags := ""
		if adminAddr != defaultAdminAddr {
			flags = " --admin " + adminAddr
		}
		fmt.Fprintf(w, "  go run ./cmd/keyway status%s   # sets, phases, replicas, request rates\n", flags)
		fmt.Fprintf(w, "  go run ./cmd/keyway route%s --set %s --key %s   # who owns a key, and why\n", flags, set.Name, k.header)
		fmt.Fprintf(w, "  go run ./cmd/keyway jobs%s --set %s   # the replica processes this proxy runs\n", flags, set.Name)
		if tokenFile != "" {
			fmt.Fprintf(w, "  go run ./cmd/keyway scale%s --set %s --replicas %d --token-file %s   # starts %s-%d; scale back to %d stops it\n", flags, set.Name, set.Replicas+1, tokenFile, set.Name, set.Replicas, set.Replicas)
			fmt.Fprintf(w, "  go run ./cmd/keyway drain%s --set %s --replica %s --token-file %s\n", flags, set.Name, names[len(names)-1], tokenFile)
			fmt.Fprintf(w, "  go run ./cmd/keyway undrain%s --set %s --replica %s --token-file %s\n", flags, set.Name, names[len(names)-1], tokenFile)
		}
		fmt.Fprintf(w, "  curl -s -X POST 'http://REPLICA_ADDR/_mode?v=500'   # make a replica fail (ADDR in keyway status; ?v=ok ends it, ?v=hang stalls it;\n")
		fmt.Fprintf(w, "                                                     # /_ready?v=false makes it recovering): see the README, \"See ejection and recovery\"\n")
		fmt.Fprintf(w, "and open http://%s/ui for the live dashboard.\n", adminAddr)
	}
	fmt.Fprintln(w, "\nPress Ctrl-C to stop.")
}
