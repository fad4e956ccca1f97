package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"keyway/internal/poll"
	"keyway/internal/testcerts"
	"keyway/tlsconfig"
)

// tlsReplica is a raw replica behind TLS: it answers every request 200
// with its name, and records each connection's TLS state.
type tlsReplica struct {
	*testReplica
	mu     sync.Mutex
	conns  []*tls.Conn           // handshake done
	states []tls.ConnectionState // of conns
	failed []error               // failed handshakes
	// written counts the answers whose Write has returned: crypto/tls's
	// Close sends no close_notify while a Write is still in progress.
	written atomic.Int64
}

// finHeld is a server's TCP connection whose Close sends nothing: a
// tls.Conn over it sends its close_notify alert and no FIN (the FIN of a
// server that is slow to close, still on its way).
type finHeld struct{ net.Conn }

func (finHeld) Close() error { return nil }

// startTLSReplica starts a tlsReplica with the server configuration cfg.
// With holdFIN, closing a connection sends only the close_notify alert.
func startTLSReplica(t testing.TB, name string, cfg *tls.Config, holdFIN bool) *tlsReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tlsReplica{testReplica: &testReplica{name: name, ln: ln, keys: map[string]int{}}}
	var wg sync.WaitGroup
	var rawMu sync.Mutex
	var raw []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rawMu.Lock()
			raw = append(raw, c)
			rawMu.Unlock()
			under := c
			if holdFIN {
				under = finHeld{c}
			}
			tc := tls.Server(under, cfg)
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					r.mu.Lock()
					r.failed = append(r.failed, err)
					r.mu.Unlock()
					return
				}
				_ = c.SetDeadline(time.Time{})
				r.mu.Lock()
				r.conns = append(r.conns, tc)
				r.states = append(r.states, tc.ConnectionState())
				r.mu.Unlock()
				br := bufio.NewReader(tc)
				for {
					var req fasthttp.Request
					if req.Read(br) != nil {
						return
					}
					r.record(&req)
					if _, err := tc.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: " + itoa(len(name)) + "\r\n\r\n" + name)); err != nil {
						return
					}
					r.written.Add(1)
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		rawMu.Lock()
		for _, c := range raw {
			c.Close()
		}
		rawMu.Unlock()
		wg.Wait()
	})
	return r
}

func itoa(n int) string { return string(fasthttp.AppendUint(nil, n)) }

// closeAll closes every connection the way a server idling them out
// does: close_notify, then FIN (unless held). The connections must be
// idle (see awaitIdle).
func (r *tlsReplica) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

// awaitIdle waits until the replica is done writing every answer: its
// connections are idle.
func (r *tlsReplica) awaitIdle(t testing.TB) {
	t.Helper()
	poll.Until(t, 5*time.Second, "the replica to finish writing its answers", func() bool { return r.written.Load() == r.count.Load() })
}

func (r *tlsReplica) snapshot() ([]tls.ConnectionState, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.states), slices.Clone(r.failed)
}

// serverTLS is a replica's TLS configuration with the certificate files.
func serverTLS(t testing.TB, certFile, keyFile string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// issueServer issues a certificate for names and returns the replica's
// TLS configuration with it.
func issueServer(t testing.TB, ca *testcerts.CA, dir, name string, names ...string) *tls.Config {
	t.Helper()
	cert, key := ca.Issue(t, dir, name, names...)
	return serverTLS(t, cert, key)
}

// warnLogs returns a logger writing to the test's log and an observer of
// its warnings.
func warnLogs(t testing.TB) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.WarnLevel)
	return zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core)), logs
}

// A replica behind TLS is reached with the set's tls section, or refused
// as the delivery contract says: a failed handshake never delivered the
// request (503, never 502, tried on the next candidate), counts as
// tls_handshake against the replica, and is logged with what to check.
func TestTLSToReplicas(t *testing.T) {
	dir := t.TempDir()
	ca, otherCA := testcerts.New(t), testcerts.New(t)
	caFile := ca.File(t, dir)
	ipCert, ipKey := ca.Issue(t, dir, "r0-ip", "127.0.0.1")
	podCert, podKey := ca.Issue(t, dir, "r0-pod", "r0.orders.test")
	clientCert, clientKey := ca.Issue(t, dir, "keyway-proxy", "keyway-proxy")
	strangerCert, strangerKey := otherCA.Issue(t, dir, "stranger", "stranger")
	otherCert, otherKey := otherCA.Issue(t, dir, "r0-other", "127.0.0.1")
	mtls := func(version uint16) func(*tls.Config) {
		return func(c *tls.Config) {
			c.ClientAuth, c.ClientCAs, c.MaxVersion = tls.RequireAndVerifyClientCert, ca.Pool(), version
		}
	}

	cases := map[string]struct {
		cert, key string            // the replica's; "" for a plain-HTTP replica
		server    func(*tls.Config) // adjusts the replica's TLS
		client    tlsconfig.ClientConfig
		sni       string // want, on success
		peer      string // the client certificate's name the replica saw, on success
		hint      string // in the logged error, on failure ("" on success)
	}{
		"CA file, server name from the address": {cert: ipCert, key: ipKey,
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}},
		"server name per replica": {cert: podCert, key: podKey,
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile, ServerName: "{replica}.orders.test"}, sni: "r0.orders.test"},
		"insecure_skip_verify": {cert: otherCert, key: otherKey,
			client: tlsconfig.ClientConfig{Enabled: true, InsecureSkipVerify: true}},
		"mTLS": {cert: ipCert, key: ipKey, server: mtls(0),
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile, CertFile: clientCert, KeyFile: clientKey}, peer: "keyway-proxy"},
		"unknown CA": {cert: otherCert, key: otherKey,
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}, hint: "tls.ca_file"},
		"system roots": {cert: ipCert, key: ipKey,
			client: tlsconfig.ClientConfig{Enabled: true}, hint: "tls.ca_file"},
		"certificate for another name": {cert: podCert, key: podKey,
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}, hint: "tls.server_name"},
		"replica speaks plain HTTP": {
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}, hint: "does not speak TLS"},
		"TLS 1.3 required, replica offers 1.2": {cert: ipCert, key: ipKey, server: func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 },
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile, MinVersion: "1.3"}, hint: "version"},
		"mTLS, no client certificate, TLS 1.3": {cert: ipCert, key: ipKey, server: mtls(tls.VersionTLS13),
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}, hint: "tls.cert_file"},
		"mTLS, no client certificate, TLS 1.2": {cert: ipCert, key: ipKey, server: mtls(tls.VersionTLS12),
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}, hint: "tls.cert_file"},
		"mTLS, client certificate of another CA": {cert: ipCert, key: ipKey, server: mtls(0),
			client: tlsconfig.ClientConfig{Enabled: true, CAFile: caFile, CertFile: strangerCert, KeyFile: strangerKey}, hint: "tls.cert_file"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var rep *testReplica
			var tr *tlsReplica
			if tc.cert == "" {
				rep = startReplica(t, "r0")
			} else {
				cfg := serverTLS(t, tc.cert, tc.key)
				if tc.server != nil {
					tc.server(cfg)
				}
				tr = startTLSReplica(t, "r0", cfg, false)
				rep = tr.testReplica
			}
			log, logs := warnLogs(t)
			obs := &recordingObserver{}
			p, addr := startProxyOpts(t, Options{Logger: log, Observer: obs}, func(c *Config) { c.ReplicaSets[0].TLS = tc.client }, rep)
			r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", "k")
			b := p.Router("orders").Table().Backend(0)
			if tc.hint == "" {
				if r.status != 200 || r.body != "r0" {
					t.Fatalf("POST: %s, want 200 from r0", r)
				}
				states, _ := tr.snapshot()
				if len(states) != 1 {
					t.Fatalf("%d TLS connections, want 1", len(states))
				}
				if got := states[0].ServerName; got != tc.sni {
					t.Errorf("SNI %q, want %q", got, tc.sni)
				}
				var peer string
				if pc := states[0].PeerCertificates; len(pc) > 0 {
					peer = pc[0].Subject.CommonName
				}
				if peer != tc.peer {
					t.Errorf("client certificate %q, want %q", peer, tc.peer)
				}
				insecure := logs.FilterMessage("replica set TLS setting").FilterFieldKey("set").Len()
				if want := map[bool]int{true: 1, false: 0}[tc.client.InsecureSkipVerify]; insecure != want {
					t.Errorf("%d warnings about the set's TLS settings at start, want %d", insecure, want)
				}
				return
			}
			if r.status != 503 || !strings.Contains(r.body, "tls_handshake") || r.header["Retry-After"] == "" {
				t.Fatalf("POST: %s, want 503 with Retry-After naming tls_handshake (never delivered)", r)
			}
			if n := rep.count.Load(); n != 0 {
				t.Errorf("the replica received %d requests", n)
			}
			for k := errKind(0); k < errKinds; k++ {
				if got := b.ctr.upErrs[k].Load(); (k == errTLS) != (got > 0) {
					t.Errorf("%s errors = %d", k, got)
				}
			}
			obs.mu.Lock()
			var connectFailures int
			for _, o := range obs.obs {
				var cf interface{ ConnectFailure() bool }
				if errors.As(o.err, &cf) && cf.ConnectFailure() {
					connectFailures++
				}
			}
			obs.mu.Unlock()
			if connectFailures == 0 {
				t.Error("the observer heard of no connect failure (passive health checks)")
			}
			warned := logs.FilterMessageSnippet("TLS handshake with a replica failed").All()
			if len(warned) != 1 {
				t.Fatalf("%d handshake warnings, want 1", len(warned))
			}
			if msg := warned[0].ContextMap()["error"]; !strings.Contains(msg.(string), tc.hint) {
				t.Errorf("logged error %q does not say to check %s", msg, tc.hint)
			}
		})
	}
}

// A failed handshake is tried on the next candidate, like a refused
// connection: the request is delivered by another replica.
func TestTLSHandshakeFailureGoesToTheNextCandidate(t *testing.T) {
	dir := t.TempDir()
	ca, otherCA := testcerts.New(t), testcerts.New(t)
	good := startTLSReplica(t, "r1", issueServer(t, ca, dir, "r1", "127.0.0.1"), false)
	bad := startTLSReplica(t, "r0", issueServer(t, otherCA, dir, "r0", "127.0.0.1"), false)
	p, addr := startProxy(t, func(c *Config) {
		c.ReplicaSets[0].TLS = tlsconfig.ClientConfig{Enabled: true, CAFile: ca.File(t, dir)}
	}, bad.testReplica, good.testReplica)
	key := keyWithCandidates(t, p, "r0", "r1")
	r := newClient(addr).do(t, "POST", "/ingest", "x", "X-Key", key)
	if r.status != 200 || r.body != "r1" {
		t.Fatalf("POST for r0's key: %s, want 200 from r1", r)
	}
}

// A replica idling out a pooled TLS connection sends close_notify (then
// its FIN). The proxy must see that before it reuses the connection: the
// next request goes on a fresh connection to the same replica (a resumed
// session), with no 502 and nothing counted against the replica — also
// after an idle time longer than timeouts.request, and also when the
// replica sent something else unasked.
func TestTLSIdleConnectionClosedByReplica(t *testing.T) {
	skipWithoutPeek(t)
	dir := t.TempDir()
	ca := testcerts.New(t)
	caFile := ca.File(t, dir)
	certFile, keyFile := ca.Issue(t, dir, "r0", "127.0.0.1")
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for name, tc := range map[string]struct {
			holdFIN bool
			act     func(r *tlsReplica)
		}{
			"close_notify and FIN": {act: (*tlsReplica).closeAll},
			"close_notify, no FIN": {holdFIN: true, act: (*tlsReplica).closeAll},
			"unasked 408": {act: func(r *tlsReplica) {
				r.mu.Lock()
				defer r.mu.Unlock()
				for _, c := range r.conns {
					c.Write([]byte("HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"))
				}
			}},
		} {
			t.Run(tls.VersionName(version)+", "+name, func(t *testing.T) {
				cfg := serverTLS(t, certFile, keyFile)
				cfg.MaxVersion = version
				r0 := startTLSReplica(t, "r0", cfg, tc.holdFIN)
				dl := &dialLog{}
				obs := &recordingObserver{}
				p, addr := startProxyOpts(t, Options{dial: dl.dial, Observer: obs}, func(c *Config) {
					c.ReplicaSets[0].TLS = tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}
				}, r0.testReplica)
				cl := newClient(addr)
				if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 {
					t.Fatalf("first POST: %s", r)
				}
				r0.awaitIdle(t)
				tc.act(r0)
				poll.Until(t, 5*time.Second, "the replica's record to reach the proxy", func() bool {
					for _, c := range dl.all() {
						if _, ok := peerSpoke(c); !ok {
							return false
						}
					}
					return true
				})
				for _, c := range dl.all() {
					if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
						t.Fatal(err)
					}
				}
				if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 || r.body != "r0" {
					t.Fatalf("POST after the replica's %s on the idle connection: %s, want 200 from r0", name, r)
				}
				b := p.Router("orders").Table().Backend(0)
				for k := errKind(0); k < errKinds; k++ {
					want := uint64(0)
					if k == errStale {
						want = 1
					}
					if got := b.ctr.upErrs[k].Load(); got != want {
						t.Errorf("%s = %d, want %d", k, got, want)
					}
				}
				obs.mu.Lock()
				for _, o := range obs.obs {
					if o.err != nil {
						t.Errorf("the observer was told of a failure: %v", o.err)
					}
				}
				obs.mu.Unlock()
				if n := r0.count.Load(); n != 2 {
					t.Errorf("r0 received %d requests, want 2", n)
				}
				states, failed := r0.snapshot()
				if len(states) != 2 || len(failed) != 0 {
					t.Fatalf("%d handshakes, %d failed; want 2, 0", len(states), len(failed))
				}
				if !states[1].DidResume {
					t.Error("the second connection did not resume the first one's session")
				}
			})
		}
	}
}

// Every reload reads the TLS files again: a CA file with new contents at
// the same path renews the set's pools, with the same keys in the file.
// insecure_skip_verify is warned about at start and at every reload.
func TestTLSReloadReadsTheFilesAgain(t *testing.T) {
	dir := t.TempDir()
	ca, otherCA := testcerts.New(t), testcerts.New(t)
	caFile := otherCA.File(t, dir) // not the replica's CA, for now
	r0 := startTLSReplica(t, "r0", issueServer(t, ca, dir, "r0", "127.0.0.1"), false)
	log, logs := warnLogs(t)
	modify := func(c *Config) {
		c.ReplicaSets[0].TLS = tlsconfig.ClientConfig{Enabled: true, CAFile: caFile}
	}
	p, addr := startProxyOpts(t, Options{Logger: log}, modify, r0.testReplica)
	cl := newClient(addr)
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 503 {
		t.Fatalf("POST with the wrong CA: %s, want 503", r)
	}
	cfg := testConfig(r0.testReplica)
	modify(&cfg)
	if info, err := p.Reload(cfg); err != nil || info.Unchanged != 1 {
		t.Fatalf("reload of the same files: %+v, %v; want unchanged", info, err)
	}
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	info, err := p.Reload(cfg)
	if err != nil || !slices.Equal(info.Changed, []string{"orders"}) {
		t.Fatalf("reload after the CA file changed: %+v, %v; want orders changed", info, err)
	}
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 || r.body != "r0" {
		t.Fatalf("POST after the reload: %s, want 200 from r0", r)
	}

	// A file that no longer loads refuses the reload, naming the key.
	if err := os.WriteFile(caFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reload(cfg); err == nil || !strings.Contains(err.Error(), "replica_sets[0].tls.ca_file: ") {
		t.Fatalf("reload with a CA file that does not load: %v", err)
	}
	if r := cl.do(t, "POST", "/ingest", "x", "X-Key", "k"); r.status != 200 {
		t.Fatalf("POST after a refused reload: %s, want 200", r)
	}

	cfg.ReplicaSets[0].TLS = tlsconfig.ClientConfig{Enabled: true, InsecureSkipVerify: true}
	for i := 1; i <= 2; i++ {
		if _, err := p.Reload(cfg); err != nil {
			t.Fatal(err)
		}
		warned := logs.FilterMessage("replica set TLS setting").FilterField(zap.String("set", "orders")).All()
		if len(warned) != i || !strings.Contains(warned[i-1].ContextMap()["warning"].(string), "tls.insecure_skip_verify") {
			t.Fatalf("after reload %d: warnings %v", i, warned)
		}
	}
}

func TestConfigWarnings(t *testing.T) {
	cfg := testConfig(&testReplica{name: "r0", ln: fakeAddrListener("127.0.0.1:9001")})
	if w := cfg.Warnings(); len(w) != 0 {
		t.Fatalf("Warnings = %q", w)
	}
	cfg.ReplicaSets[0].TLS = tlsconfig.ClientConfig{Enabled: true, InsecureSkipVerify: true}
	w := cfg.Warnings()
	if len(w) != 1 || !strings.HasPrefix(w[0], "replica_sets[0].tls.insecure_skip_verify: true") || !strings.Contains(w[0], "orders") {
		t.Fatalf("Warnings = %q", w)
	}
}

// fakeAddrListener is a net.Listener that only has an address.
type fakeAddrListener string

func (fakeAddrListener) Accept() (net.Conn, error) { return nil, errors.New("not a listener") }
func (fakeAddrListener) Close() error              { return nil }
func (l fakeAddrListener) Addr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", string(l))
	return a
}
