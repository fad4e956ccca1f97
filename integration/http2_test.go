package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/internal/poll"
)

// keyway serves HTTP/1.1 only (fasthttp has no HTTP/2; see docs/proxy.md).
// The setup that works: an HTTP/2 terminator in front, speaking HTTP/1.1
// with keep-alive to keyway. These tests run that setup with real HTTP/2
// clients: every stream reaches the key's replica, concurrently over one
// connection.

// selfSigned writes a certificate and key for 127.0.0.1/localhost into dir.
func selfSigned(t testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// h2Proxy is a keyway proxy over three demo replicas.
func h2Keyway(t *testing.T) (addr string) {
	t.Helper()
	var static strings.Builder
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		_, raddr := StartReplicaProcess(t, name)
		fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", name, raddr)
	}
	cfg := WriteFile(t, t.TempDir(), "k.yaml", `listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
replica_sets:
  - name: orders
    replicas: 3
    static:
`+static.String())
	p := Start(t, "keyway", "proxy", "-c", cfg)
	return p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
}

// sendH2 sends n keyed requests from 8 goroutines over one HTTP/2 client
// and returns the replica each key reached; every answer must be HTTP/2
// and 200.
func sendH2(t *testing.T, c *http.Client, base string, n int) map[string]string {
	t.Helper()
	var mu sync.Mutex
	owners := map[string]string{}
	var wg sync.WaitGroup
	var firstErr error
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				key := fmt.Sprintf("order-%05d", i)
				req, _ := http.NewRequest("POST", base+"/ingest", strings.NewReader("payload"))
				req.Header.Set("X-Key", key)
				resp, err := c.Do(req)
				if err == nil && (resp.ProtoMajor != 2 || resp.StatusCode != 200) {
					err = fmt.Errorf("key %s: %s %d", key, resp.Proto, resp.StatusCode)
				}
				var a Answer
				if err == nil {
					err = json.NewDecoder(resp.Body).Decode(&a)
					resp.Body.Close()
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				owners[key] = a.Replica
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	return owners
}

// An HTTP/2 terminator written with Go's net/http (TLS, ALPN h2) in front
// of keyway: HTTP/2 clients reach every key's replica, as HTTP/1.1 clients
// do through keyway directly.
func TestHTTP2TerminatorInFront(t *testing.T) {
	skipShort(t)
	kw := h2Keyway(t)
	target, _ := url.Parse("http://" + kw)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rp}
	go func() { _ = srv.ServeTLS(ln, certFile, keyFile) }()
	t.Cleanup(func() { _ = srv.Close() })

	h2 := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	owners := sendH2(t, h2, "https://"+ln.Addr().String(), 300)
	direct := NewClient().Owners(t, kw, Keys(300), 4)
	for k, rep := range direct {
		if owners[k] != rep {
			t.Fatalf("key %s: %s over HTTP/2, %s over HTTP/1.1", k, owners[k], rep)
		}
	}
}

// The same with HAProxy as the HTTP/2 terminator (the configuration
// docs/proxy.md shows), when HAProxy is installed.
func TestHTTP2HAProxyInFront(t *testing.T) {
	skipShort(t)
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed (apt-get install -y haproxy); TestHTTP2TerminatorInFront covers the setup")
	}
	kw := h2Keyway(t)
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	pemFile := filepath.Join(dir, "haproxy.pem")
	c, _ := os.ReadFile(certFile)
	k, _ := os.ReadFile(keyFile)
	if err := os.WriteFile(pemFile, append(c, k...), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freeAddr(t)
	cfg := WriteFile(t, dir, "haproxy.cfg", fmt.Sprintf(`global
  maxconn 1000
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend h2
  bind %s ssl crt %s alpn h2,http/1.1
  default_backend keyway
backend keyway
  http-reuse always
  server keyway %s
`, port, pemFile, kw))
	cmd := exec.Command(haproxy, "-f", cfg, "-db")
	out := &syncBuf{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	h2 := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	poll.Until(t, 10*time.Second, "haproxy listening", func() bool {
		resp, err := h2.Get("https://" + port + "/ingest")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err == nil
	})
	owners := sendH2(t, h2, "https://"+port, 300)
	direct := NewClient().Owners(t, kw, Keys(300), 4)
	for k, rep := range direct {
		if owners[k] != rep {
			t.Fatalf("key %s: %s through haproxy over HTTP/2, %s direct; haproxy said:\n%s", k, owners[k], rep, out.String())
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
