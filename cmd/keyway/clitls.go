package main

import (
	"crypto/tls"
	"flag"
	"os"
	"strings"

	"keyway/tlsconfig"
)

// adminTLSFlags are the client commands' flags for an admin listener that
// uses TLS: --ca-file, --cert-file and --key-file (environment
// KEYWAY_ADMIN_CA, KEYWAY_ADMIN_CERT, KEYWAY_ADMIN_KEY).
type adminTLSFlags struct {
	caFile, certFile, keyFile string
	cfg                       *tls.Config // loaded by load; nil: no TLS flag given
}

func (f *adminTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.caFile, "ca-file", os.Getenv("KEYWAY_ADMIN_CA"),
		"PEM `FILE` of the CA that signed the admin listener's certificate (https; default: the system's roots); env KEYWAY_ADMIN_CA")
	fs.StringVar(&f.certFile, "cert-file", os.Getenv("KEYWAY_ADMIN_CERT"),
		"PEM client certificate `FILE` for an admin listener that requires one (mTLS), with --key-file; env KEYWAY_ADMIN_CERT")
	fs.StringVar(&f.keyFile, "key-file", os.Getenv("KEYWAY_ADMIN_KEY"),
		"PEM private key `FILE` of --cert-file; env KEYWAY_ADMIN_KEY")
}

// flagNames maps tlsconfig's keys to the flags that set them.
var flagNames = strings.NewReplacer(
	"ca_file", "--ca-file (KEYWAY_ADMIN_CA)",
	"cert_file", "--cert-file (KEYWAY_ADMIN_CERT)",
	"key_file", "--key-file (KEYWAY_ADMIN_KEY)")

// load reads the files named by the flags, if any: with one of them set,
// the client speaks TLS to an --admin given as host:port.
func (f *adminTLSFlags) load() error {
	if f.caFile == "" && f.certFile == "" && f.keyFile == "" {
		return nil
	}
	cl, err := tlsconfig.ClientConfig{Enabled: true, CAFile: f.caFile, CertFile: f.certFile, KeyFile: f.keyFile}.Load()
	if err != nil {
		var msgs []string
		for _, line := range strings.Split(err.Error(), "\n") {
			msgs = append(msgs, flagNames.Replace(line))
		}
		return usageError{strings.Join(msgs, "\n")}
	}
	f.cfg = cl.Base()
	return nil
}
