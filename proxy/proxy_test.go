package proxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/internal/poll"

	"github.com/valyala/fasthttp"
)

// TestGracefulShutdown: cancelling Run's context stops new connections at
// once, lets every in-flight request finish with the replica's answer, and
// Run returns nil.
func TestGracefulShutdown(t *testing.T) {
	const inflight = 8
	rep := startReplica(t, "slow")
	arrived := make(chan struct{}, inflight)
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	rep.setHandler(func(ctx *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-time.After(20 * time.Second):
		}
		ctx.SetBodyString("done")
	})

	cfg := testConfig(rep)
	cfg.ReplicaSets[0].Timeouts.Request = 20 * time.Second
	p, cancel, runErr := runProxy(t, cfg, nil)
	addr := p.Addr().String()

	// One connection per in-flight request.
	results := make(chan reply, inflight)
	for i := 0; i < inflight; i++ {
		go func() {
			r, err := newClient(addr).try("POST", "/ingest", "x", "X-Key", fmt.Sprint("k", i))
			if err != nil {
				r = reply{status: -1, body: err.Error()}
			}
			results <- r
		}()
	}
	for i := 0; i < inflight; i++ {
		within(t, arrived, 5*time.Second, "requests to reach the replica")
	}

	cancel()
	// New connections are refused once the listener is closed.
	poll.Until(t, 5*time.Second, "new connections to be refused", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	if p.Ready() {
		t.Fatal("Ready() is true while shutting down")
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned %v with %d requests in flight", err, inflight)
	default:
	}

	releaseAll()
	for i := 0; i < inflight; i++ {
		r := within(t, results, 10*time.Second, "in-flight requests to complete")
		if r.status != 200 || r.body != "done" {
			t.Errorf("in-flight request %d: %v", i, r)
		}
	}
	if err := within(t, runErr, 10*time.Second, "Run to return"); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	if n := rep.count.Load(); n != inflight {
		t.Fatalf("replica saw %d requests, want %d", n, inflight)
	}
}

// TestRunTwice: a second Run is an error, not a second server.
func TestRunTwice(t *testing.T) {
	p, _ := startProxy(t, nil, startReplica(t, "r0"))
	poll.Until(t, 5*time.Second, "the proxy to be ready", p.Ready)
	if err := p.Run(context.Background()); err == nil {
		t.Fatal("second Run returned nil")
	}
}

// TestSets lists the configured sets in configuration order.
func TestSets(t *testing.T) {
	p, _ := startProxy(t, func(c *Config) {
		b := c.ReplicaSets[0]
		b.Name, b.Match.PathPrefix = "beta", "/beta"
		a := c.ReplicaSets[0]
		a.Name, a.Match.PathPrefix = "alpha", "/alpha/longer"
		c.ReplicaSets = []SetConfig{b, a}
	}, startReplica(t, "r0"))
	if got := fmt.Sprint(p.Sets()); got != "[beta alpha]" {
		t.Fatalf("Sets() = %s", got)
	}
	if p.Router("alpha") == nil || p.Router("nope") != nil {
		t.Fatal("Router lookup by set name")
	}
}

// TestRunCancelledAtOnce: a context cancelled while Run is still starting
// must not leave the server running (fasthttp's Shutdown ignores a listener
// Serve has not registered yet).
func TestRunCancelledAtOnce(t *testing.T) {
	rep := startReplica(t, "r0")
	for i := 0; i < 20; i++ {
		p, err := New(testConfig(rep), Options{Coalesce: -1})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		cancel()
		if err := within(t, done, 5*time.Second, "Run to return after cancel"); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}

// TestShutdownWhileLingering: a connection drained after a 431 (see
// listener.go) stays open for the client to read the answer, and does not
// hold up Run once the server has shut down, even if its client never
// closes it.
func TestShutdownWhileLingering(t *testing.T) {
	cfg := testConfig(startReplica(t, "r0"))
	cfg.Server.MaxHeaderBytes = 1 << 10
	// only the shutdown can end the draining in time
	p, cancel, runErr := runProxy(t, cfg, func(p *Proxy) { p.front.LingerTime = time.Hour })

	rc := dialRaw(t, p.Addr().String())
	rc.send(t, "GET / HTTP/1.1\r\nHost: a\r\nX-Big: "+strings.Repeat("b", 4<<10)+"\r\n\r\n")
	if r := rc.read(t); r.status != 431 {
		t.Fatalf("got %v, want 431", r)
	}
	// keyway half-closed the connection after its answer and drains what
	// the client still sends (for up to an hour, here): a client that goes
	// on writing its request is not reset.
	chunk := []byte(strings.Repeat("b", 64<<10))
	for i := 0; i < 16; i++ {
		_ = rc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := rc.c.Write(chunk); err != nil {
			t.Fatalf("write %d after the 431: %v; the connection was reset, not drained", i, err)
		}
	}
	// Only the shutdown can end this connection's draining in time.
	cancel()
	if err := within(t, runErr, 10*time.Second, "Run to return while a connection lingers"); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
