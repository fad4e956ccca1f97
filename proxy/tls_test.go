package proxy

import (
	"bufio"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"keyway/internal/poll"
	"keyway/internal/testcerts"
	"keyway/tlsconfig"
)

// withTLS turns the proxy's TLS on with a certificate for orders.example.
func withTLS(tb testing.TB, ca *testcerts.CA) func(*Config) {
	cert, key := ca.Issue(tb, tb.TempDir(), "orders", "orders.example")
	return func(c *Config) {
		c.TLS.Certificates = []tlsconfig.CertificateConfig{{CertFile: cert, KeyFile: key}}
	}
}

func tlsClient(addr string, ca *testcerts.CA) *client {
	c := newClient(addr)
	c.hc.IsTLS = true
	c.hc.TLSConfig = &tls.Config{RootCAs: ca.Pool(), ServerName: "orders.example"}
	return c
}

// A request over TLS reaches the replica as plain HTTP with
// X-Forwarded-Proto: https, whatever the client claimed.
func TestTLSForwards(t *testing.T) {
	ca := testcerts.New(t)
	r := startReplica(t, "r0")
	reg := newRegistry()
	p, addr := startProxyOpts(t, Options{Registerer: reg}, withTLS(t, ca), r)
	if p.TLS() == nil {
		t.Fatal("TLS() is nil with certificates")
	}
	c := tlsClient(addr, ca)
	for range 3 { // one keep-alive connection
		rep := c.do(t, "POST", "https://orders.example/ingest", "{}", "X-Key", "k1", "X-Forwarded-Proto", "http")
		if rep.status != 200 || rep.body != "r0" {
			t.Fatalf("over TLS: %v", rep)
		}
		last := r.last.Load()
		if got := string(last.Header.Peek("X-Forwarded-Proto")); got != "https" {
			t.Fatalf("X-Forwarded-Proto %q, want https", got)
		}
	}
	// A plain-HTTP client on the TLS port fails its handshake: counted as
	// such, not as a malformed request, and answered nothing.
	if rep, err := newClient(addr).try("GET", "/", ""); err == nil {
		t.Fatalf("plain HTTP got an answer on the TLS listener: %v", rep)
	}
	poll.Until(t, 5*time.Second, "the failed handshake counted", func() bool {
		n, _ := sample(t, reg, "keyway_tls_handshake_errors_total", map[string]string{"listener": "proxy"})
		return n == 1
	})
	if n, _ := sample(t, reg, "keyway_local_responses_total", map[string]string{"set": "none", "reason": "malformed"}); n != 0 {
		t.Fatalf("a failed handshake counted as %v malformed requests", n)
	}
}

// Plain HTTP stays plain: no TLS server, X-Forwarded-Proto: http.
func TestPlainHasNoTLS(t *testing.T) {
	r := startReplica(t, "r0")
	p, addr := startProxy(t, nil, r)
	if p.TLS() != nil {
		t.Fatal("TLS() is not nil without certificates")
	}
	newClient(addr).do(t, "POST", "/ingest", "{}", "X-Key", "k1", "X-Forwarded-Proto", "https")
	if got := string(r.last.Load().Header.Peek("X-Forwarded-Proto")); got != "http" {
		t.Fatalf("X-Forwarded-Proto %q, want http", got)
	}
}

// A 431 over TLS reaches the client, which may go on writing: the TCP
// connection beneath TLS closes lingering (listener.go).
func TestTLSLingeringClose(t *testing.T) {
	ca := testcerts.New(t)
	_, addr := startProxy(t, func(c *Config) {
		withTLS(t, ca)(c)
		c.Server.MaxHeaderBytes = 1 << 10
	}, startReplica(t, "r0"))
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "orders.example"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 4<<10) + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(c)); err != nil || resp.StatusCode() != 431 {
		t.Fatalf("got %d %v, want 431", resp.StatusCode(), err)
	}
	chunk := []byte(strings.Repeat("b", 64<<10))
	for i := range 16 {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("write %d after the 431: %v; the connection was reset, not drained", i, err)
		}
	}
}

// Turning TLS on or off is refused at reload; its other keys are the
// caller's (tlsconfig.Server.Reload).
func TestTLSReloadOnOff(t *testing.T) {
	ca := testcerts.New(t)
	r := startReplica(t, "r0")
	p, _ := startProxy(t, withTLS(t, ca), r)
	cfg := testConfig(r)
	if err := p.CheckReload(cfg); err == nil || !strings.Contains(err.Error(), "tls.certificates: the listener serves TLS, the file has none") {
		t.Fatalf("TLS off at reload: %v", err)
	}
	plain, _ := startProxy(t, nil, r)
	withTLS(t, ca)(&cfg)
	if err := plain.CheckReload(cfg); err == nil || !strings.Contains(err.Error(), "turning TLS on or off takes effect only at start") {
		t.Fatalf("TLS on at reload: %v", err)
	}
}

// BenchmarkTLSKeepAlive measures one keyed POST over one keep-alive
// connection through a real loopback socket, plain and over TLS (the
// client, keyway and the replica in this process: allocations of all
// three are counted).
func BenchmarkTLSKeepAlive(b *testing.B) {
	ca := testcerts.New(b)
	for _, mode := range []string{"plain", "tls"} {
		b.Run(mode, func(b *testing.B) {
			r := startReplica(b, "r0")
			var modify func(*Config)
			if mode == "tls" {
				modify = withTLS(b, ca)
			}
			_, addr := startProxyOpts(b, Options{Logger: zap.NewNop()}, modify, r)
			c := newClient(addr)
			c.hc.MaxConns = 1
			if mode == "tls" {
				c = tlsClient(addr, ca)
				c.hc.MaxConns = 1
			}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI(map[string]string{"plain": "http", "tls": "https"}[mode] + "://orders.example/ingest")
			req.Header.SetHost("orders.example")
			req.Header.SetMethod("POST")
			req.Header.Set("X-Key", "customer-42")
			req.SetBodyString(`{"id":1,"amount":12.5}`)
			if err := c.hc.Do(req, resp); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := c.hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatal(resp.StatusCode(), err)
				}
			}
		})
	}
}
