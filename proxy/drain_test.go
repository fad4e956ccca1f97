package proxy

import (
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
