package admin

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
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
	// Debug decides who may read /debug/pprof/ (profiles, the command
	// line, goroutine stacks) and /v1/config (the effective configuration,
	// redacted): DebugAuto (the default) lets anyone who reaches a loopback
	// listener read them and requires the bearer token on any other;
	// DebugToken always requires it, DebugOpen never does, and DebugOff
	// serves neither.
	Debug string `yaml:"debug"`
	// AllowedHosts are names, besides the default ones, that requests may
	// carry as their Host: "admin.example.com", "*.example.com" (every
	// name under example.com), or "*" (any Host: no check). By default the
	// listener answers to IP addresses, localhost and *.localhost, the
	// machine's host name and the host of Listen, with any port; anything
	// else is 421 Misdirected Request, so that a web page cannot reach a
	// loopback listener by DNS rebinding (host.go).
	AllowedHosts []string `yaml:"allowed_hosts,omitempty"`
	// TLS makes the admin listener serve HTTPS, with the keys of the
	// proxy's tls section (certificates, min_version, client_ca_file,
	// watch_interval). Without certificates (the default) it speaks plain
	// HTTP.
	TLS tlsconfig.ServerConfig `yaml:"tls"`
}

// The values of admin.debug.
const (
	DebugAuto  = "auto"
	DebugToken = "token"
	DebugOpen  = "open"
	DebugOff   = "off"
)

// TokenEnv is the environment variable that holds the admin token.
const TokenEnv = "KEYWAY_ADMIN_TOKEN"

// DefaultConfig returns the admin configuration used when the YAML omits a field.
func DefaultConfig() Config {
	return Config{Listen: "127.0.0.1:9901", Debug: DebugAuto, TLS: tlsconfig.DefaultServerConfig()}
}

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
	switch c.Debug {
	case "", DebugAuto, DebugToken, DebugOpen, DebugOff:
	default:
		errs = append(errs, fmt.Errorf("debug: %q is not one of auto (open on a loopback listener, the bearer token on any other), token, open, off", c.Debug))
	}
	for i, h := range c.AllowedHosts {
		if err := checkAllowedHost(h); err != nil {
			errs = append(errs, fmt.Errorf("allowed_hosts[%d]: %q %w", i, h, err))
		}
	}
	for _, err := range leaves(c.TLS.Validate()) {
		errs = append(errs, fmt.Errorf("tls.%w", err))
	}
	return errors.Join(errs...)
}

// debugMode resolves admin.debug for the configured listener: DebugToken,
// DebugOpen or DebugOff. An empty value is DebugAuto.
func (c Config) debugMode() string {
	switch c.Debug {
	case DebugToken, DebugOpen, DebugOff:
		return c.Debug
	}
	if loopback(c.Listen) {
		return DebugOpen
	}
	return DebugToken
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

// checkAllowedHost reports what is wrong with an entry of allowed_hosts:
// a name, *.name or *, without a scheme, port or path.
func checkAllowedHost(h string) error {
	const want = `: write a host name ("admin.example.com"), "*.example.com" for every name under example.com, or "*" for any`
	name := strings.TrimSuffix(h, ".")
	if _, err := netip.ParseAddr(name); err == nil {
		return nil // allowed anyway; harmless
	}
	switch {
	case name == "*":
		return nil
	case name == "":
		return errors.New("is empty" + want)
	case strings.Contains(name, "://") || strings.Contains(name, "/"):
		return errors.New("is a URL, not a host name" + want)
	case strings.Contains(name, ":"):
		return errors.New("has a port: any port is allowed, write the name alone" + want)
	}
	name = strings.TrimPrefix(name, "*.")
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || strings.Trim(label, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			return errors.New("is not a host name" + want)
		}
	}
	return nil
}
