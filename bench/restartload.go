package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The restart mode's load (restartLoad): keyed POSTs sent open loop at a
// fixed rate through one net/http Transport of at most conns keep-alive
// connections, as a producer's client pool sends them, with every
// request's outcome recorded. Nothing is retried: the request's body has
// no GetBody, so net/http cannot replay it either (it replays a request
// on a reused connection the server closed only when it can rewind the
// body), and a request lost on a closed connection counts as lost.

// Failure classes of a request that got no HTTP answer.
const (
	classRefused = "refused" // the connection was refused: nothing listened
	classReset   = "reset"   // reset by the peer, or a write to a connection it had reset (EPIPE)
	classEOF     = "eof"     // the connection closed before a whole answer came
	classTimeout = "timeout" // no answer within the client's timeout
	classOther   = "other"
)

// restartClasses is the order classes are reported in.
var restartClasses = []string{classRefused, classReset, classEOF, classTimeout, classOther}

// errorClass names the failure class of a request's error; "" for nil.
// Errors are matched by type first, then, since net/http flattens some
// into text ("http: server closed idle connection"), by text.
func errorClass(err error) string {
	if err == nil {
		return ""
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return classTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return classRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return classReset
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return classEOF
	}
	s := err.Error()
	switch {
	case strings.Contains(s, "connection refused"):
		return classRefused
	case strings.Contains(s, "connection reset"), strings.Contains(s, "broken pipe"):
		return classReset
	case strings.Contains(s, "server closed idle connection"), strings.HasSuffix(s, "EOF"):
		return classEOF
	case strings.Contains(s, "timeout"), strings.Contains(s, "deadline exceeded"):
		return classTimeout
	}
	return classOther
}

// reqOutcome is one request of the load. Times are from the load's start.
type reqOutcome struct {
	Due     time.Duration // when it was to be sent (the schedule)
	Lag     time.Duration // how late it was actually sent
	Latency time.Duration // from Due to the whole answer, or to the error
	Status  int           // 0 when no answer came
	Class   string        // the failure class when no answer came
	Err     string        // the error, when no answer came
	Reused  bool          // sent on a connection that had carried a request before
	Wrote   bool          // the request was written whole
}

// failed reports whether the request got no 2xx answer.
func (o *reqOutcome) failed() bool { return o.Status < 200 || o.Status > 299 }

// restartLoad is one open-loop load run. Start it with startRestartLoad;
// stopSending ends the schedule, wait returns every outcome. Its methods
// are safe for concurrent use.
type restartLoad struct {
	url      string
	tr       *http.Transport
	interval time.Duration
	timeout  time.Duration
	keys     []string // X-Key of the i-th request: keys[i%len(keys)]
	body     []byte
	start    time.Time

	stop     chan struct{}
	stopOnce sync.Once
	sched    sync.WaitGroup // the scheduler
	inflight sync.WaitGroup // the requests

	mu   sync.Mutex
	outs []reqOutcome
}

// warmPool opens n connections of the pool at once, each carrying one
// request, and leaves them idle in it. The requests are held until every
// one has its connection (their bodies wait for a gate), so that no
// connection is reused within the warm-up. The load then keeps reusing
// the few connections it needs (net/http takes the most recently used
// idle one), and the others stay idle.
func (l *restartLoad) warmPool(n int) error {
	var got sync.WaitGroup
	got.Add(n)
	gate := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		go func() {
			var once sync.Once
			done := func() { once.Do(got.Done) }
			defer done() // a request that failed before it had a connection
			trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { done() }}
			ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), l.timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, nil)
			if err != nil {
				errs <- err
				return
			}
			req.Body = io.NopCloser(io.MultiReader(gated(gate), bytes.NewReader(l.body)))
			req.ContentLength = int64(len(l.body))
			req.Header["X-Key"] = []string{l.keys[i%len(l.keys)]}
			resp, err := l.tr.RoundTrip(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != http.StatusOK {
					err = errors.New("warm-up: status " + resp.Status)
				}
			}
			errs <- err
		}()
	}
	got.Wait()
	close(gate)
	var all []error
	for range n {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// gated is a reader that returns nothing until gate closes, then EOF.
type gated chan struct{}

func (g gated) Read([]byte) (int, error) {
	<-g
	return 0, io.EOF
}

// newRestartLoad returns a load that has not started sending.
func newRestartLoad(addr string, rate, conns int, timeout time.Duration, keyCount, bodySize int, seed uint64) *restartLoad {
	rng := rand.New(rand.NewPCG(seed, 0x72657374617274))
	keys := make([]string, 1<<14)
	for i := range keys {
		keys[i] = keyName(rng.IntN(keyCount))
	}
	return &restartLoad{
		url: "http://" + addr + "/ingest",
		tr: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
			MaxConnsPerHost:     conns,
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns, // the default (2) would close the others after each burst
			IdleConnTimeout:     10 * time.Minute,
			DisableCompression:  true,
		},
		interval: time.Second / time.Duration(rate),
		timeout:  timeout,
		keys:     keys,
		body:     bytes.Repeat([]byte("x"), bodySize),
		stop:     make(chan struct{}),
	}
}

// startSending starts the schedule: its first request goes now.
func (l *restartLoad) startSending() {
	l.start = time.Now()
	l.sched.Go(l.schedule)
}

// startRestartLoad starts sending rate requests a second to addr, on at
// most conns connections, each request given up after timeout. Keys are
// drawn uniformly (seeded) from keyCount keys; bodies are bodySize bytes.
func startRestartLoad(addr string, rate, conns int, timeout time.Duration, keyCount, bodySize int, seed uint64) *restartLoad {
	l := newRestartLoad(addr, rate, conns, timeout, keyCount, bodySize, seed)
	l.startSending()
	return l
}

// schedule launches the i-th request at start + i × interval, late ones
// at once (open loop: the schedule does not wait for answers).
func (l *restartLoad) schedule() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := 0; ; i++ {
		due := time.Duration(i) * l.interval
		if d := time.Until(l.start.Add(due)); d > 0 {
			timer.Reset(d)
			select {
			case <-l.stop:
				return
			case <-timer.C:
			}
		} else {
			select {
			case <-l.stop:
				return
			default:
			}
		}
		key := l.keys[i%len(l.keys)]
		l.inflight.Go(func() { l.one(due, key) })
	}
}

func (l *restartLoad) one(due time.Duration, key string) {
	sent := time.Now()
	o := reqOutcome{Due: due, Lag: sent.Sub(l.start) - due}
	var reused, wrote atomic.Bool // set from net/http's goroutines
	trace := &httptrace.ClientTrace{
		GotConn:      func(ci httptrace.GotConnInfo) { reused.Store(ci.Reused) },
		WroteRequest: func(wi httptrace.WroteRequestInfo) { wrote.Store(wi.Err == nil) },
	}
	ctx, cancel := context.WithDeadline(httptrace.WithClientTrace(context.Background(), trace), l.start.Add(due+l.timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, nil)
	if err == nil {
		// No GetBody: the request cannot be replayed, so net/http never
		// retries it.
		req.Body = io.NopCloser(bytes.NewReader(l.body))
		req.ContentLength = int64(len(l.body))
		req.Header["X-Key"] = []string{key}
		var resp *http.Response
		if resp, err = l.tr.RoundTrip(req); err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil {
				o.Status = resp.StatusCode
			}
		}
	}
	o.Latency = time.Since(l.start) - due
	if err != nil {
		o.Class, o.Err = errorClass(err), err.Error()
	}
	o.Reused, o.Wrote = reused.Load(), wrote.Load()
	l.mu.Lock()
	l.outs = append(l.outs, o)
	l.mu.Unlock()
}

// since returns the time from the load's start to t.
func (l *restartLoad) since(t time.Time) time.Duration { return t.Sub(l.start) }

// stopSending ends the schedule: no request is sent after it returns.
func (l *restartLoad) stopSending() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.sched.Wait()
}

// wait stops sending, waits for every request (each ends within the
// timeout), closes the pool's connections and returns the outcomes in
// schedule order.
func (l *restartLoad) wait() []reqOutcome {
	l.stopSending()
	l.inflight.Wait()
	l.tr.CloseIdleConnections()
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.SortFunc(l.outs, func(a, b reqOutcome) int { return int(a.Due - b.Due) })
	return l.outs
}
