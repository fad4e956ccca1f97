package integration

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/testcerts"
)

// tlsReplicaServer is a stand-in pipeline replica behind TLS, in the test
// process: it answers like the demo replica and counts what it saw.
type tlsReplicaServer struct {
	addr     string
	requests atomic.Int64
	closed   atomic.Int64 // connections it closed (idle timeout)
	mu       sync.Mutex
	peers    []string // client certificate names, per request
}

// startTLSReplicaServer serves name over TLS with cfg; idle closes
// keep-alive connections idle that long (net/http's IdleTimeout: the
// connection is closed with a close_notify alert, then FIN).
func startTLSReplicaServer(t *testing.T, name string, cfg *tls.Config, idle time.Duration) *tlsReplicaServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tlsReplicaServer{addr: ln.Addr().String()}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			io.Copy(io.Discard, req.Body)
			r.requests.Add(1)
			if pc := req.TLS.PeerCertificates; len(pc) > 0 {
				r.mu.Lock()
				r.peers = append(r.peers, pc[0].Subject.CommonName)
				r.mu.Unlock()
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(Answer{Replica: name, Key: req.Header.Get("X-Key")})
		}),
		TLSConfig:   cfg,
		IdleTimeout: idle,
		ErrorLog:    log.New(io.Discard, "", 0), // refused handshakes are the point of some tests
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				r.closed.Add(1)
			}
		},
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return r
}

// tlsProxyConfig is a proxy's configuration with the set orders over one
// static replica at addr, reached with the tls section tlsYAML.
func tlsProxyConfig(t *testing.T, addr, tlsYAML string) string {
	t.Helper()
	return WriteFile(t, t.TempDir(), "proxy.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
gossip:
  enabled: true
  %s
replica_sets:
  - name: orders
    replicas: 1
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 5s, idle: 30s}
    retries: {attempts: 1}
    static: [{name: orders-0, addr: "%s"}]
    tls:
%s`, gossipYAML(nil, "  "), addr, tlsYAML))
}

// TLS from keyway to a replica, with the real binary: the replica (mTLS)
// is reached with the CA file and the client certificate, and refused
// without them — 503 (the request never reached it), the error logged with
// what to check; a pooled TLS connection the replica closed while idle is
// not used (no 502, nothing counted against the replica, no ejection).
func TestTLSToReplicasEndToEnd(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	ca := testcerts.New(t)
	caFile := ca.File(t, dir)
	certFile, keyFile := ca.Issue(t, dir, "orders-0", "orders-0.orders.test")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, clientKey := ca.Issue(t, dir, "keyway-proxy", "keyway-proxy")
	rep := startTLSReplicaServer(t, "orders-0", &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
	}, 300*time.Millisecond)
	full := fmt.Sprintf("      enabled: true\n      ca_file: %q\n      cert_file: %q\n      key_file: %q\n      server_name: \"{replica}.orders.test\"\n",
		caFile, clientCert, clientKey)

	t.Run("refused", func(t *testing.T) {
		for name, tc := range map[string]struct{ tlsYAML, hint string }{
			"without the CA file":            {"      enabled: true\n      cert_file: " + clientCert + "\n      key_file: " + clientKey + "\n      server_name: \"{replica}.orders.test\"\n", "tls.ca_file"},
			"without the client certificate": {fmt.Sprintf("      enabled: true\n      ca_file: %q\n      server_name: \"{replica}.orders.test\"\n", caFile), "tls.cert_file"},
		} {
			t.Run(name, func(t *testing.T) {
				before := rep.requests.Load()
				p := StartProxyFile(t, "proxy", tlsProxyConfig(t, rep.addr, tc.tlsYAML))
				code, _, err := NewClient().Send(p.Addr, "k")
				if err != nil || code != 503 {
					t.Fatalf("POST: %d, %v; want 503 (never delivered)", code, err)
				}
				const msg = "TLS handshake with a replica failed; the request goes to the next candidate or gets 503"
				p.WaitLine(t, regexp.MustCompile(`"msg":"`+regexp.QuoteMeta(msg)+`"`), 10*time.Second)
				if logged := p.Logs(msg); len(logged) == 0 || !strings.Contains(fmt.Sprint(logged[0]["error"]), tc.hint) {
					t.Errorf("logged %v, want an error saying to check %s", logged, tc.hint)
				}
				if got := Metric(p.Admin, "keyway_upstream_errors_total", map[string]string{"kind": "tls_handshake", "replica": "orders-0"}); got < 1 {
					t.Errorf("tls_handshake errors = %v", got)
				}
				if n := rep.requests.Load() - before; n != 0 {
					t.Errorf("the replica received %d requests", n)
				}
			})
		}
	})

	t.Run("reached, and idle connections closed by the replica", func(t *testing.T) {
		p := StartProxyFile(t, "proxy", tlsProxyConfig(t, rep.addr, full))
		c := NewClient()
		for i := range 3 {
			closedBefore := rep.closed.Load()
			code, who, err := c.Send(p.Addr, fmt.Sprintf("k-%d", i))
			if err != nil || code != 200 || who != "orders-0" {
				t.Fatalf("POST %d: %d %q %v; want 200 from orders-0", i, code, who, err)
			}
			// The replica idles the proxy's pooled connection out (300ms):
			// close_notify, then FIN. The next POST must not go into it.
			poll.Until(t, 10*time.Second, "the replica to close the idle pooled connection", func() bool {
				return rep.closed.Load() > closedBefore
			})
		}
		code, who, err := c.Send(p.Addr, "k-last")
		if err != nil || code != 200 || who != "orders-0" {
			t.Fatalf("last POST: %d %q %v; want 200 from orders-0", code, who, err)
		}
		labels := func(kind string) map[string]string { return map[string]string{"kind": kind, "replica": "orders-0"} }
		if got := Metric(p.Admin, "keyway_upstream_errors_total", labels("stale_conn")); got != 3 {
			t.Errorf("stale_conn = %v, want 3 (one per connection the replica closed)", got)
		}
		for _, kind := range []string{"reset", "reused_closed", "tls_handshake", "other", "dial"} {
			if got := Metric(p.Admin, "keyway_upstream_errors_total", labels(kind)); got != 0 {
				t.Errorf("%s = %v, want 0", kind, got)
			}
		}
		if got := Metric(p.Admin, "keyway_ejections_total", map[string]string{"replica": "orders-0"}); got > 0 {
			t.Errorf("orders-0 was ejected %v times", got)
		}
		if got := Metric(p.Admin, "keyway_rotation_replicas", map[string]string{"set": "orders"}); got != 1 {
			t.Errorf("replicas in rotation = %v, want 1", got)
		}
		rep.mu.Lock()
		defer rep.mu.Unlock()
		for _, peer := range rep.peers {
			if peer != "keyway-proxy" {
				t.Fatalf("the replica saw client certificate %q, want keyway-proxy", peer)
			}
		}
	})
}
