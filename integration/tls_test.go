package integration

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/testcerts"
)

// xfpReplica is a replica that answers with the X-Forwarded-Proto it got.
func xfpReplica(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "proto=%s", r.Header.Get("X-Forwarded-Proto"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// tlsConfigYAML is a proxy over one replica with TLS on both listeners.
// extra goes into the proxy's tls section.
func tlsConfigYAML(dir, replica, extra string) string {
	return fmt.Sprintf(`listen: "127.0.0.1:0"
tls:
  certificates:
    - {cert_file: %[1]s/orders.crt, key_file: %[1]s/orders.key}
    - {cert_file: %[1]s/events.crt, key_file: %[1]s/events.key}
  watch_interval: 1s
%[3]sadmin:
  listen: "127.0.0.1:0"
  tls:
    certificates: [{cert_file: %[1]s/admin.crt, key_file: %[1]s/admin.key}]
log: {level: info, format: json}
replica_sets:
  - name: orders
    replicas: 1
    static: [{name: r0, addr: %[2]q}]
`, dir, replica, extra)
}

// tlsConn is one client connection speaking HTTP/1.1 over TLS, kept
// alive across requests.
type tlsConn struct {
	c  *tls.Conn
	br *bufio.Reader
}

func dialTLS(addr string, cfg *tls.Config) (*tlsConn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	return &tlsConn{c: c, br: bufio.NewReader(c)}, nil
}

// get sends GET path and returns the status and body; an error if the
// connection failed (e.g. a handshake refused after it seemed done).
func (tc *tlsConn) get(host, path string) (int, string, error) {
	_ = tc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(tc.c, "GET %s HTTP/1.1\r\nHost: %s\r\nX-Key: k1\r\n\r\n", path, host); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(tc.br, nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func (tc *tlsConn) served() (cn, sum string) {
	leaf := tc.c.ConnectionState().PeerCertificates[0]
	s := sha256.Sum256(leaf.Raw)
	return leaf.Subject.CommonName, hex.EncodeToString(s[:])
}

// request opens a connection, sends one request and closes it.
func request(addr string, cfg *tls.Config) (status int, body, cn string, err error) {
	tc, err := dialTLS(addr, cfg)
	if err != nil {
		return 0, "", "", err
	}
	defer tc.c.Close()
	status, body, err = tc.get(cfg.ServerName, "/ingest")
	if err != nil {
		return 0, "", "", err
	}
	cn, _ = tc.served()
	return status, body, cn, nil
}

// adminGet reads an admin endpoint over TLS.
func adminGet(t *testing.T, addr string, cfg *tls.Config, path string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + addr + path)
	if err != nil {
		t.Fatalf("admin %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("admin %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

// metricTLS reads one sample from the admin listener over TLS (-1 if
// absent).
func metricTLS(t *testing.T, addr string, cfg *tls.Config, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(adminGet(t, addr, cfg, "/metrics"), "\n") {
		if strings.HasPrefix(l, series+" ") {
			v, _ := strconv.ParseFloat(l[len(series)+1:], 64)
			return v
		}
	}
	return -1
}

// replaceFile writes data next to path and renames it over path, as
// cert-manager's and most writers' atomic updates do.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestTLS runs keyway with TLS on the proxy and admin listeners: TLS
// clients reach a replica (X-Forwarded-Proto: https), SNI picks the
// certificate, old versions are refused; a certificate replaced on disk
// reaches new connections while an open keep-alive connection keeps
// working; a broken pair on disk is refused and the old certificate
// stays; SIGHUP applies min_version 1.3 and client certificates.
func TestTLS(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	dir := t.TempDir()
	ca, clients := testcerts.New(t), testcerts.New(t)
	ca.Issue(t, dir, "orders", "orders.example")
	ca.Issue(t, dir, "events", "events.example")
	ca.Issue(t, dir, "admin", "127.0.0.1")
	clientCA := clients.File(t, dir)
	cfgFile := WriteFile(t, dir, "proxy.yaml", tlsConfigYAML(dir, xfpReplica(t), ""))
	p := Start(t, "proxy", "proxy", "-c", cfgFile)
	addr := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	admin := p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	adminTLS := &tls.Config{RootCAs: ca.Pool()}
	orders := &tls.Config{RootCAs: ca.Pool(), ServerName: "orders.example"}

	// A TLS client reaches the replica, which is told the request came
	// over TLS.
	status, body, cn, err := request(addr, orders)
	if err != nil || status != 200 || body != "proto=https" || cn != "orders" {
		t.Fatalf("over TLS: %d %q %q %v", status, body, cn, err)
	}
	// SNI picks the certificate; the first is the default.
	if _, _, cn, err := request(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "events.example"}); err != nil || cn != "events" {
		t.Fatalf("SNI events.example: %q %v", cn, err)
	}
	if _, _, cn, err := request(addr, &tls.Config{InsecureSkipVerify: true, ServerName: "unknown.example"}); err != nil || cn != "orders" {
		t.Fatalf("an unknown SNI: %q %v", cn, err)
	}
	// TLS 1.1 is refused (min_version 1.2).
	if _, _, _, err := request(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "orders.example", MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Fatal("a TLS 1.1 client got through")
	}
	// The admin listener over TLS.
	if got := adminGet(t, admin, adminTLS, "/healthz"); got != "ok\n" {
		t.Fatalf("admin /healthz over TLS: %q", got)
	}
	poll.Until(t, 10*time.Second, "the refused handshake counted", func() bool {
		return metricTLS(t, admin, adminTLS, `keyway_tls_handshake_errors_total{listener="proxy"}`) == 1
	})

	// An open keep-alive connection; then the orders certificate is
	// replaced on disk (renamed over, like cert-manager).
	old, err := dialTLS(addr, orders)
	if err != nil {
		t.Fatal(err)
	}
	defer old.c.Close()
	if status, _, err := old.get("orders.example", "/ingest"); err != nil || status != 200 {
		t.Fatalf("keep-alive connection: %d %v", status, err)
	}
	_, firstSum := old.served()
	newCert, newKey := ca.IssuePEM(t, "orders-renewed", testcerts.Options{}, "orders.example")
	replaceFile(t, filepath.Join(dir, "orders.key"), newKey)
	replaceFile(t, filepath.Join(dir, "orders.crt"), newCert)
	poll.Until(t, 15*time.Second, "new connections to get the renewed certificate", func() bool {
		_, _, cn, err := request(addr, orders)
		return err == nil && cn == "orders-renewed"
	})
	if status, body, err := old.get("orders.example", "/ingest"); err != nil || status != 200 || body != "proto=https" {
		t.Fatalf("the old keep-alive connection after the renewal: %d %q %v", status, body, err)
	}
	if _, sum := old.served(); sum != firstSum {
		t.Fatal("the open connection's certificate changed")
	}

	// A broken pair (a key of another certificate) is refused; the renewed
	// certificate stays.
	_, strayKey := ca.IssuePEM(t, "stray", testcerts.Options{}, "orders.example")
	replaceFile(t, filepath.Join(dir, "orders.key"), strayKey)
	poll.Until(t, 15*time.Second, "the broken pair refused", func() bool {
		return metricTLS(t, admin, adminTLS, `keyway_tls_reloads_total{listener="proxy",result="failure"}`) == 1
	})
	if _, _, cn, err := request(addr, orders); err != nil || cn != "orders-renewed" {
		t.Fatalf("after a refused pair: %q %v", cn, err)
	}
	p.WaitLine(t, logField("TLS reload refused: the certificates being served stay", "key"), 5*time.Second)
	var evs struct {
		Events []map[string]any `json:"events"`
	}
	if err := json.Unmarshal([]byte(adminGet(t, admin, adminTLS, "/v1/events?kind=tls_reload")), &evs); err != nil {
		t.Fatal(err)
	}
	if len(evs.Events) != 2 || evs.Events[0]["result"] != "success" || evs.Events[0]["source"] != "watch" ||
		evs.Events[1]["result"] != "failure" || evs.Events[1]["key"] != "tls.certificates[0].key_file" {
		t.Fatalf("tls_reload events: %+v", evs.Events)
	}
	replaceFile(t, filepath.Join(dir, "orders.key"), newKey)

	// SIGHUP: TLS 1.3 only, and client certificates.
	replaceFile(t, cfgFile, []byte(tlsConfigYAML(dir, xfpReplica(t), fmt.Sprintf("  min_version: \"1.3\"\n  client_ca_file: %s\n", clientCA))))
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.WaitLine(t, logField("configuration reloaded", "source"), 10*time.Second)
	pair, err := tls.LoadX509KeyPair(clients.Issue(t, dir, "producer", "producer.example"))
	if err != nil {
		t.Fatal(err)
	}
	withCert := &tls.Config{RootCAs: ca.Pool(), ServerName: "orders.example", Certificates: []tls.Certificate{pair}}
	if status, body, _, err := request(addr, withCert); err != nil || status != 200 || body != "proto=https" {
		t.Fatalf("mTLS with a good certificate: %d %q %v", status, body, err)
	}
	if _, _, _, err := request(addr, orders); err == nil {
		t.Fatal("a client without a certificate got through under mTLS")
	}
	if _, _, _, err := request(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "orders.example", Certificates: []tls.Certificate{pair}, MaxVersion: tls.VersionTLS12}); err == nil {
		t.Fatal("a TLS 1.2 client got through with min_version 1.3")
	}
	// The old connection was opened before all this and still works.
	if status, _, err := old.get("orders.example", "/ingest"); err != nil || status != 200 {
		t.Fatalf("the old keep-alive connection after the reload: %d %v", status, err)
	}
	p.Term(t, 20*time.Second)
}
