//go:build linux

package proxy

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/internal/poll"
)

const parkReq = "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nContent-Length: 2\r\n\r\nhi"

func parkQuickly(after time.Duration) func(*Config) {
	return func(c *Config) { c.Server.ParkIdleAfter = after }
}

// A keep-alive connection idle for park_idle_after is parked (no
// goroutine), and its next request, and a pipelined pair after that, are
// answered on it as before.
func TestParkIdleConnection(t *testing.T) {
	rep := startReplica(t, "r1")
	p, addr := startProxy(t, parkQuickly(100*time.Millisecond), rep)
	pk := p.parker
	if pk == nil {
		t.Fatal("parking is off with park_idle_after 100ms")
	}
	rc := dialRaw(t, addr)
	rc.send(t, parkReq)
	if r := rc.read(t); r.status != 200 {
		t.Fatalf("first request: %v", r)
	}
	poll.Until(t, 5*time.Second, "the connection to park", func() bool { return pk.Stats().Parked.Load() == 1 })

	rc.send(t, parkReq)
	if r := rc.read(t); r.status != 200 {
		t.Fatalf("request on the parked connection: %v", r)
	}
	if w := pk.Stats().Wakes.Load(); w != 1 {
		t.Fatalf("unparks = %d, want 1", w)
	}
	poll.Until(t, 5*time.Second, "the connection to park again", func() bool { return pk.Stats().Parked.Load() == 1 })
	rc.send(t, parkReq+parkReq)
	for i := range 2 {
		if r := rc.read(t); r.status != 200 {
			t.Fatalf("pipelined request %d on the parked connection: %v", i, r)
		}
	}
	if got := rep.count.Load(); got != 4 {
		t.Fatalf("the replica saw %d requests, want 4", got)
	}
	if n := pk.Stats().Parks.Load(); n != 2 {
		t.Fatalf("parks = %d, want 2", n)
	}
}

// A parked connection holds no goroutine: with many parked, the proxy's
// goroutines come back to what they were before they connected.
func TestParkedConnectionsHoldNoGoroutine(t *testing.T) {
	const conns = 64
	rep := startReplica(t, "r1")
	p, addr := startProxy(t, parkQuickly(100*time.Millisecond), rep)
	// Warm up the replica pool so its connections' goroutines are there
	// before the baseline.
	warm := dialRaw(t, addr)
	for range 4 {
		warm.send(t, parkReq)
		warm.read(t)
	}
	poll.Until(t, 5*time.Second, "the warm-up connection to park", func() bool { return p.parker.Stats().Parked.Load() == 1 })
	base := runtime.NumGoroutine()
	cs := make([]*rawConn, conns)
	for i := range cs {
		cs[i] = dialRaw(t, addr)
		cs[i].send(t, parkReq)
		if r := cs[i].read(t); r.status != 200 {
			t.Fatalf("connection %d: %v", i, r)
		}
	}
	poll.Until(t, 10*time.Second, "every connection to park", func() bool { return p.parker.Stats().Parked.Load() == conns+1 })
	// fasthttp's workers end within 2 × parkWorkerIdle of their last
	// connection.
	var now int
	poll.Until(t, 10*time.Second, "the connections' goroutines to end", func() bool {
		now = runtime.NumGoroutine()
		return now < base+conns/4
	})
	// Every parked connection still works.
	for i, c := range cs {
		c.send(t, parkReq)
		if r := c.read(t); r.status != 200 {
			t.Fatalf("connection %d after parking: %v", i, r)
		}
	}
}

// A parked connection closes at idle_timeout after its last answer, not
// before, and not later than a sweep after it.
func TestParkedConnectionIdleTimeout(t *testing.T) {
	rep := startReplica(t, "r1")
	p, addr := startProxy(t, func(c *Config) {
		c.Server.ParkIdleAfter = 100 * time.Millisecond
		c.Server.IdleTimeout = 700 * time.Millisecond
	}, rep)
	rc := dialRaw(t, addr)
	rc.send(t, parkReq)
	rc.read(t)
	answered := time.Now()
	if !rc.closedByPeer(5 * time.Second) {
		t.Fatal("the parked connection was not closed at idle_timeout")
	}
	if d := time.Since(answered); d < 700*time.Millisecond {
		t.Fatalf("closed %v after its answer, before idle_timeout (700ms)", d)
	}
	if n := p.parker.Stats().Parks.Load(); n != 1 {
		t.Fatalf("parks = %d, want 1", n)
	}
	poll.Until(t, 5*time.Second, "the expiry to be counted", func() bool {
		return p.parker.Stats().Closed.Load() == 1 && p.parker.Stats().Parked.Load() == 0
	})
}

// A client that closes its parked connection: keyway wakes it, reads the
// end and closes its side; nothing stays parked.
func TestParkedConnectionClosedByClient(t *testing.T) {
	rep := startReplica(t, "r1")
	p, addr := startProxy(t, parkQuickly(100*time.Millisecond), rep)
	rc := dialRaw(t, addr)
	rc.send(t, parkReq)
	rc.read(t)
	poll.Until(t, 5*time.Second, "the connection to park", func() bool { return p.parker.Stats().Parked.Load() == 1 })
	rc.c.Close()
	poll.Until(t, 5*time.Second, "the closed connection to be unparked", func() bool {
		return p.parker.Stats().Parked.Load() == 0 && p.parker.Stats().Wakes.Load() == 1
	})
	poll.Until(t, 5*time.Second, "fasthttp to count it closed", func() bool { return p.server.GetOpenConnectionsCount() == 0 })
}

// A head that arrives in pieces, with a pause longer than
// park_idle_after inside it, is read whole: only the wait for a request's
// first byte parks.
func TestParkNotInsideAHead(t *testing.T) {
	rep := startReplica(t, "r1")
	p, addr := startProxy(t, parkQuickly(100*time.Millisecond), rep)
	rc := dialRaw(t, addr)
	rc.send(t, "POST /ingest HTTP/1.1\r\nHost: x\r\n")
	// Another connection parks meanwhile: by then the first has waited
	// longer than park_idle_after inside its head.
	other := dialRaw(t, addr)
	other.send(t, parkReq)
	other.read(t)
	poll.Until(t, 5*time.Second, "the other connection to park", func() bool { return p.parker.Stats().Parked.Load() == 1 })
	rc.send(t, "X-Key: k1\r\nContent-Length: 2\r\n\r\nhi")
	if r := rc.read(t); r.status != 200 {
		t.Fatalf("the slow head: %v", r)
	}
	if n := p.parker.Stats().Parks.Load(); n != 1 {
		t.Fatalf("parks = %d, want 1 (the other connection only)", n)
	}
}

// With connections parked, server.max_conns still counts them: a
// connection beyond is refused with 503, and admitted again once a parked
// one closed.
func TestParkedConnectionsCountTowardsMaxConns(t *testing.T) {
	rep := startReplica(t, "r1")
	p, addr := startProxy(t, func(c *Config) {
		c.Server.ParkIdleAfter = 100 * time.Millisecond
		c.Server.MaxConns = 2
	}, rep)
	var cs []*rawConn
	for range 2 {
		c := dialRaw(t, addr)
		c.send(t, parkReq)
		if r := c.read(t); r.status != 200 {
			t.Fatalf("admitted connection: %v", r)
		}
		cs = append(cs, c)
	}
	poll.Until(t, 5*time.Second, "both to park", func() bool { return p.parker.Stats().Parked.Load() == 2 })
	extra := dialRaw(t, addr)
	extra.send(t, parkReq)
	r := extra.read(t)
	if r.status != 503 || r.header["Retry-After"] != "1" || r.errorJSON(t)["reason"] != "max_conns" {
		t.Fatalf("a connection beyond max_conns with two parked: %v; want 503, Retry-After 1, reason max_conns", r)
	}
	if !extra.closedByPeer(5 * time.Second) {
		t.Fatal("the refused connection stayed open")
	}
	cs[0].c.Close()
	poll.Until(t, 5*time.Second, "the closed one to leave", func() bool {
		return p.parker.Stats().Parked.Load() == 1 && p.server.GetOpenConnectionsCount() == 0
	})
	again := dialRaw(t, addr)
	again.send(t, parkReq)
	if r := again.read(t); r.status != 200 {
		t.Fatalf("a connection after one closed: %v", r)
	}
	cs[1].send(t, parkReq)
	if r := cs[1].read(t); r.status != 200 {
		t.Fatalf("the parked connection that stayed: %v", r)
	}
}

// Shutdown closes parked connections (they are idle) and returns at once.
func TestShutdownClosesParkedConnections(t *testing.T) {
	rep := startReplica(t, "r1")
	cfg := testConfig(rep)
	cfg.Server.ParkIdleAfter = 100 * time.Millisecond
	p, cancel, runErr := runProxy(t, cfg, nil)
	var cs []*rawConn
	for range 8 {
		c := dialRaw(t, p.Addr().String())
		c.send(t, parkReq)
		c.read(t)
		cs = append(cs, c)
	}
	poll.Until(t, 5*time.Second, "the connections to park", func() bool { return p.parker.Stats().Parked.Load() == 8 })
	cancel()
	if err := within(t, runErr, 5*time.Second, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			if !c.closedByPeer(5 * time.Second) {
				t.Errorf("parked connection %d open after shutdown", i)
			}
		})
	}
	wg.Wait()
}

func TestParkIdleAfterValidation(t *testing.T) {
	for _, tc := range []struct {
		after, idle time.Duration
		want        string
	}{
		{50 * time.Millisecond, time.Minute, "park_idle_after: must be 0 (off) or at least 100ms"},
	} {
		cfg := DefaultConfig()
		cfg.Server.ParkIdleAfter, cfg.Server.IdleTimeout = tc.after, tc.idle
		err := cfg.Server.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("park_idle_after %v, idle_timeout %v: %v; want %q", tc.after, tc.idle, err, tc.want)
		}
	}
	for _, after := range []time.Duration{0, time.Hour} {
		cfg := DefaultConfig()
		cfg.Server.ParkIdleAfter = after
		if err := cfg.Server.Validate(); err != nil {
			t.Errorf("park_idle_after %v: %v", after, err)
		}
	}
	// Not below idle_timeout: valid, and nothing parks.
	rep := startReplica(t, "r1")
	p, _ := startProxy(t, func(c *Config) { c.Server.ParkIdleAfter = c.Server.IdleTimeout }, rep)
	if p.parker != nil {
		t.Error("a parker runs with park_idle_after = idle_timeout")
	}
}
