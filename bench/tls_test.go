package main

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/cpu"
)

// tlsServer serves 200 "ok" over TLS with the harness's certificate; it
// counts handshakes and resumed ones.
type tlsServer struct {
	*httptest.Server
	handshakes, resumed atomic.Int64
}

func startTLSServer(t *testing.T, f *tlsFiles, ticketsOff bool) *tlsServer {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s := &tlsServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	}))
	s.TLS = &tls.Config{
		Certificates:           []tls.Certificate{cert},
		SessionTicketsDisabled: ticketsOff,
		VerifyConnection: func(cs tls.ConnectionState) error {
			s.handshakes.Add(1)
			if cs.DidResume {
				s.resumed.Add(1)
			}
			return nil
		},
	}
	// Connections cut off at the end of a run fail their handshake.
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func (s *tlsServer) addr() string { return strings.TrimPrefix(s.URL, "https://") }

// TestGoTLSDefaults shows what Go negotiates by default, which is what
// HAProxy and nginx are configured to: TLS 1.3 with TLS_AES_128_GCM_SHA256
// on a CPU with AES-GCM hardware; X25519MLKEM768 between Go's defaults, and
// X25519 when the client offers what OpenSSL 3.0 offers (the harness's
// clients, wrk).
func TestGoTLSDefaults(t *testing.T) {
	f, err := writeCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := startTLSServer(t, f, false)
	def := &tls.Config{RootCAs: f.pool, ServerName: "localhost"}
	for _, c := range []struct {
		name      string
		conf      *tls.Config
		wantGroup tls.CurveID
	}{
		{"Go defaults", def, tls.X25519MLKEM768},
		{"harness client", f.clientConfig(), tls.X25519},
	} {
		st, err := tlsRequest(context.Background(), s.addr(), c.conf)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: %s %s %s, resumed %v", c.name, tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite), st.CurveID, st.DidResume)
		if st.Version != tls.VersionTLS13 {
			t.Errorf("%s: version %s, want TLS 1.3", c.name, tls.VersionName(st.Version))
		}
		if st.CurveID != c.wantGroup {
			t.Errorf("%s: group %s, want %s", c.name, st.CurveID, c.wantGroup)
		}
		if cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ && tls.CipherSuiteName(st.CipherSuite) != tlsSuite {
			t.Errorf("%s: suite %s, want %s on a CPU with AES-GCM hardware", c.name, tls.CipherSuiteName(st.CipherSuite), tlsSuite)
		}
	}
}

// TestProbeTLS checks that the probe sees session tickets and resumption
// when the server offers them, and neither when it does not.
func TestProbeTLS(t *testing.T) {
	f, err := writeCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, ticketsOff := range []bool{false, true} {
		s := startTLSServer(t, f, ticketsOff)
		p, err := probeTLS(context.Background(), s.addr(), f)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("tickets off %v: %s", ticketsOff, p)
		if p.Version != "TLS 1.3" || p.Group != tlsGroup {
			t.Errorf("probe = %+v, want TLS 1.3 with %s", p, tlsGroup)
		}
		if ticketsOff {
			if p.Resumed || p.Tickets != 0 {
				t.Errorf("tickets off: probe = %+v, want no ticket and no resumption", p)
			}
			if cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ && p.fair() != "" {
				t.Errorf("tickets off: fair() = %q, want \"\"", p.fair())
			}
		} else {
			if !p.Resumed || p.Tickets < 1 {
				t.Errorf("tickets on: probe = %+v, want a ticket and a resumption", p)
			}
			if !strings.Contains(p.fair(), "session ticket") {
				t.Errorf("tickets on: fair() = %q, want it to name the tickets", p.fair())
			}
		}
	}
}

// TestRunNewConns checks the new-connection client: answers counted,
// one full handshake per request even when the server offers tickets.
func TestRunNewConns(t *testing.T) {
	f, err := writeCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := startTLSServer(t, f, false)
	cfg := &Config{Keys: 50, Body: 100, Connections: 4}
	r, err := runNewConns(context.Background(), s.addr(), cfg, loadSpec{tls: f, newConn: true}, 300*time.Millisecond, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests == 0 || r.Errors != 0 {
		t.Fatalf("run = %+v, want requests and no errors", r)
	}
	// Connections cut off at the end of the run handshook without being
	// counted as requests.
	if hs := s.handshakes.Load(); hs < r.Requests || hs > r.Requests+int64(cfg.Connections) {
		t.Errorf("%d handshakes for %d requests on %d connections", hs, r.Requests, cfg.Connections)
	}
	if n := s.resumed.Load(); n != 0 {
		t.Errorf("%d handshakes resumed a session, want none", n)
	}
}

func TestParseSClient(t *testing.T) {
	out := "depth=0 CN = keyway bench\nverify error:num=18:self-signed certificate\nCONNECTION ESTABLISHED\n" +
		"Protocol version: TLSv1.3\nCiphersuite: TLS_AES_128_GCM_SHA256\nPeer certificate: CN = keyway bench\n" +
		"Hash used: SHA256\nSignature type: ECDSA\nServer Temp Key: X25519, 253 bits\nDONE\n"
	got, err := parseSClient(out)
	if err != nil || got != "TLSv1.3 TLS_AES_128_GCM_SHA256 X25519" {
		t.Errorf("parseSClient = %q, %v", got, err)
	}
	// OpenSSL 3.2 and later name the group differently.
	if got, err := parseSClient(strings.Replace(out, "Server Temp Key: X25519, 253 bits", "Negotiated TLS1.3 group: X25519", 1)); err != nil || got != "TLSv1.3 TLS_AES_128_GCM_SHA256 X25519" {
		t.Errorf("parseSClient (3.2) = %q, %v", got, err)
	}
	if _, err := parseSClient("connect:errno=111\n"); err == nil {
		t.Error("parseSClient of a failed connection: no error")
	}
}

func TestErrSummary(t *testing.T) {
	got := errSummary(map[string]int{"dial: connection refused": 3, "read: connection reset by peer": 7, "EOF": 1, "x": 1})
	want := "7× read: connection reset by peer; 3× dial: connection refused; 1× EOF; 1 other kinds"
	if got != want {
		t.Errorf("errSummary = %q, want %q", got, want)
	}
}

// TestTLSSummaryAndRatios checks the TLS summary (medians, same-round
// TLS ÷ plain and TLS − plain, flagged probes), its table and the
// per-round keyway ÷ other ratios.
func TestTLSSummaryAndRatios(t *testing.T) {
	tp := func(rps, cpuUS float64, errs int64) *throughputRun {
		return &throughputRun{RPS: rps, CPUPerReqUS: cpuUS, RPSPerCore: 1e6 / cpuUS, CPUUtil: 0.9, Errors: errs}
	}
	fair := &tlsProbe{Version: "TLS 1.3", CipherSuite: tlsSuite, Group: tlsGroup}
	resumed := &tlsProbe{Version: "TLS 1.3", CipherSuite: tlsSuite, Group: tlsGroup, Tickets: 1, Resumed: true}
	rep := &Report{Config: Config{Rounds: 2, TLS: true, Connections: 64, Duration: time.Second, IdleConns: 100}}
	rep.Runs = []TargetRun{
		{Round: 1, Target: "keyway", Throughput: tp(1000, 50, 0), NewConn: tp(500, 100, 0),
			TLS: &tlsTargetRun{Probe: resumed, Throughput: tp(900, 60, 0), NewConn: tp(200, 400, 1), Idle: &idleRun{BytesPerConn: 30000}}},
		{Round: 1, Target: "haproxy", Throughput: tp(1000, 40, 0), NewConn: tp(500, 80, 0),
			TLS: &tlsTargetRun{Probe: fair, Throughput: tp(900, 50, 0), NewConn: tp(200, 300, 0), Idle: &idleRun{BytesPerConn: 10000}}},
		{Round: 2, Target: "keyway", Throughput: tp(1000, 50, 0), NewConn: tp(500, 100, 0),
			TLS: &tlsTargetRun{Probe: fair, Throughput: tp(900, 70, 2), NewConn: tp(200, 500, 0), Idle: &idleRun{BytesPerConn: 30000}}},
		{Round: 2, Target: "haproxy", Throughput: tp(1000, 50, 0), NewConn: tp(500, 100, 0),
			TLS: &tlsTargetRun{Probe: fair, Throughput: tp(900, 50, 0), NewConn: tp(200, 500, 0), Idle: &idleRun{BytesPerConn: 10000}}},
	}
	rep.summarise()
	var kw *TLSSummary
	for _, s := range rep.Summary {
		if s.Target == "keyway" {
			kw = s.TLS
		}
	}
	if kw == nil {
		t.Fatal("no TLS summary for keyway")
	}
	if kw.CPUPerReqUS.Median != 65 || kw.CPUOverPlain.Min != 1.2 || kw.CPUOverPlain.Max != 1.4 {
		t.Errorf("keyway TLS CPU/req %+v, TLS ÷ plain %+v; want median 65, ratios 1.2 and 1.4", kw.CPUPerReqUS, kw.CPUOverPlain)
	}
	if kw.HandshakeCPUUS.Median != 450 || kw.HandshakeOverConnUS.Median != 350 || kw.ConnCPUUS.Median != 100 {
		t.Errorf("keyway µs/handshake %+v, over plain %+v, plain µs/conn %+v; want 450, 350, 100", kw.HandshakeCPUUS, kw.HandshakeOverConnUS, kw.ConnCPUUS)
	}
	if kw.Errors != 2 || kw.HandshakeErrors != 1 || kw.IdleBytes.Median != 30000 {
		t.Errorf("keyway errors %d, handshake errors %d, idle %+v", kw.Errors, kw.HandshakeErrors, kw.IdleBytes)
	}
	if len(kw.Unfair) != 1 || !strings.HasPrefix(kw.Unfair[0], "round 1:") {
		t.Errorf("keyway unfair = %q, want round 1's resumption", kw.Unfair)
	}

	ratio := func(metric string) *Stat {
		for _, r := range rep.Ratios {
			if r.Metric == metric {
				return r.Vs["haproxy"]
			}
		}
		t.Fatalf("no ratio row %q", metric)
		return nil
	}
	if s := ratio("proxy CPU µs per TLS handshake (new connection per request)"); s.Min != 1 || s.Max != 400.0/300 {
		t.Errorf("handshake CPU ratio = %+v, want 1 and 1.33 (per round)", s)
	}
	if s := ratio("TLS keep-alive: proxy CPU µs per request"); math.Abs(s.Median-1.3) > 1e-9 {
		t.Errorf("TLS CPU/req ratio = %+v, want median 1.3 (1.2 and 1.4)", s)
	}
	if s := ratio("bytes per idle keep-alive TLS connection"); s.Median != 3 {
		t.Errorf("idle TLS ratio = %+v, want 3", s)
	}

	md := rep.Markdown()
	for _, want := range []string{
		"### TLS: the cost of terminating TLS 1.3",
		"| keyway | 50.0 (50.0–50.0) | 65.0 (60.0–70.0) | 1.30 (1.20–1.40) | 900 (900–900) |",
		"| keyway | 500 (500–500) | 100.0 (100.0–100.0) | 200 (200–200) | 0.90 (0.90–0.90) | 2250 (2000–2500) | 450.0 (400.0–500.0) | 350.0 (300.0–400.0) | 0 · **1 (flagged)** |",
		"| keyway | — | 30000 (30000–30000) |",
		"**differs from the others**, round 1: sends 1 session ticket(s) after each handshake (resumable: true)",
		"| TLS handshakes per proxy CPU-second | higher |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
