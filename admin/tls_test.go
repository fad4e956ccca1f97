package admin

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"keyway/internal/testcerts"
	"keyway/tlsconfig"
)

// The admin listener over TLS, with client certificates: a client with a
// good certificate reads /healthz and /metrics; one without is refused; a
// reload serves new certificates to new connections.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, clients := testcerts.New(t), testcerts.New(t)
	cert, key := ca.Issue(t, dir, "admin", "admin.example", "127.0.0.1")
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.TLS.Certificates = []tlsconfig.CertificateConfig{{CertFile: cert, KeyFile: key}}
	cfg.TLS.ClientCAFile = clients.File(t, dir)
	reg := prometheus.NewPedanticRegistry()
	var events []tlsconfig.Event
	s, err := New(cfg, Options{Gatherer: reg, Registerer: reg, Logger: zaptest.NewLogger(t), TLSEvents: func(e tlsconfig.Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	pair, err := tls.LoadX509KeyPair(clients.Issue(t, dir, "operator", "operator.example"))
	if err != nil {
		t.Fatal(err)
	}
	get := func(c *tls.Config, path string) (int, string, *tls.ConnectionState, error) {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
		defer hc.CloseIdleConnections()
		resp, err := hc.Get("https://" + s.Addr().String() + path)
		if err != nil {
			return 0, "", nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.TLS, nil
	}
	good := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}}
	if code, body, _, err := get(good, "/healthz"); err != nil || code != 200 || body != "ok\n" {
		t.Fatalf("/healthz over TLS: %d %q %v", code, body, err)
	}
	if code, body, _, err := get(good, "/metrics"); err != nil || code != 200 ||
		!strings.Contains(body, `keyway_tls_certificate_expiry_timestamp_seconds{listener="admin",name="admin.example"}`) {
		t.Fatalf("/metrics over TLS: %d %v\n%s", code, err, body)
	}
	if _, _, _, err := get(&tls.Config{RootCAs: ca.Pool()}, "/healthz"); err == nil {
		t.Fatal("a client without a certificate got through")
	}
	if resp, err := http.Get("http://" + s.Addr().String() + "/healthz"); err == nil && resp.StatusCode == 200 {
		t.Fatal("plain HTTP got /healthz from the TLS listener")
	}

	newCert, newKey := ca.Issue(t, dir, "admin2", "admin.example", "127.0.0.1")
	next := cfg.TLS
	next.Certificates = []tlsconfig.CertificateConfig{{CertFile: newCert, KeyFile: newKey}}
	if err := s.TLS().Reload(next, "api"); err != nil {
		t.Fatal(err)
	}
	if _, _, st, err := get(good, "/healthz"); err != nil || st.PeerCertificates[0].Subject.CommonName != "admin2" {
		t.Fatalf("after the reload: %v", err)
	}
	if len(events) != 1 || events[0].Listener != "admin" || events[0].Result != "success" {
		t.Fatalf("events %+v", events)
	}
}

func TestValidateTLS(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TLS.Certificates = []tlsconfig.CertificateConfig{{CertFile: "c.pem"}}
	cfg.TLS.MinVersion = "1.0"
	err := cfg.Validate()
	for _, want := range []string{"tls.certificates[0].key_file: required", "tls.min_version: "} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
}
