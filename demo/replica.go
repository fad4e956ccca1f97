// Package demo provides the built-in demo replica used by `keyway demo`,
// the benchmarks and the integration tests: a small fasthttp server that
// answers which replica got which key and counts the keys it has seen.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Replica is a demo pipeline replica. It is safe for concurrent use.
type Replica struct {
	name     string
	keyHdr   string
	routeHdr string // route context header; "" ignores it (SetRouteHeader)
	ln       net.Listener
	srv      *fasthttp.Server
	requests atomic.Int64
	unready  atomic.Bool  // /readyz answers 503 while set
	mode     atomic.Int32 // modeOK, modeFail (500 to every request) or modeHang (never answer)
	pending  atomic.Int64 // work it says it still holds: /_drained answers 503 while > 0

	mu   sync.Mutex
	keys map[string]int64
}

// Answer is the JSON body a demo replica returns for every request.
type Answer struct {
	Replica string `json:"replica"`
	// Key is the key keyway routed the request by, from the route context
	// header (RouteHeader); without that header, the replica's guess: the
	// key header's value, else the key query parameter or the second path
	// segment.
	Key      string `json:"key"`
	Method   string `json:"method"`
	Path     string `json:"path"`
	Bytes    int    `json:"bytes"`
	KeyCount int64  `json:"key_count"` // requests seen for this key
	Keys     int    `json:"keys"`      // distinct keys seen
	Requests int64  `json:"requests"`  // requests seen in all
}

const (
	modeOK int32 = iota
	modeFail
	modeHang
)

var modeNames = [...]string{"ok", "500", "hang"}

// maxDelay bounds a request's ?delay=.
const maxDelay = 30 * time.Second

// SetReady makes /readyz pass (true) or fail with 503 (false).
func (r *Replica) SetReady(ok bool) { r.unready.Store(!ok) }

// Stats is what GET /_stats returns.
type Stats struct {
	Replica  string           `json:"replica"`
	Requests int64            `json:"requests"`
	Keys     map[string]int64 `json:"keys"`
}

// RouteHeader is the route context header a demo replica reads the key
// from by default: the name the demo's configuration gives
// replica_sets[].route_context.header.
const RouteHeader = "X-Keyway-Route"

// Listen starts a demo replica called name on addr (e.g. "127.0.0.1:0").
// It reports the key keyway routed by, from the route context header
// (RouteHeader; SetRouteHeader changes it). A request without one, from a
// set without route_context, gets a guess: the value of keyHeader ("" means
// X-Key), else the key query parameter or the second path segment.
func Listen(name, addr, keyHeader string) (*Replica, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("demo replica %s: %w", name, err)
	}
	if keyHeader == "" {
		keyHeader = "X-Key"
	}
	r := &Replica{name: name, keyHdr: keyHeader, routeHdr: RouteHeader, ln: ln, keys: map[string]int64{}}
	r.srv = &fasthttp.Server{
		Handler:      r.handle,
		ReadTimeout:  30 * time.Second,
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  120 * time.Second,
	}
	return r, nil
}

// SetRouteHeader names the route context header the replica reads the
// routed key from; "" ignores route context (the key is always guessed).
// Call it before Run.
func (r *Replica) SetRouteHeader(h string) { r.routeHdr = h }

// Name returns the replica's name.
func (r *Replica) Name() string { return r.name }

// Addr returns the replica's listening address.
func (r *Replica) Addr() string { return r.ln.Addr().String() }

// Requests returns the number of requests served (stats requests excluded).
func (r *Replica) Requests() int64 { return r.requests.Load() }

// Keys returns a copy of the per-key request counts.
func (r *Replica) Keys() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int64, len(r.keys))
	for k, v := range r.keys {
		out[k] = v
	}
	return out
}

// Close closes the listener of a replica that will never Run.
func (r *Replica) Close() error { return r.ln.Close() }

// Run serves until ctx is done.
func (r *Replica) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- r.srv.Serve(r.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.srv.ShutdownWithContext(sctx)
	<-errc
	return err
}

func (r *Replica) handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	ctx.SetContentType("application/json")
	switch path {
	case "/_stats":
		r.mu.Lock()
		st := Stats{Replica: r.name, Requests: r.requests.Load(), Keys: make(map[string]int64, len(r.keys))}
		for k, v := range r.keys {
			st.Keys[k] = v
		}
		r.mu.Unlock()
		b, _ := json.Marshal(st)
		ctx.SetBody(b)
		return
	case "/healthz":
		ctx.SetBodyString(`{"ok":true}`)
		return
	case "/readyz":
		if r.unready.Load() {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"ready":false}`)
			return
		}
		ctx.SetBodyString(`{"ready":true}`)
		return
	case "/_mode":
		// POST /_mode?v=500 answers every request (but these /_ endpoints) with 500; v=hang
		// reads requests and never answers them (until v=ok); v=ok is
		// normal service. For trying passive health checks.
		if string(ctx.Method()) == fasthttp.MethodPost {
			switch string(ctx.QueryArgs().Peek("v")) {
			case "500":
				r.mode.Store(modeFail)
			case "hang":
				r.mode.Store(modeHang)
			default:
				r.mode.Store(modeOK)
			}
		}
		ctx.SetBodyString(fmt.Sprintf(`{"mode":%q}`, modeNames[r.mode.Load()]))
		return
	case "/_pending":
		// POST /_pending?v=N says the replica still holds N units of its
		// own work (as a pipeline job waiting at a barrier would); v=0
		// says it is done. GET /_drained answers 200 only at 0: the drain
		// probe (run.drain_probe, agent drain.probe_path).
		if string(ctx.Method()) == fasthttp.MethodPost {
			n, err := strconv.ParseInt(string(ctx.QueryArgs().Peek("v")), 10, 64)
			if err != nil || n < 0 {
				ctx.SetStatusCode(fasthttp.StatusBadRequest)
				ctx.SetBodyString(`{"error":"v must be a count, 0 or more"}`)
				return
			}
			r.pending.Store(n)
		}
		ctx.SetBodyString(fmt.Sprintf(`{"pending":%d}`, r.pending.Load()))
		return
	case "/_drained":
		if n := r.pending.Load(); n > 0 {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(fmt.Sprintf(`{"drained":false,"pending":%d}`, n))
			return
		}
		ctx.SetBodyString(`{"drained":true,"pending":0}`)
		return
	case "/_ready":
		// POST /_ready?v=false makes /readyz fail (as a replica replaying a
		// checkpoint would); v=true makes it pass again.
		if string(ctx.Method()) == fasthttp.MethodPost {
			r.unready.Store(string(ctx.QueryArgs().Peek("v")) == "false")
		}
		ctx.SetBodyString(fmt.Sprintf(`{"ready":%t}`, !r.unready.Load()))
		return
	}
	switch r.mode.Load() {
	case modeFail:
		r.requests.Add(1)
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetBodyString(`{"error":"demo replica in failure mode"}`)
		return
	case modeHang:
		r.requests.Add(1)
		// Hold the request until the mode changes or the server stops;
		// bounded so that a forgotten hang cannot pin a goroutine forever.
		for i := 0; i < 600 && r.mode.Load() == modeHang; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		return
	}
	if d, err := time.ParseDuration(string(ctx.QueryArgs().Peek("delay"))); err == nil && d > 0 {
		// ?delay=D holds this request for D (at most maxDelay) before it
		// is answered: a slow request, for trying drains.
		time.Sleep(min(d, maxDelay))
	}
	key, routed := r.routedKey(ctx)
	if !routed {
		key = guessKey(ctx, r.keyHdr, path)
	}
	n := r.requests.Add(1)
	r.mu.Lock()
	r.keys[key]++
	kc, nk := r.keys[key], len(r.keys)
	r.mu.Unlock()
	b, _ := json.Marshal(Answer{
		Replica: r.name, Key: key, Method: string(ctx.Method()), Path: path,
		Bytes: len(ctx.PostBody()), KeyCount: kc, Keys: nk, Requests: n,
	})
	ctx.SetBody(append(b, '\n'))
}

// routedKey returns the key of the request's route context header, ""
// for a request keyway routed without a key; routed is false when the
// request carries no route context (then the replica can only guess).
func (r *Replica) routedKey(ctx *fasthttp.RequestCtx) (key string, routed bool) {
	if r.routeHdr == "" {
		return "", false
	}
	v := ctx.Request.Header.Peek(r.routeHdr)
	if len(v) == 0 {
		return "", false
	}
	// partition=…; standin=…; ring=…; key=…; owner=… (owner last: it runs
	// to the end of the value); fields are read by name.
	for f := range strings.SplitSeq(string(v), "; ") {
		if strings.HasPrefix(f, "owner=") {
			break
		}
		if enc, ok := strings.CutPrefix(f, "key="); ok {
			if k, err := url.PathUnescape(enc); err == nil {
				return k, true
			}
			return enc, true
		}
	}
	return "", true
}

// guessKey is the key of a request that came without a route context:
// the key header's value, else the key query parameter or the second path
// segment, as the demo's configuration takes it.
func guessKey(ctx *fasthttp.RequestCtx, keyHdr, path string) string {
	if k := ctx.Request.Header.Peek(keyHdr); len(k) > 0 {
		return string(k)
	}
	if q := ctx.QueryArgs().Peek("key"); len(q) > 0 {
		return string(q)
	}
	if segs := splitPath(path); len(segs) >= 2 {
		return segs[1]
	}
	return ""
}

func splitPath(p string) []string {
	var out []string
	start := -1
	for i := 0; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			if start >= 0 && i > start {
				out = append(out, p[start:i])
			}
			start = i + 1
		}
	}
	return out
}
