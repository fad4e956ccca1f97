package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"keyway/internal/testcerts"
)

// WithFileChecks reads the TLS files and reports what a listener would
// refuse, at the key's line; without it, Load reads no file.
func TestLoadWithFileChecks(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "a", "a.example")
	_, otherKey := ca.Issue(t, dir, "b", "b.example")
	yaml := func(proxyKey, adminCA string) string {
		return fmt.Sprintf(`tls:
  certificates:
    - cert_file: %s
      key_file: %s
admin:
  listen: "127.0.0.1:9901"
  tls:
    certificates: [{cert_file: %s, key_file: %s}]
    client_ca_file: %s
%s`, cert, proxyKey, cert, key, adminCA, okSets)
	}
	good := yaml(key, ca.File(t, dir))
	c, err := LoadBytes("f.yaml", []byte(good), noEnv, WithFileChecks())
	if err != nil {
		t.Fatal(err)
	}
	if got := Summary(c); !strings.Contains(got, "listen :8080 (TLS), admin 127.0.0.1:9901 (TLS)") {
		t.Fatalf("Summary = %s", got)
	}

	bad := yaml(otherKey, dir+"/missing-ca.pem")
	if _, err := LoadBytes("f.yaml", []byte(bad), noEnv); err != nil {
		t.Fatalf("without WithFileChecks: %v", err)
	}
	_, err = LoadBytes("f.yaml", []byte(bad), noEnv, WithFileChecks())
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want an *Error", err)
	}
	want := []string{
		"f.yaml:4: tls.certificates[0].key_file: " + otherKey + ": the private key does not match the certificate in tls.certificates[0].cert_file",
		"f.yaml:9: admin.tls.client_ca_file: open " + dir + "/missing-ca.pem: no such file or directory",
	}
	if len(ce.Problems) != len(want) {
		t.Fatalf("problems:\n%v", err)
	}
	for i, w := range want {
		if got := ce.Problems[i].String(); !strings.HasPrefix(got, w) {
			t.Errorf("problem %d:\n%s\nwant it to start with\n%s", i, got, w)
		}
	}

	// Invalid keys are reported once, by validation, and their files not
	// read.
	_, err = LoadBytes("f.yaml", []byte(strings.Replace(good, "tls:\n", "tls:\n  min_version: \"1.1\"\n", 1)), noEnv, WithFileChecks())
	if err == nil || strings.Count(err.Error(), "tls.min_version") != 1 {
		t.Fatalf("got %v", err)
	}
}
