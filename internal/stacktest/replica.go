package stacktest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"
)

// Replica is a fasthttp server standing in for a pipeline replica: it
// answers 200 with its name, or 500 while failing or to a request with an
// X-Fail header (a fault only some clients see); /healthz always answers
// 200; a request with X-Hang waits until the test releases it.
type Replica struct {
	Name    string
	Addr    string
	Failing atomic.Bool // answer 500 while true
	served  atomic.Int64
	release chan struct{}
	once    sync.Once
}

// StartReplica runs a Replica on 127.0.0.1:0 until the test ends.
func StartReplica(t testing.TB, name string) *Replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Replica{Name: name, Addr: ln.Addr().String(), release: make(chan struct{})}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/healthz" {
			r.served.Add(1)
		}
		switch {
		case string(ctx.Path()) == "/healthz":
		case len(ctx.Request.Header.Peek("X-Hang")) > 0:
			<-r.release
		case r.Failing.Load(), len(ctx.Request.Header.Peek("X-Fail")) > 0:
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		}
		ctx.SetBodyString(r.Name)
	}}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			t.Errorf("replica %s: %v", name, err)
		}
		<-done
	})
	t.Cleanup(r.Unblock) // runs before Shutdown
	return r
}

// Unblock releases the requests waiting on X-Hang (idempotent).
func (r *Replica) Unblock() { r.once.Do(func() { close(r.release) }) }

// Requests counts the requests it received, /healthz aside.
func (r *Replica) Requests() int64 { return r.served.Load() }
