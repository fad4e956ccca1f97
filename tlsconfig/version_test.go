package tlsconfig

import (
	"crypto/tls"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]uint16{"": tls.VersionTLS12, "1.2": tls.VersionTLS12, "1.3": tls.VersionTLS13} {
		if got, err := ParseVersion(in); err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %x, %v", in, got, err)
		}
	}
	for _, in := range []string{"1.0", "1.1", "TLS1.2", "2"} {
		if _, err := ParseVersion(in); err == nil || !strings.Contains(err.Error(), "1.2") {
			t.Errorf("ParseVersion(%q) = %v", in, err)
		}
	}
}
