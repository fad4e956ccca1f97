package health

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
	"keyway/internal/testnet"
)

// Real servers on 127.0.0.1 and the errors real clients return: the
// classification must hold for them, not only for hand-made values.

// hangServer accepts connections and never answers.
func hangServer(t *testing.T) string {
	addr, _ := hangServerCounting(t)
	return addr
}

// hangServerCounting is hangServer that also reports how many connections
// it has accepted.
func hangServerCounting(t *testing.T) (string, func() int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
}

// closeServer reads a request and closes the connection without answering.
func closeServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 4096)
				c.Read(buf)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// refusedAddr returns an address nothing listens on.
func refusedAddr(t *testing.T) string { return testnet.RefusedAddr(t) }

func TestClassifyRealErrors(t *testing.T) {
	t.Parallel()
	srv500 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
	t.Cleanup(srv500.Close) // the subtests are parallel: they run after this function returns
	addrs := map[string]string{
		"refused": refusedAddr(t), "hang": hangServer(t), "close": closeServer(t),
		"500": srv500.Listener.Addr().String(),
	}
	want := map[string]kind{"refused": kindConnect, "hang": kindTimeout, "close": kindReset, "500": kind5xx}

	hc := &http.Client{Timeout: 100 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	for name, addr := range addrs {
		t.Run("net/http "+name, func(t *testing.T) {
			t.Parallel()
			status := 0
			resp, err := hc.Get("http://" + addr + "/")
			if err == nil {
				status = resp.StatusCode
				resp.Body.Close()
			}
			if got := classify(status, err); got != want[name] {
				t.Fatalf("classify(%d, %v) = %q, want %q", status, err, got, want[name])
			}
		})
		t.Run("fasthttp "+name, func(t *testing.T) {
			t.Parallel()
			c := &fasthttp.HostClient{Addr: addr, ReadTimeout: 100 * time.Millisecond, MaxIdemponentCallAttempts: 1}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + "/")
			req.Header.SetMethod(http.MethodPost) // not idempotent: no client retry
			err := c.DoTimeout(req, resp, 100*time.Millisecond)
			status := 0
			if err == nil {
				status = resp.StatusCode()
			}
			if got := classify(status, err); got != want[name] {
				t.Fatalf("classify(%d, %v) = %q, want %q", status, err, got, want[name])
			}
		})
	}
}

// The scenario at the package's level: a replica answering 500s
// (then one that accepts TCP but never answers) is ejected through Run
// and comes back after its backoff; outcomes come from a real client.
func TestPassiveLive(t *testing.T) {
	t.Parallel()
	var status atomic.Int32
	status.Store(500)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) }))
	defer srv.Close()

	cfg := DefaultConfig()
	cfg.Supervision.MaxEjections = 0
	cfg.Passive.Interval = 10 * time.Millisecond
	cfg.Passive.BaseEjection = 200 * time.Millisecond
	lc := startChecker(t, cfg)
	lc.c.SetTargets("s", []Target{
		{Replica: "a", Addr: srv.Listener.Addr().String()},
		{Replica: "b", Addr: hangServer(t)},
		{Replica: "c", Addr: "127.0.0.1:1"},
		{Replica: "d", Addr: "127.0.0.1:2"},
	})
	hc := &http.Client{Timeout: 50 * time.Millisecond}
	request := func(replica, addr string) {
		start := time.Now()
		resp, err := hc.Get("http://" + addr + "/")
		code := 0
		if err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		lc.c.Observe("s", replica, code, err, time.Since(start))
	}

	for range 5 {
		request("a", srv.Listener.Addr().String())
	}
	e := lc.next(t)
	if e.Kind != EventEjected || e.Replica != "a" || e.Reason != "5xx" {
		t.Fatalf("event %+v, want a ejected for 5xx", e.Event)
	}
	until := e.Until
	status.Store(200)
	e = lc.next(t)
	if e.Kind != EventReadmitted || e.Replica != "a" || e.Time.Before(until) {
		t.Fatalf("event %+v, want a readmitted", e.Event)
	}
	request("a", srv.Listener.Addr().String()) // answers now

	hang := lc.c.Snapshot("s")[1].Addr
	for range 5 {
		request("b", hang)
	}
	e = lc.next(t)
	if e.Kind != EventEjected || e.Replica != "b" || e.Reason != "timeout" {
		t.Fatalf("event %+v, want b ejected for timeouts", e.Event)
	}
	if got := lc.sink.reasons("s", "b"); got != balancer.ReasonEjected {
		t.Fatalf("b: %s", got)
	}
	// Share cap: b is out (1 of 4); a second may go, a third may not.
	for _, r := range []string{"c", "d"} {
		for range 5 {
			lc.c.Observe("s", r, 0, context.DeadlineExceeded, 0)
		}
	}
	e = lc.next(t)
	if e.Kind != EventEjected || (e.Replica != "c" && e.Replica != "d") {
		t.Fatalf("event %+v", e.Event)
	}
	if snap := lc.c.Snapshot("s"); !snap[2].ShareCapped && !snap[3].ShareCapped {
		t.Fatalf("neither c nor d share-capped: %+v", snap)
	}
}
