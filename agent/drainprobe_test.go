package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"keyway/internal/poll"
)

// probeAgent is an Agent with just what waitDrainProbe uses, probing the
// replica at addr.
func probeAgent(t *testing.T, addr, path string, timeout time.Duration) *Agent {
	t.Helper()
	log := zaptest.NewLogger(t)
	cfg := DefaultConfig()
	cfg.Replica.Addr = addr
	cfg.Probe.Interval, cfg.Probe.Timeout = 20*time.Millisecond, time.Second
	cfg.Drain.ProbePath, cfg.Drain.ProbeTimeout = path, timeout
	return &Agent{cfg: cfg, log: log, now: time.Now, metrics: newMetrics()}
}

// The drain probe holds the agent until the replica says its own work is
// done, and gives up after drain.probe_timeout.
func TestWaitDrainProbe(t *testing.T) {
	var done atomic.Bool
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/drained" {
			http.NotFound(w, r)
			return
		}
		asked.Add(1)
		if !done.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	a := probeAgent(t, addr, "/drained", time.Minute)
	returned := make(chan struct{})
	go func() { a.waitDrainProbe(context.Background()); close(returned) }()
	poll.Until(t, 5*time.Second, "the agent to ask the replica a few times", func() bool { return asked.Load() >= 3 })
	select {
	case <-returned:
		t.Fatal("the agent stopped waiting while the replica still had work")
	default:
	}
	done.Store(true)
	poll.Until(t, 5*time.Second, "the agent to stop waiting", func() bool {
		select {
		case <-returned:
			return true
		default:
			return false
		}
	})
	if n := testutil.ToFloat64(a.metrics.drainProbe.WithLabelValues("done")); n != 1 {
		t.Fatalf("drain probes done = %v, want 1", n)
	}

	// A replica that never says done: the agent leaves after the timeout.
	done.Store(false)
	b := probeAgent(t, addr, "/drained", 200*time.Millisecond)
	start := time.Now()
	b.waitDrainProbe(context.Background())
	if time.Since(start) < 200*time.Millisecond || testutil.ToFloat64(b.metrics.drainProbe.WithLabelValues("timeout")) != 1 {
		t.Fatalf("after %v: timeouts %v", time.Since(start), testutil.ToFloat64(b.metrics.drainProbe.WithLabelValues("timeout")))
	}

	// Without a drain probe nothing is asked.
	before := asked.Load()
	probeAgent(t, addr, "", time.Minute).waitDrainProbe(context.Background())
	if asked.Load() != before {
		t.Fatal("the agent asked a drain probe it was not given")
	}
}
