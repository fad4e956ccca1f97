package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serve runs h on 127.0.0.1:0 until the test ends and returns its address.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

func TestProbe(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.Write([]byte("fine"))
		case "/unavailable":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/redirect":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		case "/no-content":
			w.WriteHeader(http.StatusNoContent)
		case "/hang":
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case "/slow-body":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			http.NotFound(w, r)
		}
	}))
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()

	ranges := func(s string) statusRanges {
		r, err := parseStatusRanges(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := map[string]struct {
		addr, path, expect string
		ok                 bool
		status             int
		err                string
	}{
		"200 passes":                       {addr, "/ok", "200-399", true, 200, ""},
		"503 fails":                        {addr, "/unavailable", "200-399", false, 503, ""},
		"redirect is not followed":         {addr, "/redirect", "200-399", true, 302, ""},
		"redirect fails when not expected": {addr, "/redirect", "200", false, 302, ""},
		"204 with a list":                  {addr, "/no-content", "200,204", true, 204, ""},
		"404 for a missing path":           {addr, "/missing", "200-399", false, 404, ""},
		"no answer is a timeout":           {addr, "/hang", "200-399", false, 0, errProbeTimeout.Error()},
		"stalled body is a timeout":        {addr, "/slow-body", "200-399", false, 200, errProbeTimeout.Error()},
		"refused":                          {refused, "/ok", "200-399", false, 0, "connection refused"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newProber(tc.addr, tc.path, 100*time.Millisecond, ranges(tc.expect))
			start := time.Now()
			r := p.probe(context.Background())
			if r.ok != tc.ok || r.status != tc.status {
				t.Fatalf("probe = ok %v status %d (%v), want ok %v status %d", r.ok, r.status, r.err, tc.ok, tc.status)
			}
			if (r.err == nil) != (tc.err == "") || (r.err != nil && !strings.Contains(r.err.Error(), tc.err)) {
				t.Fatalf("probe error %v, want %q", r.err, tc.err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("probe took %s with a 100ms timeout", took)
			}
		})
	}
}

// The loop delivers results in order, never has two probes in flight even
// when the probe timeout (50ms) is longer than the interval (10ms) and the
// replica never answers, and stops with its context.
func TestProbeLoopOneInFlight(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var hang atomic.Bool
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hang.Load() {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	p := newProber(addr, "/", 50*time.Millisecond, statusRanges{{200, 299}})
	var inFlight, maxInFlight, calls atomic.Int64
	probe := func(ctx context.Context) probeResult {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
		}
		calls.Add(1)
		return p.probe(ctx)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan probeResult)
	done := make(chan struct{})
	go func() { defer close(done); probeLoop(ctx, 10*time.Millisecond, probe, out) }()
	recv := func(i int) probeResult {
		select {
		case r := <-out:
			return r
		case <-time.After(5 * time.Second):
			t.Fatalf("no probe result %d within 5s", i)
			return probeResult{}
		}
	}
	for i := range 3 {
		if r := recv(i); r.status != 503 {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	hang.Store(true)
	timeouts := 0
	for i := 0; timeouts < 5; i++ {
		if r := recv(i); errors.Is(r.err, errProbeTimeout) {
			timeouts++
			if r.took < 50*time.Millisecond {
				t.Fatalf("timed out after %s, before probe.timeout", r.took)
			}
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("probe loop did not stop")
	}
	if n := maxInFlight.Load(); n != 1 {
		t.Fatalf("%d probes in flight at once", n)
	}
	if calls.Load() < 8 {
		t.Fatalf("%d probes", calls.Load())
	}
}
