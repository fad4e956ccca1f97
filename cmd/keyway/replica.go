package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"keyway/demo"
)

// runReplica runs one demo replica as its own process: a stand-in for a
// pipeline job, for trying keyway with agents, for the integration tests
// and the benchmarks.
func runReplica(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replica", flag.ContinueOnError)
	name := fs.String("name", "replica-0", "replica `NAME` it reports in its answers")
	listen := fs.String("listen", "127.0.0.1:9001", "`ADDR` to listen on (port 0 picks a free one)")
	keyHeader := fs.String("key-header", "X-Key", "`HEADER` whose value it reports as the key of a request without a route context")
	routeHeader := fs.String("route-header", demo.RouteHeader, "the route context `HEADER` (replica_sets[].route_context.header) it reads the key keyway routed by from; \"\" ignores it")
	if err := parseArgs(fs, args, stderr, func() {
		fmt.Fprint(fs.Output(), "Usage: keyway replica [flags]\n\nRuns a demo replica: it answers every request with JSON naming itself, the key\nand how often it saw that key; GET /_stats lists every key it saw. The key is\nthe one keyway routed by, from the route context header (--route-header);\nwithout one, a guess: the --key-header value, ?key= or the 2nd path segment.\nFault switches: POST /_mode?v=500|hang|ok (answer 500, never answer, normal), POST /_ready?v=false|true (fail or pass /readyz).\nDrain probe: GET /_drained answers 200, or 503 while POST /_pending?v=N (N > 0) says it holds work.\nSlow requests: ?delay=D (e.g. 2s, at most 30s) holds a request that long.\n\n")
		fs.PrintDefaults()
	}); err != nil {
		return err
	}
	r, err := demo.Listen(*name, *listen, *keyHeader)
	if err != nil {
		return err
	}
	r.SetRouteHeader(*routeHeader)
	fmt.Fprintf(stdout, "replica %s listening on %s\n", r.Name(), r.Addr())
	return r.Run(ctx)
}
