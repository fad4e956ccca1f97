package tlsconfig

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ServerConfig configures TLS on a listener: the proxy's (the top-level
// key tls) or the admin API's (admin.tls). The zero value, like the
// default, has no certificates: the listener speaks plain HTTP.
//
// Relative file names are relative to keyway's working directory. Every
// file is PEM.
type ServerConfig struct {
	// Certificates are the listener's certificates. Empty (the default):
	// no TLS. With several, the client's SNI picks the first certificate
	// one of whose DNS names (wildcards included) matches it; the first
	// certificate is served when none matches or the client sent no SNI.
	// (omitempty: written back as YAML and read again, no certificates
	// stay nil rather than becoming an empty list.)
	Certificates []CertificateConfig `yaml:"certificates,omitempty"`
	// MinVersion is the oldest TLS version accepted: "1.2" (the default)
	// or "1.3".
	MinVersion string `yaml:"min_version"`
	// ClientCAFile, when set, makes TLS mutual: every client must present
	// a certificate issued by a CA in this file, or its handshake fails.
	// Empty (the default): clients are not asked for a certificate.
	ClientCAFile string `yaml:"client_ca_file"`
	// WatchInterval is how often the files are read to see whether they
	// changed (by content, so that renamed files, swapped symlinks and
	// in-place rewrites all count). Default 5s; 0 disables watching (a
	// reload still re-reads them); otherwise at least 1s.
	WatchInterval time.Duration `yaml:"watch_interval"`
}

// CertificateConfig names one certificate's files.
type CertificateConfig struct {
	// CertFile holds the certificate, followed by its intermediate CA
	// certificates if any (the chain sent to clients). Required.
	CertFile string `yaml:"cert_file"`
	// KeyFile holds the certificate's private key (PKCS #8, PKCS #1 or
	// SEC 1; not encrypted). Required; it may be CertFile itself when
	// that file holds both.
	KeyFile string `yaml:"key_file"`
}

// DefaultServerConfig returns the values a tls section starts from: no
// certificates (plain HTTP), minimum version 1.2, files checked every 5s.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{MinVersion: "1.2", WatchInterval: 5 * time.Second}
}

// MinWatchInterval is the shortest watch_interval other than 0.
const MinWatchInterval = time.Second

// Enabled reports whether the listener serves TLS: it has certificates.
func (c ServerConfig) Enabled() bool { return len(c.Certificates) > 0 }

// Validate reports every problem with the keys themselves, without
// reading a file (see CheckFiles). Each error starts with the key's path
// within the section ("certificates[0].key_file: ...").
func (c ServerConfig) Validate() error {
	var errs []error
	seen := map[string]int{}
	for i, cert := range c.Certificates {
		p := fmt.Sprintf("certificates[%d].", i)
		for _, f := range []struct{ key, val, what string }{
			{"cert_file", cert.CertFile, "the certificate (PEM, followed by its intermediates), e.g. /etc/keyway/tls/tls.crt"},
			{"key_file", cert.KeyFile, "the certificate's private key (PEM), e.g. /etc/keyway/tls/tls.key"},
		} {
			switch {
			case f.val == "":
				errs = append(errs, fmt.Errorf("%s%s: required: name the file of %s", p, f.key, f.what))
			case strings.TrimSpace(f.val) != f.val:
				errs = append(errs, fmt.Errorf("%s%s: %q has leading or trailing white space", p, f.key, f.val))
			}
		}
		if cert.CertFile == "" {
			continue
		}
		if j, dup := seen[cert.CertFile]; dup {
			errs = append(errs, fmt.Errorf("%scert_file: %q is already certificates[%d]'s; list each certificate once", p, cert.CertFile, j))
		} else {
			seen[cert.CertFile] = i
		}
	}
	if _, err := ParseVersion(c.MinVersion); err != nil {
		errs = append(errs, fmt.Errorf("min_version: %w", err))
	}
	switch {
	case c.ClientCAFile != "" && !c.Enabled():
		errs = append(errs, fmt.Errorf("client_ca_file: %q is set but certificates is empty: client certificates need TLS; add certificates or remove client_ca_file", c.ClientCAFile))
	case strings.TrimSpace(c.ClientCAFile) != c.ClientCAFile:
		errs = append(errs, fmt.Errorf("client_ca_file: %q has leading or trailing white space", c.ClientCAFile))
	}
	if c.WatchInterval < 0 || (c.WatchInterval > 0 && c.WatchInterval < MinWatchInterval) {
		errs = append(errs, fmt.Errorf("watch_interval: must be 0 (do not watch the files) or at least %s, got %s (write a duration with a unit, e.g. \"5s\")", MinWatchInterval, c.WatchInterval))
	}
	return errors.Join(errs...)
}

// CheckFiles reads the files the configuration names and reports, joined,
// what would keep a listener from serving them: a file that cannot be
// read, holds no certificate or key, a key that does not match its
// certificate, a certificate SNI could never select, a client CA file
// without a CA. path is the section's YAML path ("tls", "admin.tls"):
// each error starts with the full path of its key
// ("tls.certificates[0].key_file: ..."). An expired certificate is not an
// error here (a listener starts with it and logs a warning). keyway
// validate calls it through the config package; listeners run the same
// code when they load the files.
func (c ServerConfig) CheckFiles(path string) error {
	if !c.Enabled() {
		return nil
	}
	prefix := ""
	if path != "" {
		prefix = path + "."
	}
	if err := c.Validate(); err != nil {
		return prefixed(prefix, err)
	}
	_, err := build(c, readFiles(c), prefix)
	return err
}
