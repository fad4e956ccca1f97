package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// keyway certs writes what the examples name: once it ran in a fresh
// directory, examples/full.yaml and examples/tls.yaml validate as shipped
// from there.
func TestCertsMakeTheExamplesValidate(t *testing.T) {
	examples := []string{"../../examples/full.yaml", "../../examples/tls.yaml"}
	for i, f := range examples {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		examples[i] = abs
		// Each says, first, how to make its files.
		b, err := os.ReadFile(abs)
		if err != nil {
			t.Fatal(err)
		}
		if first, _, _ := strings.Cut(string(b), "\n"); !strings.Contains(first, "keyway certs --out tls") {
			t.Errorf("%s begins %q, not with how to make its TLS files", f, first)
		}
	}
	dir := t.TempDir()
	t.Chdir(dir)
	for _, f := range examples {
		if _, _, err := keywayCLI(t, "validate", "-c", f); err == nil || !strings.Contains(err.Error(), "open tls/") {
			t.Fatalf("validate %s without its files: %v", f, err)
		}
	}
	out, _, err := keywayCLI(t, "certs", "--out", "tls")
	if err != nil {
		t.Fatalf("keyway certs --out tls: %v", err)
	}
	t.Logf("keyway certs --out tls:\n%s", out)
	for _, f := range examples {
		if out, _, err := keywayCLI(t, "validate", "-c", f); err != nil || !strings.HasPrefix(out, "ok: ") {
			t.Errorf("validate %s after keyway certs: %q %v", f, out, err)
		}
	}
}

// The certificates: ECDSA P-256, for this machine's names, valid now and
// for about 90 days, signed by ca.crt; the admin listener's asks for and
// accepts client.crt. Files are 0600; existing ones are kept unless
// --force.
func TestCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if _, _, err := keywayCLI(t, "certs", "--out", dir); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if ca, cca := read("ca.crt"), read("clients-ca.crt"); !bytes.Equal(ca, cca) {
		t.Error("clients-ca.crt is not ca.crt")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(read("ca.crt")) {
		t.Fatal("ca.crt holds no certificate")
	}
	for _, c := range []struct {
		name  string
		names []string
		usage x509.ExtKeyUsage
	}{
		{"tls", []string{"localhost", "127.0.0.1", "::1", "orders.example.com", "x.orders.example.com"}, x509.ExtKeyUsageServerAuth},
		{"events", []string{"events.example.com"}, x509.ExtKeyUsageServerAuth},
		{"admin", []string{"localhost", "127.0.0.1", "::1"}, x509.ExtKeyUsageServerAuth},
		{"client", nil, x509.ExtKeyUsageClientAuth},
	} {
		pair, err := tls.X509KeyPair(read(c.name+".crt"), read(c.name+".key"))
		if err != nil {
			t.Fatalf("%s.crt and %s.key: %v", c.name, c.name, err)
		}
		cert := pair.Leaf
		if k, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
			t.Errorf("%s.crt: key %T, want ECDSA P-256", c.name, cert.PublicKey)
		}
		if d := time.Until(cert.NotAfter); d < 89*24*time.Hour || d > 91*24*time.Hour || time.Now().Before(cert.NotBefore) {
			t.Errorf("%s.crt: valid %s to %s, want from now for 90 days", c.name, cert.NotBefore, cert.NotAfter)
		}
		for _, n := range c.names {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: n, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
				t.Errorf("%s.crt for %s: %v", c.name, n, err)
			}
		}
		if len(c.names) == 0 {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
				t.Errorf("%s.crt: %v", c.name, err)
			}
		}
	}
	if b, _ := pem.Decode(read("tls.key")); b == nil || b.Type != "PRIVATE KEY" {
		t.Error("tls.key is not a PKCS #8 PEM key")
	}
	if runtime.GOOS != "windows" {
		for _, name := range []string{"tls.key", "ca.crt", ""} {
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]os.FileMode{true: 0o700, false: 0o600}[name == ""]; fi.Mode().Perm() != want {
				t.Errorf("%s: mode %04o, want %04o", filepath.Join(dir, name), fi.Mode().Perm(), want)
			}
		}
	}

	// A TLS handshake with the admin listener's files, mutual: the server
	// trusts clients-ca.crt, the client ca.crt and presents client.crt.
	srvPair, _ := tls.LoadX509KeyPair(filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"))
	cliPair, _ := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	clients := x509.NewCertPool()
	clients.AppendCertsFromPEM(read("clients-ca.crt"))
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srvPair}, ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			err = c.(*tls.Conn).Handshake()
			c.Close()
		}
		served <- err
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{cliPair}})
	if err != nil {
		t.Fatalf("handshake with admin.crt, as localhost, with client.crt: %v", err)
	}
	conn.Close()
	if err := <-served; err != nil {
		t.Fatalf("the server's side of the handshake: %v", err)
	}

	// A second run keeps the files, unless --force.
	before := read("tls.key")
	_, _, err = keywayCLI(t, "certs", "--out", dir)
	if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), "ca.crt, tls.crt, tls.key") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("certs into a directory that has them: %v (exit %d), want exit 2 naming the files and --force", err, exitCode(err))
	}
	if !bytes.Equal(before, read("tls.key")) {
		t.Fatal("the refused run replaced tls.key")
	}
	if _, _, err := keywayCLI(t, "certs", "--out", dir, "--force"); err != nil || bytes.Equal(before, read("tls.key")) {
		t.Fatalf("certs --force: %v, tls.key replaced: %v", err, !bytes.Equal(before, read("tls.key")))
	}
	if _, _, err := keywayCLI(t, "certs"); err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), "needs --out DIR") {
		t.Errorf("certs without --out: %v", err)
	}
	if ents, _ := os.ReadDir(dir); slices.ContainsFunc(ents, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), ".") }) {
		t.Errorf("temporary files left in %s: %v", dir, ents)
	}
}
