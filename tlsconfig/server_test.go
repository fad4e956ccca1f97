package tlsconfig

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"keyway/internal/poll"
	"keyway/internal/testcerts"
)

// events collects a Server's events.
type events struct {
	mu  sync.Mutex
	evs []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
}

func (e *events) all() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.evs...)
}

type fixture struct {
	s   *Server
	reg *prometheus.Registry
	evs *events
}

func newServer(t *testing.T, cfg ServerConfig) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewPedanticRegistry(), evs: &events{}}
	s, err := NewServer(cfg, ServerOptions{Listener: "proxy", Path: "tls", Logger: zaptest.NewLogger(t), Registerer: f.reg, OnEvent: f.evs.add})
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	return f
}

func config(files ...string) ServerConfig {
	c := DefaultServerConfig()
	for i := 0; i+1 < len(files); i += 2 {
		c.Certificates = append(c.Certificates, CertificateConfig{CertFile: files[i], KeyFile: files[i+1]})
	}
	return c
}

// serve accepts TLS connections on 127.0.0.1 through s.Listener: each
// completed handshake is answered with one byte, then closed.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := s.Listener(ln)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if c.(*Conn).Handshake() == nil {
					_, _ = c.Write([]byte("x"))
					return
				}
				// What a server reads after a failed handshake.
				if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
					t.Errorf("read after a failed handshake: %v, want net.ErrClosed", err)
				}
			})
		}
	})
	return ln.Addr().String()
}

// handshake connects, reads the server's byte and returns the connection
// state (the client's view).
func handshake(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return tls.ConnectionState{}, err
	}
	return c.ConnectionState(), nil
}

// served returns the subject of the certificate a client gets for sni.
func served(t *testing.T, addr string, ca *testcerts.CA, sni string) string {
	t.Helper()
	st, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: sni, InsecureSkipVerify: sni == ""})
	if err != nil {
		t.Fatalf("handshake with SNI %q: %v", sni, err)
	}
	return st.PeerCertificates[0].Subject.CommonName
}

func TestSNISelection(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	aCert, aKey := ca.Issue(t, dir, "default", "a.example")
	bCert, bKey := ca.Issue(t, dir, "b", "b.example", "B2.example")
	wCert, wKey := ca.Issue(t, dir, "wild", "*.wild.example")
	f := newServer(t, config(aCert, aKey, bCert, bKey, wCert, wKey))
	addr := serve(t, f.s)
	for sni, want := range map[string]string{
		"a.example":        "default",
		"b.example":        "b",
		"B.EXAMPLE":        "b", // names are case-insensitive
		"b2.example":       "b",
		"x.wild.example":   "wild",
		"wild.example":     "default", // a wildcard covers one label, not none
		"y.x.wild.example": "default", // nor two
		"other.example":    "default",
		"":                 "default", // no SNI (e.g. a client dialing an IP)
	} {
		cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: sni}
		if want == "default" && sni != "a.example" {
			cfg.InsecureSkipVerify = true // the default certificate does not carry the name
		}
		st, err := handshake(addr, cfg)
		if err != nil {
			t.Errorf("SNI %q: %v", sni, err)
			continue
		}
		if got := st.PeerCertificates[0].Subject.CommonName; got != want {
			t.Errorf("SNI %q got the certificate %q, want %q", sni, got, want)
		}
	}
}

// Two certificates for one name (ECDSA and RSA, say): the first the client
// supports wins. testcerts issues ECDSA only, so this checks the order.
func TestSNISameNameFirstWins(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	aCert, aKey := ca.Issue(t, dir, "default", "a.example")
	b1Cert, b1Key := ca.Issue(t, dir, "b1", "b.example")
	b2Cert, b2Key := ca.Issue(t, dir, "b2", "b.example")
	f := newServer(t, config(aCert, aKey, b1Cert, b1Key, b2Cert, b2Key))
	if got := served(t, serve(t, f.s), ca, "b.example"); got != "b1" {
		t.Fatalf("got %q, want b1", got)
	}
}

func TestNewServerErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	aCert, aKey := ca.Issue(t, dir, "a", "a.example")
	bCert, bKey := ca.Issue(t, dir, "b", "b.example")
	noName, noNameKey := ca.Issue(t, dir, "noname")
	garbage := filepath.Join(dir, "garbage.pem")
	os.WriteFile(garbage, []byte("not PEM at all\n"), 0o600)
	missing := filepath.Join(dir, "missing.pem")
	for name, tc := range map[string]struct {
		cfg  ServerConfig
		want []string
	}{
		"key mismatch":         {config(aCert, bKey), []string{"tls.certificates[0].key_file: " + bKey + ": the private key does not match the certificate in tls.certificates[0].cert_file (" + aCert + ")"}},
		"missing cert":         {config(missing, aKey), []string{"tls.certificates[0].cert_file: open " + missing + ": no such file or directory"}},
		"missing key":          {config(aCert, missing), []string{"tls.certificates[0].key_file: open " + missing}},
		"swapped":              {config(aKey, aCert), []string{"tls.certificates[0].cert_file: " + aKey + " holds no PEM certificate", "are cert_file and key_file swapped?"}},
		"not PEM":              {config(garbage, aKey), []string{"tls.certificates[0].cert_file: " + garbage + " holds no PEM certificate"}},
		"no key in key_file":   {config(aCert, garbage), []string{"tls.certificates[0].key_file: " + garbage + ": failed to find any PEM data in key input"}},
		"second without names": {config(aCert, aKey, noName, noNameKey), []string{"tls.certificates[1].cert_file: " + noName + ": the certificate has no DNS names"}},
		"every problem":        {config(aCert, bKey, bCert, aKey), []string{"tls.certificates[0].key_file", "tls.certificates[1].key_file"}},
		"client CA not PEM": {func() ServerConfig { c := config(aCert, aKey); c.ClientCAFile = garbage; return c }(),
			[]string{"tls.client_ca_file: " + garbage + " holds no PEM certificate"}},
		"client CA missing": {func() ServerConfig { c := config(aCert, aKey); c.ClientCAFile = missing; return c }(),
			[]string{"tls.client_ca_file: open " + missing}},
		"invalid":  {func() ServerConfig { c := config(aCert, aKey); c.MinVersion = "1.1"; return c }(), []string{"tls.min_version: \"1.1\" is not a TLS version"}},
		"disabled": {DefaultServerConfig(), []string{"tls.certificates: empty"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewServer(tc.cfg, ServerOptions{Listener: "proxy", Path: "tls"})
			if err == nil {
				t.Fatal("NewServer accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			// CheckFiles (keyway validate) finds the same problems,
			// named within the section.
			if name == "disabled" || name == "invalid" {
				return
			}
			cerr := tc.cfg.CheckFiles("tls")
			if cerr == nil || !strings.Contains(cerr.Error(), tc.want[0]) {
				t.Errorf("CheckFiles: %v, want %q", cerr, tc.want[0])
			}
		})
	}
	// A key file may be the certificate file itself when it holds both.
	both := filepath.Join(dir, "both.pem")
	c, _ := os.ReadFile(aCert)
	k, _ := os.ReadFile(aKey)
	os.WriteFile(both, append(c, k...), 0o600)
	if err := config(both, both).CheckFiles("tls"); err != nil {
		t.Errorf("a combined PEM file: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		modify func(*ServerConfig)
		want   string
	}{
		"default":              {func(*ServerConfig) {}, ""},
		"a certificate":        {func(c *ServerConfig) { *c = config("c.pem", "k.pem") }, ""},
		"1.3":                  {func(c *ServerConfig) { *c = config("c.pem", "k.pem"); c.MinVersion = "1.3" }, ""},
		"watch off":            {func(c *ServerConfig) { c.WatchInterval = 0 }, ""},
		"no key":               {func(c *ServerConfig) { *c = config("c.pem", "") }, "certificates[0].key_file: required"},
		"no cert":              {func(c *ServerConfig) { *c = config("", "k.pem") }, "certificates[0].cert_file: required"},
		"twice":                {func(c *ServerConfig) { *c = config("c.pem", "k.pem", "c.pem", "k.pem") }, "certificates[1].cert_file: \"c.pem\" is already certificates[0]'s"},
		"spaces":               {func(c *ServerConfig) { *c = config("c.pem ", "k.pem") }, "certificates[0].cert_file: \"c.pem \" has leading or trailing white space"},
		"version":              {func(c *ServerConfig) { c.MinVersion = "1.0" }, "min_version: \"1.0\" is not a TLS version keyway accepts"},
		"client CA, no TLS":    {func(c *ServerConfig) { c.ClientCAFile = "ca.pem" }, "client_ca_file: \"ca.pem\" is set but certificates is empty"},
		"watch too often":      {func(c *ServerConfig) { c.WatchInterval = 10 * time.Millisecond }, "watch_interval: must be 0 (do not watch the files) or at least 1s, got 10ms"},
		"watch negative":       {func(c *ServerConfig) { c.WatchInterval = -time.Second }, "watch_interval: must be 0"},
		"empty version is 1.2": {func(c *ServerConfig) { c.MinVersion = "" }, ""},
	} {
		t.Run(name, func(t *testing.T) {
			c := DefaultServerConfig()
			tc.modify(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestMinVersion(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	for _, tc := range []struct {
		min             string
		refused, served uint16
	}{
		{"1.2", tls.VersionTLS11, tls.VersionTLS12},
		{"1.3", tls.VersionTLS12, tls.VersionTLS13},
	} {
		cfg := config(cert, key)
		cfg.MinVersion = tc.min
		f := newServer(t, cfg)
		addr := serve(t, f.s)
		_, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example", MinVersion: tls.VersionTLS10, MaxVersion: tc.refused})
		if err == nil {
			t.Errorf("min_version %s: a client offering at most %s got through", tc.min, tls.VersionName(tc.refused))
		}
		st, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example", MaxVersion: tc.served})
		if err != nil || st.Version != tc.served {
			t.Errorf("min_version %s: a %s client: %v (version %x)", tc.min, tls.VersionName(tc.served), err, st.Version)
		}
		poll.Until(t, 5*time.Second, "the refused handshake counted", func() bool {
			return testutil.ToFloat64(f.s.handshakes) == 1
		})
	}
}

// A client that closes without a hello (a TCP health check) is not a
// failed handshake; a plain-HTTP client is.
func TestHandshakeErrorsCounted(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	f := newServer(t, config(cert, key))
	addr := serve(t, f.s)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	_, _ = io.ReadAll(c) // until the server closes
	c.Close()
	poll.Until(t, 5*time.Second, "one handshake error", func() bool { return testutil.ToFloat64(f.s.handshakes) == 1 })
	if _, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example"}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(f.s.handshakes); n != 1 {
		t.Fatalf("%v handshake errors, want 1", n)
	}
}

func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	clients := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	cfg := config(cert, key)
	cfg.ClientCAFile = clients.File(t, dir)
	f := newServer(t, cfg)
	addr := serve(t, f.s)

	good, err := tls.LoadX509KeyPair(clients.Issue(t, dir, "client", "client.example"))
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := tls.LoadX509KeyPair(ca.Issue(t, dir, "stranger", "stranger.example"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		certs []tls.Certificate
		ok    bool
	}{
		"no certificate":              {nil, false},
		"a certificate of another CA": {[]tls.Certificate{stranger}, false},
		"a good certificate":          {[]tls.Certificate{good}, true},
	} {
		_, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example", Certificates: tc.certs})
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", name, err, tc.ok)
		}
	}
	poll.Until(t, 5*time.Second, "two refused handshakes counted", func() bool { return testutil.ToFloat64(f.s.handshakes) == 2 })
}

// fingerprint of the certificate a client gets.
func fingerprint(t *testing.T, addr string, ca *testcerts.CA) string {
	t.Helper()
	st, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example"})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(st.PeerCertificates[0].Raw)
	return hex.EncodeToString(sum[:])
}

func fileFingerprint(t *testing.T, certFile string) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, strings.TrimSuffix(certFile, ".crt")+".key")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pair.Leaf.Raw)
	return hex.EncodeToString(sum[:])
}

// A rewritten pair is served to new connections after the next check;
// nothing changes when the files did not.
func TestWatchInPlaceRewrite(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	f := newServer(t, config(cert, key))
	addr := serve(t, f.s)
	first := fingerprint(t, addr, ca)
	f.s.check()
	if got := testutil.ToFloat64(f.s.reloads.WithLabelValues("success")); got != 0 || len(f.evs.all()) != 0 {
		t.Fatalf("unchanged files reloaded: %v reloads, events %v", got, f.evs.all())
	}
	ca.Issue(t, dir, "a", "a.example", "new.example")
	f.s.check()
	if got := fingerprint(t, addr, ca); got == first || got != fileFingerprint(t, cert) {
		t.Fatalf("after a rewrite the server serves %s; first %s, file %s", got, first, fileFingerprint(t, cert))
	}
	evs := f.evs.all()
	if len(evs) != 1 || evs[0].Result != "success" || evs[0].Source != "watch" || evs[0].Listener != "proxy" ||
		len(evs[0].Certificates) != 1 || strings.Join(evs[0].Certificates[0].Names, ",") != "a.example,new.example" {
		t.Fatalf("events %+v", evs)
	}
}

// Kubernetes mounts a Secret as a directory of symlinks into a timestamped
// directory through "..data"; an update writes a new timestamped
// directory and renames a new "..data" symlink over the old one.
func TestWatchKubernetesSecretSwap(t *testing.T) {
	mount := t.TempDir()
	ca := testcerts.New(t)
	version := func(name string) {
		d := filepath.Join(mount, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		c, k := ca.Issue(t, d, "tls", "a.example")
		os.Rename(c, filepath.Join(d, "tls.crt"))
		os.Rename(k, filepath.Join(d, "tls.key"))
		tmp := filepath.Join(mount, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_01_01_00_00_00.1")
	for _, n := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", n), filepath.Join(mount, n)); err != nil {
			t.Fatal(err)
		}
	}
	cert, key := filepath.Join(mount, "tls.crt"), filepath.Join(mount, "tls.key")
	f := newServer(t, config(cert, key))
	addr := serve(t, f.s)
	first := fingerprint(t, addr, ca)

	version("..2026_02_01_00_00_00.2")
	os.RemoveAll(filepath.Join(mount, "..2026_01_01_00_00_00.1"))
	f.s.check()
	if got := fingerprint(t, addr, ca); got == first || got != fileFingerprint(t, cert) {
		t.Fatalf("after the swap the server serves %s; first %s, file %s", got, first, fileFingerprint(t, cert))
	}
}

// A bad new certificate is refused once the same bad files are seen
// twice, and the old one stays; a good pair later is served.
func TestWatchBadFilesKeepTheOldCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	f := newServer(t, config(cert, key))
	addr := serve(t, f.s)
	first := fingerprint(t, addr, ca)

	// A key from another pair: the writer is half-way, or wrong.
	_, otherKey := ca.Issue(t, t.TempDir(), "a", "a.example")
	data, _ := os.ReadFile(otherKey)
	os.WriteFile(key, data, 0o600)
	f.s.check()
	if n := testutil.ToFloat64(f.s.reloads.WithLabelValues("failure")); n != 0 || len(f.evs.all()) != 0 {
		t.Fatalf("a first failing reading was reported: %v failures, events %+v", n, f.evs.all())
	}
	f.s.check()
	f.s.check() // reported once only
	if n := testutil.ToFloat64(f.s.reloads.WithLabelValues("failure")); n != 1 {
		t.Fatalf("%v failures counted, want 1", n)
	}
	evs := f.evs.all()
	if len(evs) != 1 || evs[0].Result != "failure" || evs[0].Key != "tls.certificates[0].key_file" || evs[0].File != key ||
		!strings.Contains(evs[0].Error, "does not match") || len(evs[0].Certificates) != 1 || evs[0].Certificates[0].SHA256 != first {
		t.Fatalf("events %+v", evs)
	}
	if got := fingerprint(t, addr, ca); got != first {
		t.Fatal("the old certificate is not served any more")
	}

	// An unreadable certificate: refused too.
	os.Remove(cert)
	f.s.check()
	f.s.check()
	if evs := f.evs.all(); len(evs) != 2 || evs[1].Key != "tls.certificates[0].cert_file" || !strings.Contains(evs[1].Error, "no such file") {
		t.Fatalf("events %+v", evs)
	}

	ca.Issue(t, dir, "a", "a.example")
	f.s.check()
	if got := fingerprint(t, addr, ca); got == first || got != fileFingerprint(t, cert) {
		t.Fatal("a good pair after a bad one is not served")
	}
	if evs := f.evs.all(); len(evs) != 3 || evs[2].Result != "success" {
		t.Fatalf("events %+v", evs)
	}
}

// A pair written one file after the other and caught in between is loaded
// at the next check without a reported failure.
func TestWatchHalfWrittenPair(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	f := newServer(t, config(cert, key))
	newCert, newKey := ca.IssuePEM(t, "a", testcerts.Options{}, "a.example")
	os.WriteFile(cert, newCert, 0o600)
	f.s.check() // the certificate is new, the key still old
	os.WriteFile(key, newKey, 0o600)
	f.s.check()
	if evs := f.evs.all(); len(evs) != 1 || evs[0].Result != "success" {
		t.Fatalf("events %+v", evs)
	}
	if n := testutil.ToFloat64(f.s.reloads.WithLabelValues("failure")); n != 0 {
		t.Fatalf("%v failures", n)
	}
}

// Reload re-reads unchanged paths, may change paths and the other keys,
// and refuses a bad pair or an expired certificate in place of a valid one.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	clients := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	f := newServer(t, config(cert, key))
	addr := serve(t, f.s)
	first := fingerprint(t, addr, ca)

	// Same paths, new contents (watching off): a reload reads them.
	cfg := config(cert, key)
	cfg.WatchInterval = 0
	ca.Issue(t, dir, "a", "a.example")
	if err := f.s.Reload(cfg, "SIGHUP"); err != nil {
		t.Fatal(err)
	}
	second := fingerprint(t, addr, ca)
	if second == first {
		t.Fatal("a reload did not re-read the files")
	}
	if evs := f.evs.all(); len(evs) != 1 || evs[0].Source != "SIGHUP" || evs[0].Result != "success" {
		t.Fatalf("events %+v", evs)
	}
	// Nothing changed: counted, not reported.
	if err := f.s.Reload(cfg, "api"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(f.s.reloads.WithLabelValues("success")); n != 2 || len(f.evs.all()) != 1 {
		t.Fatalf("%v successes, events %+v", n, f.evs.all())
	}

	// Bad pair: refused at once, the old certificate stays.
	_, otherKey := ca.Issue(t, dir, "other", "a.example")
	if err := f.s.Reload(config(cert, otherKey), "api"); err == nil || !strings.Contains(err.Error(), "tls.certificates[0].key_file") {
		t.Fatalf("a mismatched key: %v", err)
	}
	// An expired certificate in place of a valid one: refused.
	old, oldKey := ca.IssueWith(t, dir, "old", testcerts.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}, "a.example")
	err := f.s.Reload(config(old, oldKey), "api")
	if err == nil || !strings.Contains(err.Error(), "tls.certificates[0].cert_file: "+old+": the certificate expired at") {
		t.Fatalf("an expired certificate: %v", err)
	}
	if got := fingerprint(t, addr, ca); got != second {
		t.Fatal("a refused reload changed the certificate")
	}
	if n := testutil.ToFloat64(f.s.reloads.WithLabelValues("failure")); n != 2 {
		t.Fatalf("%v failures", n)
	}
	if evs := f.evs.all(); len(evs) != 3 || evs[2].Result != "failure" || evs[2].Key != "tls.certificates[0].cert_file" {
		t.Fatalf("events %+v", evs)
	}

	// New paths, 1.3 and client certificates.
	newCert, newKey := ca.Issue(t, dir, "n", "a.example")
	cfg = config(newCert, newKey)
	cfg.MinVersion = "1.3"
	cfg.ClientCAFile = clients.File(t, dir)
	if err := f.s.Reload(cfg, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example"}); err == nil {
		t.Fatal("a client without a certificate got through after client_ca_file was set")
	}
	pair, _ := tls.LoadX509KeyPair(clients.Issue(t, dir, "client", "c.example"))
	st, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example", Certificates: []tls.Certificate{pair}})
	if err != nil || st.Version != tls.VersionTLS13 || st.PeerCertificates[0].Subject.CommonName != "n" {
		t.Fatalf("after the reload: %v %+v", err, st.PeerCertificates)
	}
	if f.s.Config().ClientCAFile == "" {
		t.Fatal("Config does not return the reloaded configuration")
	}
	// Turning TLS off is refused.
	if err := f.s.Reload(DefaultServerConfig(), "api"); err == nil || !strings.Contains(err.Error(), "takes effect only at start") {
		t.Fatalf("TLS off at reload: %v", err)
	}
}

// A listener may start with an expired certificate (a warning), and then
// take another expired one.
func TestStartExpired(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	expired := testcerts.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}
	cert, key := ca.IssueWith(t, dir, "a", expired, "a.example")
	f := newServer(t, config(cert, key))
	cert2, key2 := ca.IssueWith(t, dir, "b", expired, "a.example")
	if err := f.s.Reload(config(cert2, key2), "api"); err != nil {
		t.Fatal(err)
	}
}

// An open connection keeps working across a reload; a new one gets the
// new certificate.
func TestReloadKeepsOpenConnections(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	f := newServer(t, config(cert, key))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := f.s.Listener(ln)
	var wg sync.WaitGroup
	defer func() { ln.Close(); wg.Wait() }() // after the clients' Close
	wg.Go(func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); _, _ = io.Copy(c, c) }) // echo
		}
	})
	old, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example"})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	echo := func(c *tls.Conn, msg string) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, len(msg))
		if _, err := io.ReadFull(c, b); err != nil || string(b) != msg {
			t.Fatalf("echo %q: %q %v", msg, b, err)
		}
	}
	echo(old, "before")
	newCert, newKey := ca.Issue(t, dir, "b", "a.example")
	if err := f.s.Reload(config(newCert, newKey), "api"); err != nil {
		t.Fatal(err)
	}
	echo(old, "after")
	if got := old.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "a" {
		t.Fatalf("the open connection's certificate is %q", got)
	}
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(c, "new")
	if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "b" {
		t.Fatalf("a new connection got %q, want b", got)
	}
}

// Run checks the files every watch_interval.
func TestRunWatches(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	cfg := config(cert, key)
	cfg.WatchInterval = MinWatchInterval
	f := newServer(t, cfg)
	addr := serve(t, f.s)
	first := fingerprint(t, addr, ca)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.s.Run(ctx) }()
	ca.Issue(t, dir, "a", "a.example")
	poll.Until(t, 10*time.Second, "the rewritten certificate served", func() bool { return fingerprint(t, addr, ca) != first })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestMetrics(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	aCert, aKey := ca.Issue(t, dir, "a", "a.example")
	bCert, bKey := ca.Issue(t, dir, "b", "b.example")
	reg := prometheus.NewPedanticRegistry()
	s, err := NewServer(config(aCert, aKey, bCert, bKey), ServerOptions{Listener: "proxy", Path: "tls", Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	// A second listener on the same registry.
	if _, err := NewServer(config(aCert, aKey), ServerOptions{Listener: "admin", Path: "admin.tls", Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(config(bCert, bKey), "api"); err != nil {
		t.Fatal(err)
	}
	_ = s.Reload(config(aCert, bKey), "api")
	exp := func(f string) string {
		pair, _ := tls.LoadX509KeyPair(f, strings.TrimSuffix(f, ".crt")+".key")
		return strconv.FormatInt(pair.Leaf.NotAfter.Unix(), 10) // GatherAndCompare parses both sides
	}
	want := `# HELP keyway_tls_certificate_expiry_timestamp_seconds When each certificate the listener serves expires (Unix time), by the certificate's name (its first DNS name; the earliest expiry when two certificates share it).
# TYPE keyway_tls_certificate_expiry_timestamp_seconds gauge
keyway_tls_certificate_expiry_timestamp_seconds{listener="admin",name="a.example"} ` + exp(aCert) + `
keyway_tls_certificate_expiry_timestamp_seconds{listener="proxy",name="b.example"} ` + exp(bCert) + `
# HELP keyway_tls_handshake_errors_total TLS handshakes that failed on the listener: an unsupported version, a missing or untrusted client certificate, a client that does not speak TLS, a timeout. A client that closes before its hello is not counted.
# TYPE keyway_tls_handshake_errors_total counter
keyway_tls_handshake_errors_total{listener="admin"} 0
keyway_tls_handshake_errors_total{listener="proxy"} 0
# HELP keyway_tls_reloads_total Loads of the listener's TLS files after start (a configuration reload, or a change the watcher saw), by result: success (served from then on) or failure (refused; the certificates being served stay).
# TYPE keyway_tls_reloads_total counter
keyway_tls_reloads_total{listener="admin",result="failure"} 0
keyway_tls_reloads_total{listener="admin",result="success"} 0
keyway_tls_reloads_total{listener="proxy",result="failure"} 1
keyway_tls_reloads_total{listener="proxy",result="success"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if probs, err := testutil.GatherAndLint(reg); err != nil || len(probs) > 0 {
		t.Fatalf("lint: %v %v", err, probs)
	}
}
