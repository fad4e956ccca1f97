package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"keyway/admin"
	"keyway/internal/testcerts"
)

// The client commands reach an admin listener over TLS with --ca-file
// (or KEYWAY_ADMIN_CA) and, for mTLS, --cert-file and --key-file (or
// KEYWAY_ADMIN_CERT, KEYWAY_ADMIN_KEY); without them they say what to
// pass. The listener here is a stand-in answering an empty set list.
func TestCLIAdminOverTLS(t *testing.T) {
	for _, env := range []string{"KEYWAY_ADMIN", "KEYWAY_ADMIN_CA", "KEYWAY_ADMIN_CERT", "KEYWAY_ADMIN_KEY"} {
		t.Setenv(env, "")
	}
	dir := t.TempDir()
	ca := testcerts.New(t)
	caFile := ca.File(t, dir)
	sc, sk := ca.Issue(t, dir, "admin", "127.0.0.1")
	serverCert, err := tls.LoadX509KeyPair(sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, clientKey := ca.Issue(t, dir, "operator", "operator")
	var mu sync.Mutex
	var peers []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pc := r.TLS.PeerCertificates; len(pc) > 0 {
			mu.Lock()
			peers = append(peers, pc[0].Subject.CommonName)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(admin.AdminHeader, "1")
		fmt.Fprint(w, `{"replica_sets":[]}`)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: ca.Pool()}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	hostPort := strings.TrimPrefix(srv.URL, "https://")

	out, _, err := keywayCLI(t, "status", "--admin", srv.URL, "--ca-file", caFile)
	if err != nil || !strings.Contains(out, "no replica sets configured") {
		t.Fatalf("status --admin https://… --ca-file: %q, %v", out, err)
	}
	_, _, err = keywayCLI(t, "status", "--admin", srv.URL)
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority: pass --ca-file") || exitCode(err) != exitRuntime {
		t.Fatalf("status without the CA: %v", err)
	}
	_, _, err = keywayCLI(t, "members", "--admin", srv.URL, "--ca-file", filepath.Join(dir, "missing.pem"))
	if err == nil || !strings.Contains(err.Error(), "--ca-file (KEYWAY_ADMIN_CA): ") || exitCode(err) != exitConfig {
		t.Fatalf("members with a missing --ca-file: %v (exit %d)", err, exitCode(err))
	}
	_, _, err = keywayCLI(t, "status", "--admin", srv.URL, "--ca-file", caFile, "--cert-file", clientCert)
	if err == nil || !strings.Contains(err.Error(), "--key-file (KEYWAY_ADMIN_KEY): empty") || exitCode(err) != exitConfig {
		t.Fatalf("status with --cert-file alone: %v", err)
	}

	// The environment, and host:port: the TLS flags make it https.
	t.Setenv("KEYWAY_ADMIN", hostPort)
	t.Setenv("KEYWAY_ADMIN_CA", caFile)
	t.Setenv("KEYWAY_ADMIN_CERT", clientCert)
	t.Setenv("KEYWAY_ADMIN_KEY", clientKey)
	if out, _, err := keywayCLI(t, "status"); err != nil || !strings.Contains(out, "no replica sets configured") {
		t.Fatalf("status with KEYWAY_ADMIN=host:port and KEYWAY_ADMIN_CA/CERT/KEY: %q, %v", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Only the last status sent a certificate: with its probe (GET /v1/),
	// two requests.
	if len(peers) != 2 || peers[0] != "operator" || peers[1] != "operator" {
		t.Fatalf("client certificates the admin listener saw: %q, want [operator operator]", peers)
	}
}

// keyway validate loads the TLS files of every replica set (a key that
// does not match its certificate is refused with the file's line) and
// warns about insecure_skip_verify.
func TestValidateReplicaTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := testcerts.New(t), testcerts.New(t)
	caFile := ca.File(t, dir)
	cert, key := ca.Issue(t, dir, "keyway", "keyway")
	_, otherKey := other.Issue(t, dir, "other", "other")
	write := func(tlsYAML string) string {
		f := filepath.Join(dir, "k.yaml")
		if err := os.WriteFile(f, []byte("replica_sets:\n  - name: orders\n    static: [{name: o0, addr: \"127.0.0.1:9001\"}]\n    tls:\n"+tlsYAML), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := write(fmt.Sprintf("      enabled: true\n      ca_file: %q\n      cert_file: %q\n      key_file: %q\n", caFile, cert, key))
	if out, errOut, err := keywayCLI(t, "validate", "-c", f); err != nil || !strings.HasPrefix(out, "ok:") || errOut != "" {
		t.Fatalf("validate: %q %q %v", out, errOut, err)
	}
	f = write(fmt.Sprintf("      enabled: true\n      ca_file: %q\n      cert_file: %q\n      key_file: %q\n", caFile, cert, otherKey))
	_, _, err := keywayCLI(t, "validate", "-c", f)
	if err == nil || exitCode(err) != exitConfig || !strings.Contains(err.Error(), "k.yaml:8: replica_sets[0].tls.key_file: ") ||
		!strings.Contains(err.Error(), "is not the key of the certificate") {
		t.Fatalf("validate with a key of another certificate: %v", err)
	}
	f = write("      enabled: true\n      insecure_skip_verify: true\n")
	out, errOut, err := keywayCLI(t, "validate", "-c", f)
	if err != nil || !strings.HasPrefix(out, "ok:") || !strings.Contains(errOut, "warning: replica_sets[0].tls.insecure_skip_verify: true") {
		t.Fatalf("validate with insecure_skip_verify: %q %q %v", out, errOut, err)
	}
}
