package admin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// Config configures the admin listener: /metrics, /healthz, /readyz and
// the API under /v1/.
type Config struct {
	// Listen is the admin listener's address. Default "127.0.0.1:9901"
	// (loopback only). Empty disables the admin listener.
	Listen string `yaml:"listen"`
	// TokenFile is a file holding the bearer token the mutating endpoints
	// (drain, undrain) require; surrounding white space is ignored. The
	// environment variable KEYWAY_ADMIN_TOKEN, when set, is used instead.
	// Without a token the mutating endpoints answer 401, and an admin
	// listener off loopback refuses to start.
	TokenFile string `yaml:"token_file"`
}

// TokenEnv is the environment variable that holds the admin token.
const TokenEnv = "KEYWAY_ADMIN_TOKEN"

// DefaultConfig returns the admin configuration used when the YAML omits a field.
func DefaultConfig() Config { return Config{Listen: "127.0.0.1:9901"} }

// Validate reports every problem with the configuration. Each error starts
// with the field's YAML name followed by ": ".
func (c Config) Validate() error {
	var errs []error
	if c.Listen != "" {
		if _, port, err := net.SplitHostPort(c.Listen); err != nil {
			errs = append(errs, fmt.Errorf("listen: %q is not host:port (e.g. \"127.0.0.1:9901\"), or empty to disable the admin listener", c.Listen))
		} else if _, err := net.LookupPort("tcp", port); err != nil {
			errs = append(errs, fmt.Errorf("listen: %q has an invalid port: use 0 to 65535 (0 picks a free port)", c.Listen))
		}
	}
	if c.TokenFile != "" && strings.TrimSpace(c.TokenFile) != c.TokenFile {
		errs = append(errs, fmt.Errorf("token_file: %q has leading or trailing white space", c.TokenFile))
	}
	return errors.Join(errs...)
}

// loadToken returns the admin token: env (through lookup) first, then the
// token file; "" when neither is configured.
func loadToken(c Config, lookup func(string) (string, bool)) (string, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if v, ok := lookup(TokenEnv); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v), nil
	}
	if c.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return "", fmt.Errorf("token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token_file: %s is empty", c.TokenFile)
	}
	return tok, nil
}

// loopback reports whether a listen address binds only loopback.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
