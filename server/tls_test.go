package server_test

import (
	"crypto/tls"
	"fmt"
	"strings"
	"testing"

	"keyway/internal/testcerts"
)

// A reload re-reads both listeners' TLS files and applies them together:
// a file of either that does not load refuses the whole reload, and
// neither listener changes; turning TLS off is refused.
func TestReloadTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	pCert, pKey := ca.Issue(t, dir, "proxy-1", "orders.example")
	aCert, aKey := ca.Issue(t, dir, "admin-1", "127.0.0.1")
	yml := func(proxyCert, proxyKey, adminCert, adminKey string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
tls: {certificates: [{cert_file: %s, key_file: %s}], watch_interval: 0s}
admin:
  listen: 127.0.0.1:0
  tls: {certificates: [{cert_file: %s, key_file: %s}], watch_interval: 0s}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:1"}]
`, proxyCert, proxyKey, adminCert, adminKey)
	}
	n := startReloadable(t, yml(pCert, pKey, aCert, aKey))
	setFile := n.SetFile
	served := func(addr, sni string) string {
		t.Helper()
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), ServerName: sni})
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	check := func(proxyCN, adminCN string) {
		t.Helper()
		if got := served(n.ProxyAddr(), "orders.example"); got != proxyCN {
			t.Errorf("the proxy serves %q, want %q", got, proxyCN)
		}
		if got := served(n.AdminAddr(), "127.0.0.1"); got != adminCN {
			t.Errorf("the admin listener serves %q, want %q", got, adminCN)
		}
	}
	check("proxy-1", "admin-1")

	// The same paths, renewed certificates: read again.
	ca.Issue(t, dir, "proxy-1", "orders.example")
	if _, err := n.Reload("api"); err != nil {
		t.Fatal(err)
	}
	// New admin files and a broken proxy pair: refused whole.
	_, strayKey := ca.Issue(t, dir, "stray", "orders.example")
	a2Cert, a2Key := ca.Issue(t, dir, "admin-2", "127.0.0.1")
	setFile(yml(pCert, strayKey, a2Cert, a2Key))
	_, err := n.Reload("api")
	if err == nil || !strings.Contains(err.Error(), "proxy.yaml: tls.certificates[0].key_file: "+strayKey+": the private key does not match") {
		t.Fatalf("a broken proxy pair: %v", err)
	}
	check("proxy-1", "admin-1")
	// Fixed: both apply.
	p2Cert, p2Key := ca.Issue(t, dir, "proxy-2", "orders.example")
	setFile(yml(p2Cert, p2Key, a2Cert, a2Key))
	if _, err := n.Reload("api"); err != nil {
		t.Fatal(err)
	}
	check("proxy-2", "admin-2")
	// TLS off on the admin listener: refused.
	setFile(strings.Replace(yml(p2Cert, p2Key, a2Cert, a2Key), "  tls: {certificates: [{cert_file: "+a2Cert+", key_file: "+a2Key+"}], watch_interval: 0s}\n", "", 1))
	if _, err := n.Reload("api"); err == nil || !strings.Contains(err.Error(), "admin.tls.certificates: the listener serves TLS, the file says plain HTTP: turning TLS on or off takes effect only at start") {
		t.Fatalf("admin TLS off: %v", err)
	}
	check("proxy-2", "admin-2")
}
