package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"
)

// The floor target ("gofloor"): the least a Go proxy built on fasthttp
// does for the same request. It is the bench binary itself, run as
// `bench floor-proxy`: one fasthttp server whose handler hashes X-Key to
// one of the replicas (xxhash modulo the count, no ring) and forwards the
// request as it came with a pooled HostClient under a 15 s deadline, and
// relays the answer. It has what any production proxy needs (read, write
// and idle timeouts on the client side, a deadline per request to the
// replica) and nothing else: no header rewriting, request ID, routing
// table, metrics, stale-connection check, head scan or parking. It runs
// with GOMAXPROCS=1 and Go's monitor thread kept out of deep sleep, as
// keyway does.
//
// keyway ÷ gofloor is what keyway's own work costs over the runtime and
// fasthttp; gofloor ÷ HAProxy is where a Go fasthttp proxy starts from.

// floorProxyMain runs the floor proxy until it is killed.
func floorProxyMain(args []string) error {
	fs := flag.NewFlagSet("floor-proxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	replicas := fs.String("replicas", "", "comma-separated host:port of the replicas")
	maxConns := fs.Int("max-conns", 12048, "client connections")
	stream := fs.Bool("stream-bodies", false, "stream request bodies (fasthttp's StreamRequestBody) to the replica, of any size, with 10-minute timeouts (the body mode)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *replicas == "" {
		return errors.New("-replicas is required")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	return newFloorProxy(strings.Split(*replicas, ","), *maxConns, *stream).Serve(ln)
}

// newFloorProxy is the floor proxy's server over the replicas. With
// stream (the body mode), fasthttp reads at most 8 KiB of a request body
// before the handler (StreamRequestBody) and HostClient writes the rest
// from the client's connection; every timeout is then bodyTimeout.
func newFloorProxy(addrs []string, maxConns int, stream bool) *fasthttp.Server {
	deadline, rw := 15*time.Second, 30*time.Second
	if stream {
		deadline, rw = bodyTimeout, bodyTimeout
	}
	hcs := make([]*fasthttp.HostClient, len(addrs))
	for i, a := range addrs {
		hcs[i] = &fasthttp.HostClient{
			Addr:                          a,
			MaxConns:                      1024,
			MaxIdleConnDuration:           10 * time.Minute,
			ReadBufferSize:                16 << 10,
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
		}
	}
	n := uint64(len(hcs))
	handler := func(ctx *fasthttp.RequestCtx) {
		hc := hcs[xxhash.Sum64(ctx.Request.Header.Peek("X-Key"))%n]
		if err := hc.DoDeadline(&ctx.Request, &ctx.Response, ctx.Time().Add(deadline)); err != nil {
			ctx.Response.Reset()
			ctx.SetStatusCode(fasthttp.StatusBadGateway)
		}
	}
	return &fasthttp.Server{
		Handler:                      handler,
		Concurrency:                  maxConns,
		ReadBufferSize:               16 << 10,
		WriteBufferSize:              4 << 10,
		ReadTimeout:                  rw,
		WriteTimeout:                 rw,
		StreamRequestBody:            stream,
		IdleTimeout:                  10 * time.Minute,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		NoDefaultDate:                true,
		DisablePreParseMultipartForm: true,
	}
}

// floorConfig is the floor target's command line (plain HTTP only).
func floorConfig(_ string, port int, e *targetEnv) ([]string, error) {
	if e.tls != nil || e.sat != nil {
		return nil, errors.New("gofloor has neither TLS nor overload settings")
	}
	args := []string{"floor-proxy", "-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"-replicas", strings.Join(e.replicas, ","), "-max-conns", fmt.Sprint(e.maxConns)}
	if e.bodies != nil {
		args = append(args, "-stream-bodies")
	}
	return args, nil
}
