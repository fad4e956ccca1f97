package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// TLS mode (-tls): every proxy terminates TLS 1.3 with the same
// certificate, suite and key exchange, and talks plain HTTP to the
// replicas.
//
// The suite and group are what Go picks by default on amd64 with AES-NI
// when the client offers what OpenSSL 3.0 (wrk's library) offers:
// TLS_AES_128_GCM_SHA256 and X25519. HAProxy and nginx are restricted to
// exactly these; keyway and Caddy, being Go, choose them on their own
// (Go's TLS 1.3 suites cannot be configured). A Go client with its
// default curve preferences would get X25519MLKEM768 from the Go servers
// only, so the harness's own Go clients offer X25519 first, as OpenSSL
// does.
const (
	tlsSuite = "TLS_AES_128_GCM_SHA256"
	tlsGroup = "X25519"
)

// tlsFiles is the run's certificate: one self-signed ECDSA P-256
// certificate for 127.0.0.1 and localhost, which every proxy serves and
// every client trusts.
type tlsFiles struct {
	certFile string // PEM certificate
	keyFile  string // PEM PKCS#8 private key
	pemFile  string // certificate followed by key (HAProxy's crt)
	pool     *x509.CertPool
}

// writeCert generates the certificate into dir.
func writeCert(dir string) (*tlsFiles, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "keyway bench"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // its own CA: clients trust it directly
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
	f := &tlsFiles{
		certFile: filepath.Join(dir, "bench-cert.pem"),
		keyFile:  filepath.Join(dir, "bench-key.pem"),
		pemFile:  filepath.Join(dir, "bench-cert-key.pem"),
		pool:     x509.NewCertPool(),
	}
	for path, b := range map[string][]byte{f.certFile: certPEM, f.keyFile: keyPEM, f.pemFile: append(certPEM[:len(certPEM):len(certPEM)], keyPEM...)} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, err
		}
	}
	if !f.pool.AppendCertsFromPEM(certPEM) {
		return nil, errors.New("generated certificate does not parse")
	}
	return f, nil
}

// clientConfig is the TLS configuration of the harness's Go clients
// (vegeta, the probe, the idle connections): TLS 1.3, the run's
// certificate as the only root, X25519 first as OpenSSL 3.0 offers it,
// and no session cache, so every new connection is a full handshake.
func (f *tlsFiles) clientConfig() *tls.Config {
	return &tls.Config{
		RootCAs:          f.pool,
		ServerName:       "localhost",
		MinVersion:       tls.VersionTLS13,
		CurvePreferences: []tls.CurveID{tls.X25519, tls.CurveP256, tls.CurveP384, tls.CurveP521},
	}
}

// tlsProbe is what one target negotiated, checked when its TLS process
// starts: with a Go client offering what the load generator offers and,
// when the openssl command is installed, with OpenSSL itself (wrk's
// library, with its defaults).
type tlsProbe struct {
	Version     string `json:"version"`
	CipherSuite string `json:"cipher_suite"`
	Group       string `json:"group"`
	// Tickets is how many session tickets the server sent on the first
	// connection; Resumed, whether a second connection offering the
	// first's ticket resumed the session. The harness's handshake client
	// keeps no tickets, so its handshakes are full ones either way, but
	// issuing tickets costs the server CPU in every handshake: all targets
	// are configured to send none.
	Tickets int  `json:"tickets"`
	Resumed bool `json:"resumed"`
	// OpenSSL is openssl s_client's "protocol suite group", "" when the
	// command is not installed.
	OpenSSL string `json:"openssl,omitempty"`
}

func (p *tlsProbe) String() string {
	s := fmt.Sprintf("%s %s %s", p.Version, p.CipherSuite, p.Group)
	if p.Resumed {
		s += fmt.Sprintf(", **resumed** (%d ticket(s))", p.Tickets)
	} else {
		s += fmt.Sprintf(", not resumed (%d ticket(s))", p.Tickets)
	}
	if p.OpenSSL != "" {
		s += "; openssl s_client: " + p.OpenSSL
	}
	return s
}

// fair reports why p differs from what every target must negotiate, or
// "" when it does not.
func (p *tlsProbe) fair() string {
	var why []string
	if p.Version != "TLS 1.3" || p.CipherSuite != tlsSuite || p.Group != tlsGroup {
		why = append(why, fmt.Sprintf("negotiated %s %s %s, want TLS 1.3 %s %s", p.Version, p.CipherSuite, p.Group, tlsSuite, tlsGroup))
	}
	if p.OpenSSL != "" && p.OpenSSL != "TLSv1.3 "+tlsSuite+" "+tlsGroup {
		why = append(why, fmt.Sprintf("openssl s_client negotiated %s", p.OpenSSL))
	}
	if p.Tickets > 0 || p.Resumed {
		why = append(why, fmt.Sprintf("sends %d session ticket(s) after each handshake (resumable: %v); the handshake client never resumes, but the handshake figures include issuing them", p.Tickets, p.Resumed))
	}
	return strings.Join(why, "; ")
}

// countingCache is a client session cache that counts the tickets the
// server sends (the client Puts each one).
type countingCache struct {
	tls.ClientSessionCache
	puts atomic.Int32
}

func (c *countingCache) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		c.puts.Add(1)
	}
	c.ClientSessionCache.Put(key, cs)
}

// probeTLS connects twice to addr with a session cache and one keyed GET
// each, and reports what was negotiated and whether the second connection
// resumed the first's session.
func probeTLS(ctx context.Context, addr string, f *tlsFiles) (*tlsProbe, error) {
	cache := &countingCache{ClientSessionCache: tls.NewLRUClientSessionCache(8)}
	conf := f.clientConfig()
	conf.ClientSessionCache = cache
	var p tlsProbe
	for i := range 2 {
		st, err := tlsRequest(ctx, addr, conf)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			p.Version, p.CipherSuite, p.Group = tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite), st.CurveID.String()
			p.Tickets = int(cache.puts.Load())
		} else {
			p.Resumed = st.DidResume
		}
	}
	if _, err := exec.LookPath("openssl"); err == nil {
		s, err := opensslProbe(ctx, addr)
		if err != nil {
			return nil, err
		}
		p.OpenSSL = s
	}
	return &p, nil
}

// tlsRequest sends one keyed GET on a new TLS connection, reads the whole
// answer (session tickets arrive with it) and closes the connection.
func tlsRequest(ctx context.Context, addr string, conf *tls.Config) (tls.ConnectionState, error) {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: conf}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nc, err := d.DialContext(cctx, "tcp", addr)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	c := nc.(*tls.Conn)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET /ingest HTTP/1.1\r\nHost: " + addr + "\r\nX-Key: " + keyName(0) + "\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		return tls.ConnectionState{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	// Read to the end so that tickets sent after the answer are counted.
	_, _ = io.Copy(io.Discard, c)
	return c.ConnectionState(), err
}

// opensslProbe runs openssl s_client against addr with OpenSSL's default
// offer (wrk's) and returns "protocol suite group".
func opensslProbe(ctx context.Context, addr string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, "openssl", "s_client", "-connect", addr, "-servername", "localhost", "-brief")
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	s, perr := parseSClient(string(out))
	if perr != nil {
		return "", fmt.Errorf("openssl s_client: %w (%v): %s", perr, err, tailString(string(out), 400))
	}
	return s, nil
}

// parseSClient extracts "protocol suite group" from openssl s_client
// -brief output.
func parseSClient(out string) (string, error) {
	var proto, suite, group string
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "Protocol version":
			proto = v
		case "Ciphersuite":
			suite = v
		case "Server Temp Key", "Peer Temp Key", "Negotiated TLS1.3 group":
			g, _, _ := strings.Cut(v, ",")
			group = strings.TrimSpace(g)
		}
	}
	if proto == "" || suite == "" || group == "" {
		return "", errors.New("no protocol, ciphersuite or temporary key in the output")
	}
	return proto + " " + suite + " " + group, nil
}
