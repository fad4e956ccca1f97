// Package testcerts issues throw-away certificates for tests: a CA made
// fresh per test (ECDSA P-256, crypto/x509) and leaf certificates it signs,
// written as PEM files under a test's directory (t.TempDir()). Nothing here
// is meant for production; no private key is ever committed.
//
// A leaf is usable both as a server certificate and as a client certificate
// (extended key usages ServerAuth and ClientAuth), so one helper serves the
// proxy listener, the admin listener, mTLS clients and TLS to replicas.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// CA is a test certificate authority. It is safe for concurrent use; it
// must not be copied.
type CA struct {
	mu     sync.Mutex
	cert   *x509.Certificate
	der    []byte
	key    *ecdsa.PrivateKey
	serial int64
}

// New makes a fresh CA, valid from an hour ago for a day. It fails the test
// on error.
func New(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: generate CA key: %v", err)
	}
	now := time.Now()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("testcerts: CA serial: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "keyway test CA " + serial.String()},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcerts: create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcerts: parse CA certificate: %v", err)
	}
	return &CA{cert: cert, der: der, key: key, serial: 1}
}

// Certificate returns the CA's own certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// PEM returns the CA certificate PEM-encoded.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// Pool returns a new pool holding only this CA, for a client's RootCAs or a
// server's ClientCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// File writes the CA certificate (PEM) into dir and returns its path. The
// file name is unique per CA, so several CAs may share a directory.
func (ca *CA) File(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca-"+ca.cert.SerialNumber.String()+".pem")
	writeFile(t, path, ca.PEM())
	return path
}

// Options shape a leaf certificate beyond its names. The zero value is a
// certificate valid from an hour ago for a day.
type Options struct {
	// NotBefore and NotAfter bound the validity. Zero means an hour ago
	// and a day from now.
	NotBefore, NotAfter time.Time
}

// Issue signs a leaf certificate for dnsNames (an entry that parses as an
// IP address becomes an IP SAN, e.g. "127.0.0.1"), with common name name,
// and writes it and its private key as PEM files dir/name.crt and
// dir/name.key, replacing them if present. The files are written in place
// (not renamed); tests of atomic swaps write elsewhere and rename or swap
// a symlink themselves.
func (ca *CA) Issue(t testing.TB, dir, name string, dnsNames ...string) (certFile, keyFile string) {
	t.Helper()
	return ca.IssueWith(t, dir, name, Options{}, dnsNames...)
}

// IssueWith is Issue with Options, e.g. for an expired certificate.
func (ca *CA) IssueWith(t testing.TB, dir, name string, o Options, dnsNames ...string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.IssuePEM(t, name, o, dnsNames...)
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM)
	return certFile, keyFile
}

// IssuePEM signs a leaf certificate like IssueWith and returns the
// certificate and the private key PEM-encoded, without writing files.
func (ca *CA) IssuePEM(t testing.TB, name string, o Options, dnsNames ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: generate key for %s: %v", name, err)
	}
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.Add(24 * time.Hour)
	}
	ca.mu.Lock()
	ca.serial++
	serial := ca.serial
	ca.mu.Unlock()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range dnsNames {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testcerts: create certificate %s: %v", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testcerts: marshal key for %s: %v", name, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("testcerts: %v", err)
	}
}
