package testcerts

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"
)

func TestIssueVerifies(t *testing.T) {
	dir := t.TempDir()
	ca := New(t)
	certFile, keyFile := ca.Issue(t, dir, "server", "a.example", "127.0.0.1")
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		t.Fatal("no leaf parsed")
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "a.example", Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("verify for usage %v: %v", usage, err)
		}
	}
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("IP SAN: %v", err)
	}
	if err := leaf.VerifyHostname("b.example"); err == nil {
		t.Error("certificate verified for a name it does not carry")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: New(t).Pool()}); err == nil {
		t.Error("certificate verified against another CA")
	}

	caFile := ca.File(t, dir)
	data, err := os.ReadFile(caFile)
	if err != nil || !strings.Contains(string(data), "BEGIN CERTIFICATE") {
		t.Fatalf("CA file %s: %v %q", caFile, err, data)
	}
	if other := New(t).File(t, dir); other == caFile {
		t.Errorf("two CAs share the file name %s", caFile)
	}
}

func TestIssueWithExpired(t *testing.T) {
	ca := New(t)
	certFile, keyFile := ca.IssueWith(t, t.TempDir(), "old", Options{
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
	}, "old.example")
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool()}); err == nil {
		t.Error("an expired certificate verified")
	}
}
