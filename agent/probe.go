package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"
)

// probeResult is the outcome of one readiness probe.
type probeResult struct {
	ok     bool
	status int           // HTTP status, 0 when no answer came
	err    error         // transport error or timeout; nil when an answer came
	took   time.Duration // wall time of the probe
}

// detail describes the result for logs: "status 200", "status 503",
// "timeout after 500ms", "dial tcp ...: connection refused".
func (r probeResult) detail() string {
	switch {
	case r.err != nil:
		return r.err.Error()
	default:
		return fmt.Sprintf("status %d", r.status)
	}
}

// prober probes GET url with a per-probe timeout. It holds no state
// between probes apart from the client's configuration, so probe may be
// called from any goroutine; the agent calls it from one loop only, so at
// most one probe is in flight.
type prober struct {
	url     string
	timeout time.Duration
	expect  statusRanges
	client  *http.Client
}

func newProber(addr, path string, timeout time.Duration, expect statusRanges) *prober {
	return &prober{
		url:     "http://" + addr + path,
		timeout: timeout,
		expect:  expect,
		client: &http.Client{
			Transport: &http.Transport{
				// A fresh connection per probe, like a kubelet probe: a
				// replica restarted on the same address never fails a probe
				// on a stale pooled connection. No Proxy: HTTP_PROXY must
				// not reroute a probe of a local replica.
				DisableKeepAlives: true,
				Proxy:             nil,
			},
			// A redirect is an answer: expect_status decides whether 3xx passes.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// errProbeTimeout is the probe error when the replica did not answer in time.
var errProbeTimeout = errors.New("no answer within probe.timeout")

// probe runs one probe, bounded by p.timeout and ctx: the deadline covers
// dialing, the answer and the body.
func (p *prober) probe(ctx context.Context) probeResult {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return probeResult{err: err}
	}
	req.Header.Set("User-Agent", "keyway-agent")
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = errProbeTimeout
		}
		return probeResult{err: err, took: time.Since(start)}
	}
	// Read (a bounded part of) the body so that a replica that answers the
	// headers but stalls the body still times out.
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	r := probeResult{status: resp.StatusCode, took: time.Since(start)}
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = errProbeTimeout
		}
		r.err = err
		return r
	}
	r.ok = p.expect.Match(resp.StatusCode)
	return r
}

// probeLoop calls probe after a random delay within one interval (so that
// agents started together do not probe in step), then every interval,
// sending each result to out, until ctx is done. Probes run one after
// another: a slow probe delays the next instead of overlapping it, so at
// most one is in flight.
func probeLoop(ctx context.Context, interval time.Duration, probe func(context.Context) probeResult, out chan<- probeResult) {
	first := time.NewTimer(rand.N(interval))
	defer first.Stop()
	select {
	case <-ctx.Done():
		return
	case <-first.C:
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		r := probe(ctx)
		if ctx.Err() != nil {
			return
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}
