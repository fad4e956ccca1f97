package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// replica is a lean pipeline replica for the load runs: a fasthttp server
// answering 200 "ok\n" to everything, counting requests per key. Keys are
// the harness's own ("key-00042"), so a count is an index into a slice of
// atomics: no map, no lock, no allocation per request.
type replica struct {
	name  string
	ln    net.Listener
	srv   *fasthttp.Server
	done  chan error
	reqs  atomic.Int64
	other atomic.Int64    // requests whose key is not one of the harness's
	keys  []atomic.Uint32 // requests per key index
	// With a fixed service capacity (saturation mode): at most cap(slots)
	// requests are served at once, each taking service; the others wait
	// for a slot, as requests queue in front of a saturated pipeline job.
	slots    chan struct{}
	service  time.Duration
	inflight atomic.Int64 // requests in the handler, waiting or served
	// bodyBytes counts the request body bytes read (the body mode's
	// replica, startBodyReplica).
	bodyBytes atomic.Int64
}

var okBody = []byte("ok\n")

// startReplica starts a replica. With concurrency > 0 it has a fixed
// service capacity of concurrency ÷ service requests per second.
func startReplica(name string, keyCount, concurrency int, service time.Duration) (*replica, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("replica %s: %w", name, err)
	}
	r := &replica{name: name, ln: ln, done: make(chan error, 1), keys: make([]atomic.Uint32, keyCount)}
	if concurrency > 0 {
		r.slots, r.service = make(chan struct{}, concurrency), service
	}
	r.srv = &fasthttp.Server{
		Handler:               r.handle,
		ReadTimeout:           time.Minute,
		WriteTimeout:          time.Minute,
		IdleTimeout:           30 * time.Minute, // longer than every proxy's pool idle time
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
	}
	go func() { r.done <- r.srv.Serve(ln) }()
	return r, nil
}

func (r *replica) addr() string { return r.ln.Addr().String() }

func (r *replica) handle(ctx *fasthttp.RequestCtx) {
	r.reqs.Add(1)
	if i, ok := keyIndex(ctx.Request.Header.Peek("X-Key")); ok && i < len(r.keys) {
		r.keys[i].Add(1)
	} else {
		r.other.Add(1)
	}
	if r.slots != nil {
		// The sleep models the job's work: it holds a slot for the
		// service time whether or not the client is still waiting.
		r.inflight.Add(1)
		r.slots <- struct{}{}
		time.Sleep(r.service)
		<-r.slots
		r.inflight.Add(-1)
	}
	ctx.SetBody(okBody)
}

// reset zeroes the counters between measurements.
func (r *replica) reset() {
	r.reqs.Store(0)
	r.other.Store(0)
	for i := range r.keys {
		r.keys[i].Store(0)
	}
}

func (r *replica) close() error {
	err := r.srv.Shutdown()
	if serr := <-r.done; serr != nil && !errors.Is(serr, net.ErrClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// keyName is the i-th key of the harness: "key-" and at least five digits.
func keyName(i int) string { return fmt.Sprintf("key-%05d", i) }

// keyIndex parses a keyName back into its index.
func keyIndex(k []byte) (int, bool) {
	if len(k) < 5 || string(k[:4]) != "key-" {
		return 0, false
	}
	n := 0
	for _, c := range k[4:] {
		if c < '0' || c > '9' || n > 1<<30 {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// routing is what the replicas saw during one measurement.
type routing struct {
	Requests    []int64 `json:"requests_per_replica"`
	KeysSeen    int     `json:"keys_seen"`
	SplitKeys   int     `json:"split_keys"` // keys seen by more than one replica
	Affinity    float64 `json:"split_key_share"`
	Balance     float64 `json:"balance_max_over_mean"`
	UnknownKeys int64   `json:"requests_with_unknown_key"`
}

// measureRouting summarises the replicas' counters: the share of keys seen
// by more than one replica (0 for a hashing proxy) and max/mean requests per
// replica over the replicas that were meant to get traffic.
func measureRouting(reps []*replica) routing {
	var out routing
	var sum, most int64
	for _, r := range reps {
		n := r.reqs.Load()
		out.Requests = append(out.Requests, n)
		out.UnknownKeys += r.other.Load()
		sum += n
		most = max(most, n)
	}
	if sum > 0 {
		out.Balance = float64(most) / (float64(sum) / float64(len(reps)))
	}
	if len(reps) == 0 {
		return out
	}
	for i := range reps[0].keys {
		seenBy := 0
		for _, r := range reps {
			if r.keys[i].Load() > 0 {
				seenBy++
			}
		}
		if seenBy > 0 {
			out.KeysSeen++
		}
		if seenBy > 1 {
			out.SplitKeys++
		}
	}
	if out.KeysSeen > 0 {
		out.Affinity = float64(out.SplitKeys) / float64(out.KeysSeen)
	}
	return out
}

// waitReady polls addr with a keyed GET (over TLS with tconf) until it
// answers 200 or the deadline passes.
func waitReady(ctx context.Context, addr string, timeout time.Duration, alive func() bool, tconf *tls.Config) error {
	deadline := time.Now().Add(timeout)
	var last error
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if alive != nil && !alive() {
			return errors.New("process exited")
		}
		code, err := probe(ctx, addr, tconf)
		if err == nil && code == 200 {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("status %d", code)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return fmt.Errorf("not ready after %v: %v", timeout, last)
}

func probe(ctx context.Context, addr string, tconf *tls.Config) (int, error) {
	if tconf != nil {
		if _, err := tlsRequest(ctx, addr, tconf); err != nil {
			return 0, err
		}
		return 200, nil
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/ingest")
	req.Header.Set("X-Key", keyName(0))
	req.Header.SetConnectionClose()
	if err := fasthttp.DoTimeout(req, resp, time.Second); err != nil {
		return 0, err
	}
	return resp.StatusCode(), nil
}
