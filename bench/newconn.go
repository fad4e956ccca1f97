package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// runNewConns is the closed-loop run of the new-connection measurements:
// conns workers, each opening a connection (with spec.tls, a TLS 1.3 full
// handshake: the client keeps no session cache, so nothing can be
// resumed whatever the server offers), sending one keyed POST with
// Connection: close, reading the answer to the end and closing, for d.
//
// It is the harness's own client rather than wrk because wrk keeps each
// connection's OpenSSL session across reconnects and resumes it whenever
// the server sends session tickets (Go servers do by default), and
// because OpenSSL 3.0's client handshake costs more CPU than Go's on the
// load side's one core.
func runNewConns(ctx context.Context, addr string, cfg *Config, spec loadSpec, d time.Duration, seed uint64) (throughputRun, error) {
	reqs := newConnRequests(addr, cfg.Keys, cfg.Body)
	var conf *tls.Config
	if spec.tls != nil {
		conf = spec.tls.clientConfig()
	}
	var done, failed atomic.Int64
	var mu sync.Mutex
	errs := map[string]int{} // by message, without the addresses
	start := time.Now()
	end := start.Add(d)
	cctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var wg sync.WaitGroup
	for w := range max(1, cfg.Connections) {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			buf := make([]byte, 4096)
			for time.Now().Before(end) {
				err := newConnRequest(cctx, addr, conf, reqs[rng.IntN(len(reqs))], buf)
				// A connection cut off by the end of the run is not
				// counted. The clock, not cctx.Err, says so: the dialer's
				// own timer for the deadline can fire before the
				// context's.
				if !time.Now().Before(end) {
					return
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					errs[errClass(err)]++
					mu.Unlock()
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return throughputRun{}, err
	}
	r := throughputRun{Tool: "go-newconn", Seconds: time.Since(start).Seconds(), Requests: done.Load(), Errors: failed.Load()}
	if r.Seconds > 0 {
		r.RPS = float64(r.Requests) / r.Seconds
	}
	if r.Errors > 0 {
		r.ErrorDetail = errSummary(errs)
	}
	if r.Requests == 0 {
		return r, fmt.Errorf("no successful request: %s", r.ErrorDetail)
	}
	return r, nil
}

// newConnRequests prebuilds one request per key.
func newConnRequests(addr string, keyCount, bodySize int) [][]byte {
	body := bytes.Repeat([]byte("x"), bodySize)
	out := make([][]byte, keyCount)
	for i := range out {
		out[i] = fmt.Appendf(nil, "POST /ingest HTTP/1.1\r\nHost: %s\r\nX-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", addr, keyName(i), bodySize, body)
	}
	return out
}

var errNot200 = errors.New("answer is not HTTP/1.1 200")

// newConnRequest is one connection: dial, handshake (with conf), one
// request, the answer read until the server closes, close.
func newConnRequest(ctx context.Context, addr string, conf *tls.Config, req, buf []byte) error {
	d := net.Dialer{Timeout: 5 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	c := nc
	if conf != nil {
		tc := tls.Client(nc, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			return err
		}
		c = tc
	}
	if _, err := c.Write(req); err != nil {
		return err
	}
	n, err := io.ReadAtLeast(c, buf, 12)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(buf[:n], []byte("HTTP/1.1 200")) {
		return fmt.Errorf("%w: %q", errNot200, buf[:min(n, 40)])
	}
	// The server closes after the answer (Connection: close).
	for {
		if _, err := c.Read(buf); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// errClass is an error's message without the addresses, so that errors
// of one kind are counted together.
func errClass(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Op + ": " + op.Err.Error()
	}
	return err.Error()
}

// errSummary lists the most frequent kinds of error with their counts.
func errSummary(errs map[string]int) string {
	kinds := make([]string, 0, len(errs))
	for k := range errs {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Or(errs[b]-errs[a], strings.Compare(a, b)) })
	var parts []string
	for _, k := range kinds[:min(3, len(kinds))] {
		parts = append(parts, fmt.Sprintf("%d× %s", errs[k], k))
	}
	if len(kinds) > 3 {
		parts = append(parts, fmt.Sprintf("%d other kinds", len(kinds)-3))
	}
	return strings.Join(parts, "; ")
}
