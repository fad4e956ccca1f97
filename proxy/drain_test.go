package proxy

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/internal/poll"
)

const drainReq = "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nContent-Length: 2\r\n\r\nhi"

// A stopping proxy keeps its idle keep-alive connections, parked ones
// included, for server.drain_idle: a request on one is answered, with
// Connection: close, and the connection then closes. A request in flight
// when the stop begins is answered with Connection: close too. Once no
// connection is left, Run returns without waiting out the grace.
func TestDrainAnswersIdleConnectionsWithClose(t *testing.T) {
	for _, park := range []bool{false, true} {
		t.Run(map[bool]string{false: "active", true: "parked"}[park], func(t *testing.T) {
			rep := startReplica(t, "r1")
			release := make(chan struct{})
			arrived := make(chan struct{}, 1)
			rep.setHandler(func(ctx *fasthttp.RequestCtx) {
				if string(ctx.Path()) == "/slow" {
					arrived <- struct{}{}
					<-release
				}
				ctx.SetBodyString("ok")
			})
			cfg := testConfig(rep)
			cfg.Server.DrainIdle = time.Minute // longer than the test: Run must end because no connection is left
			if park {
				cfg.Server.ParkIdleAfter = 100 * time.Millisecond
			}
			p, cancel, runErr := runProxy(t, cfg, nil)
			addr := p.Addr().String()

			var idle []*rawConn
			for range 4 {
				c := dialRaw(t, addr)
				c.send(t, drainReq)
				if r := c.read(t); r.status != 200 || r.close {
					t.Fatalf("before the stop: %+v", r)
				}
				idle = append(idle, c)
			}
			if park {
				if p.parker == nil {
					t.Skip("connections park on Linux only")
				}
				poll.Until(t, 5*time.Second, "the connections to park", func() bool { return p.parker.Stats().Parked.Load() == 4 })
			}
			busy := dialRaw(t, addr)
			busy.send(t, strings.Replace(drainReq, "/ingest", "/slow", 1))
			within(t, arrived, 5*time.Second, "the slow request to reach the replica")

			cancel()
			poll.Until(t, 5*time.Second, "new connections to be refused", func() bool {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					return true
				}
				c.Close()
				return false
			})
			if p.Ready() {
				t.Fatal("Ready() is true while draining")
			}
			close(release)
			if r := busy.read(t); r.status != 200 || !r.close {
				t.Fatalf("the request in flight: %+v, want 200 with Connection: close", r)
			}
			var wg sync.WaitGroup
			for i, c := range idle {
				wg.Go(func() {
					c.send(t, drainReq)
					r, err := c.tryRead()
					if err != nil || r.status != 200 || !r.close || r.body != "ok" {
						t.Errorf("idle connection %d during the drain: %+v, %v; want 200 with Connection: close", i, r, err)
					}
					if !c.closedByPeer(5 * time.Second) {
						t.Errorf("idle connection %d still open after its answer", i)
					}
				})
			}
			wg.Wait()
			if !busy.closedByPeer(5 * time.Second) {
				t.Error("the connection of the request in flight is still open")
			}
			if err := within(t, runErr, 20*time.Second, "Run to return once no connection is left"); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}

// After server.drain_idle, connections still idle are closed and Run
// returns; with drain_idle 0 they are closed at once. That includes a
// connection that never carried a request, which fasthttp's shutdown
// alone closes only 5 seconds after it opened: beyond shutdown_timeout
// here, so that Run would fail.
func TestDrainClosesIdleConnectionsAfterTheGrace(t *testing.T) {
	for _, grace := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(grace.String(), func(t *testing.T) {
			cfg := testConfig(startReplica(t, "r1"))
			cfg.Server.DrainIdle = grace
			cfg.Server.ShutdownTimeout = 2 * time.Second
			cfg.Server.ParkIdleAfter = 100 * time.Millisecond
			p, cancel, runErr := runProxy(t, cfg, nil)
			fresh := dialRaw(t, p.Addr().String()) // never sends
			var cs []*rawConn
			for range 3 {
				c := dialRaw(t, p.Addr().String())
				c.send(t, drainReq)
				c.read(t)
				cs = append(cs, c)
			}
			if p.parker != nil { // Linux
				poll.Until(t, 5*time.Second, "the connections to park", func() bool { return p.parker.Stats().Parked.Load() == 3 })
			}
			live := dialRaw(t, p.Addr().String()) // idle, not parked
			live.send(t, drainReq)
			live.read(t)
			cancel()
			if err := within(t, runErr, 10*time.Second, "Run to return"); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for i, c := range append(cs, live, fresh) {
				if !c.closedByPeer(5 * time.Second) {
					t.Errorf("connection %d open after the stop", i)
				}
			}
		})
	}
}

func TestDrainIdleValidation(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 11 * time.Minute} {
		cfg := DefaultConfig()
		cfg.Server.DrainIdle = d
		if err := cfg.Server.Validate(); err == nil || !strings.Contains(err.Error(), "drain_idle: must be between 0") {
			t.Errorf("drain_idle %v: %v", d, err)
		}
	}
	for _, d := range []time.Duration{0, 5 * time.Second, 10 * time.Minute} {
		cfg := DefaultConfig()
		cfg.Server.DrainIdle = d
		if err := cfg.Server.Validate(); err != nil {
			t.Errorf("drain_idle %v: %v", d, err)
		}
	}
}

// Parked connections whose requests arrive together during the drain are
// all answered (with close), and the drain waits for them: the parker
// takes a woken connection out of its count before fasthttp counts it
// served, and a drain counting those two alone could take the moment
// between for "no connection left" and close the woken connections
// unread. wire's TestWokenConnectionCountsAsOpenUntilServed holds that
// moment open; this is the whole proxy's check.
func TestDrainAnswersParkedConnectionsWokenTogether(t *testing.T) {
	const conns = 40
	for round := range 2 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			cfg := testConfig(startReplica(t, "r1"))
			cfg.Server.DrainIdle = time.Minute // Run must end because no connection is left
			cfg.Server.ParkIdleAfter = 100 * time.Millisecond
			p, cancel, runErr := runProxy(t, cfg, nil)
			if p.parker == nil {
				t.Skip("connections park on Linux only")
			}
			var cs []*rawConn
			for range conns {
				c := dialRaw(t, p.Addr().String())
				c.send(t, drainReq)
				c.read(t)
				cs = append(cs, c)
			}
			poll.Until(t, 5*time.Second, "the connections to park", func() bool { return p.parker.Stats().Parked.Load() == conns })
			cancel()
			poll.Until(t, 5*time.Second, "the drain to begin", func() bool { return p.draining.Load() })
			var wg sync.WaitGroup
			for i, c := range cs {
				wg.Go(func() {
					c.send(t, drainReq)
					r, err := c.tryRead()
					if err != nil || r.status != 200 || !r.close {
						t.Errorf("parked connection %d during the drain: %+v, %v; want 200 with Connection: close", i, r, err)
					}
				})
			}
			wg.Wait()
			if err := within(t, runErr, 20*time.Second, "Run to return once no connection is left"); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}

// With AcceptWhileDraining (systemd holds the socket), a stopping proxy
// accepts through its drain, answering with close, and stops accepting
// only at its end; connections that come after wait in the socket's queue
// and the next proxy on the same socket answers them.
func TestDrainKeepsAcceptingWhileTheSocketOutlivesTheProcess(t *testing.T) {
	rep := startReplica(t, "r1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held, err := ln.(*net.TCPListener).File() // systemd's copy of the socket
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	addr := ln.Addr().String()
	cfg := testConfig(rep)
	cfg.Listen = addr
	cfg.Server.DrainIdle = time.Minute
	cfg.Server.ParkIdleAfter = 0
	opts := Options{
		Listen:              func(string, string) (net.Listener, error) { return ln, nil },
		AcceptWhileDraining: func() bool { return true },
	}
	p, cancel, runErr := runProxyOpts(t, cfg, opts, nil)
	idle := dialRaw(t, addr) // holds the drain open
	idle.send(t, drainReq)
	idle.read(t)

	cancel()
	poll.Until(t, 5*time.Second, "the drain to begin", func() bool { return p.draining.Load() })
	for i := range 3 {
		c := dialRaw(t, addr)
		c.send(t, drainReq)
		if r := c.read(t); r.status != 200 || !r.close {
			t.Fatalf("new connection %d during the drain: %+v, want 200 with Connection: close", i, r)
		}
		if !c.closedByPeer(5 * time.Second) {
			t.Fatalf("new connection %d still open after its answer", i)
		}
	}
	idle.send(t, drainReq)
	if r := idle.read(t); r.status != 200 || !r.close {
		t.Fatalf("the idle connection during the drain: %+v, want 200 with Connection: close", r)
	}
	if err := within(t, runErr, 20*time.Second, "Run to return once no connection is left"); err != nil {
		t.Fatalf("Run: %v", err)
	}

	// Between the processes: the connection waits in the queue.
	queued := dialRaw(t, addr)
	queued.send(t, drainReq)
	next, err := net.FileListener(held)
	if err != nil {
		t.Fatal(err)
	}
	opts.Listen = func(string, string) (net.Listener, error) { return next, nil }
	runProxyOpts(t, cfg, opts, nil)
	if r := queued.read(t); r.status != 200 || r.body != "r1" {
		t.Fatalf("the connection queued between the processes: %+v, want 200", r)
	}
}
