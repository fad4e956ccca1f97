package main

import (
	"context"
	"maps"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestForwardHeaders: with -forward-headers, HAProxy and nginx (where
// installed) add keyway's forwarding headers, as a replica sees them: the
// client's address in X-Forwarded-For, after any the client sent; the
// scheme; the client's Host; 32 hex digits of request ID, or the client's
// own.
func TestForwardHeaders(t *testing.T) {
	for _, name := range []string{"haproxy", "nginx"} {
		t.Run(name, func(t *testing.T) {
			if _, err := exec.LookPath(name); err != nil {
				t.Skipf("%s not installed", name)
			}
			ts, _, err := newTargets([]string{name}, "")
			if err != nil || len(ts) != 1 {
				t.Fatalf("newTargets: %v %v", ts, err)
			}
			var mu sync.Mutex
			seen := map[string]string{}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
				mu.Lock()
				defer mu.Unlock()
				clear(seen)
				for _, h := range []string{"Host", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Request-Id"} {
					// HAProxy adds an X-Forwarded-For field of its own
					// after the client's; keyway appends to the client's.
					// Both are the same list (RFC 9110 §5.3).
					var vs []string
					for _, v := range ctx.Request.Header.PeekAll(h) {
						vs = append(vs, string(v))
					}
					seen[h] = strings.Join(vs, ", ")
				}
			}}
			go srv.Serve(ln)
			defer srv.Shutdown()

			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			env := &targetEnv{replicas: []string{ln.Addr().String()}, maxConns: 100, nofile: 1024, fwd: true}
			args, err := ts[0].config(dir, port, env)
			if err != nil {
				t.Fatal(err)
			}
			// Stopped as the harness stops a target, SIGTERM first: nginx's
			// and HAProxy's workers outlive a master killed with SIGKILL.
			p, err := startProc(name, dir, -1, env.procEnv, append([]string{ts[0].bin}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer p.stop(5 * time.Second)
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := waitReady(ctx, addr, 15*time.Second, p.alive, nil); err != nil {
				t.Fatal(err)
			}
			send := func(hdr map[string]string) map[string]string {
				t.Helper()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/x", nil)
				req.Host = "ingest.example"
				req.Header.Set("X-Key", "k1")
				for k, v := range hdr {
					req.Header.Set(k, v)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				return maps.Clone(seen)
			}
			got := send(nil)
			want := map[string]string{"Host": "ingest.example", "X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "ingest.example"}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q (all: %q)", k, got[k], v, got)
				}
			}
			if id := got["X-Request-Id"]; !regexp.MustCompile(`^[0-9a-f-]{32,36}$`).MatchString(id) {
				t.Errorf("X-Request-Id = %q, want a random ID", id)
			}
			got = send(map[string]string{"X-Request-Id": "client-id", "X-Forwarded-For": "10.1.2.3"})
			if got["X-Request-Id"] != "client-id" || got["X-Forwarded-For"] != "10.1.2.3, 127.0.0.1" {
				t.Errorf("with the client's own: X-Request-Id = %q, X-Forwarded-For = %q; want client-id and 10.1.2.3, 127.0.0.1", got["X-Request-Id"], got["X-Forwarded-For"])
			}
		})
	}
}
