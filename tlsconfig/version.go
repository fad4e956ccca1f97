package tlsconfig

import (
	"crypto/tls"
	"fmt"
)

// ParseVersion turns a minimum TLS version as the configuration writes it
// ("1.2" or "1.3") into its crypto/tls constant. "" means 1.2.
func ParseVersion(v string) (uint16, error) {
	switch v {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("%q is not a TLS version keyway accepts: use \"1.2\" (default) or \"1.3\"; 1.0 and 1.1 are insecure", v)
}
