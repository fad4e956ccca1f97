package admin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"keyway/tlsconfig"
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
	// TLS makes the admin listener serve HTTPS, with the keys of the
	// proxy's tls section (certificates, min_version, client_ca_file,
	// watch_interval). Without certificates (the default) it speaks plain
	// HTTP.
	TLS tlsconfig.ServerConfig `yaml:"tls"`
}

// TokenEnv is the environment variable that holds the admin token.
const TokenEnv = "KEYWAY_ADMIN_TOKEN"

// DefaultConfig returns the admin configuration used when the YAML omits a field.
func DefaultConfig() Config {
	return Config{Listen: "127.0.0.1:9901", TLS: tlsconfig.DefaultServerConfig()}
}

// Validate reports every problem with the configuration. Each error starts
// with the field's YAML name followed by ": ".
func (c Config) Validate() error {
	var errs []error
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			errs = append(errs, fmt.Errorf("listen: %q is not host:port (e.g. \"127.0.0.1:9901\"), or empty to disable the admin listener", c.Listen))
		}
	}
	if c.TokenFile != "" && strings.TrimSpace(c.TokenFile) != c.TokenFile {
		errs = append(errs, fmt.Errorf("token_file: %q has leading or trailing white space", c.TokenFile))
	}
	for _, err := range leaves(c.TLS.Validate()) {
		errs = append(errs, fmt.Errorf("tls.%w", err))
	}
	return errors.Join(errs...)
}

// leaves splits errors joined with errors.Join.
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
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
