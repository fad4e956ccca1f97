package main

import (
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The floor proxy forwards each key to one replica, always the same, and
// answers 502 when that replica cannot be reached.
func TestFloorProxy(t *testing.T) {
	var reps []*replica
	for _, name := range []string{"r0", "r1", "r2"} {
		r, err := startReplica(name, 100, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.close() })
		reps = append(reps, r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A replica address nothing listens on: keys hashed to it get 502.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	srv := newFloorProxy([]string{reps[0].addr(), reps[1].addr(), reps[2].addr(), deadAddr}, 100, false)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })

	c := &fasthttp.Client{}
	got := map[string]int{}
	for round := range 3 {
		for i := range 100 {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.SetRequestURI("http://" + ln.Addr().String() + "/ingest")
			req.Header.Set("X-Key", keyName(i))
			if err := c.DoTimeout(req, resp, 5*time.Second); err != nil {
				t.Fatalf("key %d: %v", i, err)
			}
			code := resp.StatusCode()
			if round == 0 {
				got[keyName(i)] = code
			} else if got[keyName(i)] != code {
				t.Fatalf("key %d answered %d, then %d", i, got[keyName(i)], code)
			}
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		}
	}
	var ok, bad int
	for _, code := range got {
		switch code {
		case 200:
			ok++
		case 502:
			bad++
		default:
			t.Fatalf("status %d", code)
		}
	}
	if ok == 0 || bad == 0 {
		t.Fatalf("%d keys answered 200 and %d 502; want both (a quarter of the keys hash to the dead replica)", ok, bad)
	}
	// Key affinity: no key reached two replicas.
	for i := range 100 {
		n := 0
		for _, r := range reps {
			if r.keys[i].Load() > 0 {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("key %d reached %d replicas", i, n)
		}
	}
}
