package admin

import (
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"keyway/internal/testcerts"
)

// tlsAdmin is a stand-in admin listener over TLS that answers the list of
// replica sets (empty).
func tlsAdmin(t *testing.T, cfg *tls.Config) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(AdminHeader, "1")
		w.Write([]byte(`{"replica_sets":[]}`))
	}))
	srv.TLS = cfg
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// The CLI's client reaches an admin listener over TLS, and when it cannot,
// says what to check.
func TestClientOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, otherCA := testcerts.New(t), testcerts.New(t)
	serverCert := func(ca *testcerts.CA, names ...string) tls.Certificate {
		c, k := ca.Issue(t, dir, "admin-"+names[0], names...)
		cert, err := tls.LoadX509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return cert
	}
	good := serverCert(ca, "127.0.0.1")
	cc, ck := ca.Issue(t, dir, "operator", "operator")
	clientCert, err := tls.LoadX509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(plain.Close)

	cases := map[string]struct {
		server *tls.Config // nil: the plain server
		addr   func(u string) string
		client *tls.Config
		want   string // in the error; "" for success
	}{
		"https with the CA": {server: &tls.Config{Certificates: []tls.Certificate{good}},
			client: &tls.Config{RootCAs: ca.Pool()}},
		"host:port with TLS set": {server: &tls.Config{Certificates: []tls.Certificate{good}},
			addr: func(u string) string { return strings.TrimPrefix(u, "https://") }, client: &tls.Config{RootCAs: ca.Pool()}},
		"https without the CA": {server: &tls.Config{Certificates: []tls.Certificate{good}},
			want: "certificate signed by unknown authority: pass --ca-file"},
		"certificate for another name": {server: &tls.Config{Certificates: []tls.Certificate{serverCert(ca, "admin.example")}},
			client: &tls.Config{RootCAs: ca.Pool()}, want: "not issued for the host in --admin"},
		"another CA": {server: &tls.Config{Certificates: []tls.Certificate{serverCert(otherCA, "127.0.0.1")}},
			client: &tls.Config{RootCAs: ca.Pool()}, want: "pass --ca-file"},
		"http to a TLS listener": {server: &tls.Config{Certificates: []tls.Certificate{good}},
			addr: func(u string) string { return "http://" + strings.TrimPrefix(u, "https://") }, want: "uses TLS: use --admin https://"},
		"https to a plain listener": {addr: func(u string) string { return "https://" + strings.TrimPrefix(u, "http://") },
			client: &tls.Config{RootCAs: ca.Pool()}, want: "does not speak TLS: use --admin http://"},
		"mTLS with a client certificate": {server: &tls.Config{Certificates: []tls.Certificate{good}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()},
			client: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{clientCert}}},
		"mTLS without a client certificate": {server: &tls.Config{Certificates: []tls.Certificate{good}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()},
			client: &tls.Config{RootCAs: ca.Pool()}, want: "pass --cert-file and --key-file"},
		"mTLS without a client certificate, TLS 1.2": {server: &tls.Config{Certificates: []tls.Certificate{good}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(), MaxVersion: tls.VersionTLS12},
			client: &tls.Config{RootCAs: ca.Pool()}, want: "pass --cert-file and --key-file"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			u := plain.URL
			if tc.server != nil {
				u = tlsAdmin(t, tc.server).URL
			}
			if tc.addr != nil {
				u = tc.addr(u)
			}
			c := &Client{Addr: u, TLS: tc.client}
			sets, _, err := c.Sets()
			if tc.want == "" {
				if err != nil || len(sets) != 0 {
					t.Fatalf("Sets() = %v, %v", sets, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Sets() error %v, want one saying %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), u) {
				t.Errorf("error %v does not name the address %s", err, u)
			}
		})
	}
}

func TestBaseURLScheme(t *testing.T) {
	for _, tc := range []struct {
		addr string
		tls  bool
		want string
	}{
		{"127.0.0.1:9901", false, "http://127.0.0.1:9901"},
		{"127.0.0.1:9901", true, "https://127.0.0.1:9901"},
		{"http://127.0.0.1:9901/", true, "http://127.0.0.1:9901"},
		{"https://admin.example:9901", false, "https://admin.example:9901"},
	} {
		c := &Client{Addr: tc.addr}
		if tc.tls {
			c.TLS = &tls.Config{}
		}
		if got, err := c.BaseURL(); err != nil || got != tc.want {
			t.Errorf("BaseURL(%q, tls %v) = %q, %v; want %q", tc.addr, tc.tls, got, err, tc.want)
		}
	}
	if _, err := (&Client{Addr: "ftp://x:1"}).BaseURL(); err == nil {
		t.Error("an ftp:// address is accepted")
	}
}
