package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sync/errgroup"

	"keyway/config"
	"keyway/demo"
)

//go:embed demo.yaml
var demoYAML []byte

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	cf := newConfigFlags(fs)
	if err := parseFlags(fs, args, stderr, "Usage: keyway demo [flags]\n\nRuns a proxy in front of three built-in demo replicas (orders-0..2), all on\nloopback, from an embedded configuration (cmd/keyway/demo.yaml). Each demo\nreplica answers with its name, the key and how often it saw that key.\n\n"); err != nil {
		return err
	}
	var cfg config.Config
	var err error
	if cf.file != "" {
		cfg, err = config.Load(cf.file, cf.options(fs)...)
	} else {
		cfg, err = config.LoadBytes("demo.yaml (embedded)", demoYAML, cf.options(fs)...)
	}
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	for si := range cfg.ReplicaSets {
		set := &cfg.ReplicaSets[si]
		keyHdr := ""
		for _, k := range set.Key {
			if k.Header != "" {
				keyHdr = k.Header
				break
			}
		}
		for i := range set.Static {
			r, err := demo.Listen(set.Static[i].Name, "127.0.0.1:0", keyHdr)
			if err != nil {
				return err
			}
			set.Static[i].Addr = r.Addr()
			g.Go(func() error { return r.Run(gctx) })
		}
	}
	g.Go(func() error {
		return serve(gctx, cfg, stdout, stderr, func(proxyAddr, adminAddr string) {
			printDemoHelp(stdout, cfg, proxyAddr, adminAddr)
		}, nil)
	})
	return g.Wait()
}

func printDemoHelp(w io.Writer, cfg config.Config, proxyAddr, adminAddr string) {
	set := cfg.ReplicaSets[0]
	var reps []string
	for _, r := range set.Static {
		reps = append(reps, r.Name+"="+r.Addr)
	}
	fmt.Fprintf(w, "keyway demo: proxy on http://%s, replica set %q with %d replicas (%s)\n", proxyAddr, set.Name, len(set.Static), strings.Join(reps, ", "))
	if adminAddr != "" {
		fmt.Fprintf(w, "admin on http://%s (/metrics, /healthz, /readyz)\n", adminAddr)
	}
	fmt.Fprintf(w, `
Try:
  curl -s -H 'X-Key: order-42' -d 'hello' http://%[1]s/ingest      # same key, same replica, every time
  curl -s -H 'X-Key: order-7'  -d 'hello' http://%[1]s/ingest      # another key, maybe another replica
  curl -s -d 'hello' http://%[1]s/ingest/customer-9                # key from the path segment
  curl -s 'http://%[1]s/ingest?key=doc-3'                         # key from the query
  curl -s -d 'hello' http://%[1]s/ingest                           # no key: round robin
  curl -s -i http://%[1]s/ingest/a%%2Fb                              # non-canonical key: 400
`, proxyAddr)
	if adminAddr != "" {
		fmt.Fprintf(w, "  curl -s http://%s/metrics | grep '^keyway_requests_total'\n", adminAddr)
	}
	fmt.Fprintln(w, "\nPress Ctrl-C to stop.")
}
