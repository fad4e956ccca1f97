package config

import (
	"fmt"

	"keyway/tlsconfig"
)

// WithFileChecks makes Load also read the files the configuration names
// for TLS (the proxy listener's tls section and, with an admin listener,
// admin.tls) and report the ones a listener could not serve: unreadable,
// not PEM, a key that does not match its certificate, and so on (see
// tlsconfig.ServerConfig.CheckFiles). keyway validate uses it; keyway
// proxy reads the same files with the same code when it starts and at
// every reload.
func WithFileChecks() Option {
	return func(o *options) { o.fileChecks = true }
}

// checkTLSFiles reports, as problems at their keys, what the listeners'
// TLS files hold that a listener would refuse. A section whose keys
// themselves are invalid was reported already and is skipped.
func (d *decoder) checkTLSFiles(file string, c Config) {
	sections := []struct {
		path string
		cfg  tlsconfig.ServerConfig
	}{{"tls", c.TLS}}
	if c.Admin.Listen != "" {
		sections = append(sections, struct {
			path string
			cfg  tlsconfig.ServerConfig
		}{"admin.tls", c.Admin.TLS})
	}
	for _, s := range sections {
		if s.cfg.Validate() != nil {
			continue
		}
		for _, e := range leafErrors(s.cfg.CheckFiles(s.path)) {
			d.validationProblem(file, e.Error())
		}
	}
}

// tlsSummary says in Summary whether a listener serves TLS.
func tlsSummary(certs []tlsconfig.CertificateConfig) string {
	switch len(certs) {
	case 0:
		return ""
	case 1:
		return " (TLS)"
	}
	return fmt.Sprintf(" (TLS, %d certificates)", len(certs))
}
