package health

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"keyway/balancer"
)

// Probe results, as in keyway_health_probes_total{result}.
const (
	resultPass      = iota // answered with an expected status
	resultBadStatus        // answered with another status
	resultTimeout          // no complete answer within active.timeout
	resultError            // connection refused, reset, malformed answer, ...
	numResults
)

var resultNames = [numResults]string{"pass", "bad_status", "timeout", "error"}

// probeResult is the outcome of one probe, sent from the probe's goroutine
// to Run's loop.
type probeResult struct {
	r      *replica
	result int
	desc   string // "status 200", "timeout", the transport error
	at     time.Time
}

func newProbeClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			// A fresh connection per probe, like a kubelet probe. No Proxy:
			// HTTP_PROXY must not reroute probes of replicas.
			DisableKeepAlives:      true,
			Proxy:                  nil,
			MaxResponseHeaderBytes: 64 << 10,
		},
		// A redirect is an answer: expect_status decides whether 3xx passes.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// jitter returns a random delay in [0, d): the first probe of a target, so
// that targets added together are not probed in step.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// launchDue starts the probes that are due, oldest first, at most free of
// them, and returns when the next one not yet started is due (zero if
// none is waiting on time: every target in flight, or probes due but no
// free slot, which a result will free).
func (c *Checker) launchDue(ctx context.Context, wg *sync.WaitGroup, out chan<- probeResult, free int) (wake time.Time, launched int) {
	c.mu.Lock()
	now := c.now()
	var due []*replica
	for _, s := range c.sets {
		for _, r := range s.replicas {
			switch {
			case r.inFlight:
			case !r.next.After(now):
				due = append(due, r)
			case wake.IsZero() || r.next.Before(wake):
				wake = r.next
			}
		}
	}
	slices.SortFunc(due, func(a, b *replica) int { return a.next.Compare(b.next) })
	if len(due) > free {
		due = due[:free] // the rest wait for a free slot
	}
	type job struct {
		r    *replica
		addr string
	}
	jobs := make([]job, len(due))
	for i, r := range due {
		r.inFlight = true
		r.next = now.Add(c.cfg.Active.Interval)
		jobs[i] = job{r, r.addr}
	}
	c.mu.Unlock()

	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out <- c.probe(ctx, j.r, j.addr)
		}()
	}
	return wake, len(jobs)
}

// probe runs one probe of addr, bounded by active.timeout and ctx: the
// deadline covers connecting, the answer and up to 64 KiB of body.
func (c *Checker) probe(ctx context.Context, r *replica, addr string) probeResult {
	res := probeResult{r: r}
	pctx, cancel := context.WithTimeout(ctx, c.cfg.Active.Timeout)
	defer cancel()
	scheme, client := "http://", c.client
	if c.probeTLS != nil {
		if cfg := c.probeTLS(r.set, r.name, addr); cfg != nil {
			scheme, client = "https://", newProbeClient()
			client.Transport.(*http.Transport).TLSClientConfig = cfg
		}
	}
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, scheme+addr+c.cfg.Active.Path, nil)
	if err != nil {
		res.result, res.desc, res.at = resultError, err.Error(), c.now()
		return res
	}
	req.Header.Set("User-Agent", "keyway-health")
	resp, err := client.Do(req)
	if err == nil {
		// Read (a bounded part of) the body so that a replica that sends
		// the headers but stalls the body still times out.
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
	switch {
	case err != nil && errors.Is(pctx.Err(), context.DeadlineExceeded):
		res.result, res.desc = resultTimeout, "timeout"
	case err != nil:
		res.result, res.desc = resultError, err.Error()
	case c.expect.Match(resp.StatusCode):
		res.result, res.desc = resultPass, "status "+strconv.Itoa(resp.StatusCode)
	default:
		res.result, res.desc = resultBadStatus, "status "+strconv.Itoa(resp.StatusCode)
	}
	res.at = c.now()
	return res
}

// handleResult feeds a probe result to its target's verdict and reports a
// change to the Sink.
func (c *Checker) handleResult(res probeResult) {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	var st step
	c.mu.Lock()
	c.forgetGoneLocked(&st)
	r := res.r
	r.inFlight = false
	if !r.gone {
		r.lastProbe, r.lastDesc = res.at, res.desc
		r.m.probes[res.result].Inc()
		if res.result != resultPass {
			if ce := c.log.Check(zapcore.DebugLevel, "probe failed"); ce != nil {
				ce.Write(zap.String("set", r.set), zap.String("replica", r.name), zap.String("addr", r.addr), zap.String("result", res.desc))
			}
		}
		if r.v.observe(res.result == resultPass) {
			up := r.v.up
			r.m.setUp(up)
			st.exclude(r, balancer.ReasonProbe, !up)
			kind := EventProbeUp
			if !up {
				kind = EventProbeDown
			}
			st.event(Event{Time: res.at, Kind: kind, Set: r.set, Replica: r.name, Reason: res.desc})
		}
	}
	c.mu.Unlock()
	c.apply(&st)
}
