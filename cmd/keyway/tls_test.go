package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// exampleCerts makes, in a new directory, the TLS files the examples name
// (tls/tls.crt, tls/events.crt, tls/admin.crt and their keys,
// tls/clients-ca.crt) as the examples say to: keyway certs --out tls. It
// returns the directory.
func exampleCerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, _, err := keywayCLI(t, "certs", "--out", filepath.Join(dir, "tls")); err != nil {
		t.Fatalf("keyway certs: %v", err)
	}
	return dir
}

// keyway validate reads the TLS files and names the key of a file that
// would not load.
func TestValidateTLSFiles(t *testing.T) {
	example, err := filepath.Abs("../../examples/tls.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := exampleCerts(t)
	t.Chdir(dir)
	if out, _, err := keywayCLI(t, "validate", "-c", example); err != nil || !strings.Contains(out, "listen :8443 (TLS, 2 certificates), admin 127.0.0.1:9901 (TLS)") {
		t.Fatalf("validate examples/tls.yaml: %q %v", out, err)
	}
	// The events certificate now pairs with the admin's key.
	if err := os.Rename(filepath.Join(dir, "tls", "admin.key"), filepath.Join(dir, "tls", "events.key")); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := keywayCLI(t, "validate", "-c", example)
	msg := errOut
	if err != nil {
		msg += err.Error()
	}
	if err == nil || !strings.Contains(msg, "tls.yaml:25: tls.certificates[1].key_file: tls/events.key: the private key does not match the certificate in tls.certificates[1].cert_file (tls/events.crt)") {
		t.Fatalf("validate with a mismatched key: %v\n%s", err, errOut)
	}
	// And a missing admin key.
	_, errOut, err = keywayCLI(t, "validate", "-c", example)
	if err == nil || !strings.Contains(err.Error()+errOut, "admin.tls.certificates[0].key_file: open tls/admin.key: no such file or directory") {
		t.Fatalf("validate with a missing key: %v\n%s", err, errOut)
	}
}
