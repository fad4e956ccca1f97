package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"keyway/internal/atomicfile"
)

// keyway certs: throw-away TLS certificates for trying keyway's TLS on
// one machine, under the names the examples use (examples/tls.yaml,
// examples/full.yaml). A CA made for the run signs them, and its key is
// not kept: nothing else can be signed with it later.

const certsUsage = `Usage: keyway certs --out DIR [--force]

Makes throw-away TLS certificates for trying keyway's TLS on this machine:
the files examples/tls.yaml and examples/full.yaml name, from the directory
keyway runs in. A CA made for this run signs them; its private key is not
kept. ECDSA P-256, valid from an hour ago for 90 days. Not for production:
use certificates from your own CA there. Writes, in DIR (made with mode
0700; files 0600):

  ca.crt                 the CA: what clients trust (curl --cacert, --ca-file)
  tls.crt, tls.key       the proxy listener: localhost, 127.0.0.1, ::1,
                         orders.example.com, *.orders.example.com
  events.crt, events.key a second certificate, chosen by SNI: events.example.com
  admin.crt, admin.key   the admin listener: localhost, 127.0.0.1, ::1
  clients-ca.crt         the CA again, as admin.tls.client_ca_file
  client.crt, client.key a client certificate it issued, for the CLI
                         (--cert-file, --key-file) when the admin asks for one

Existing files are not overwritten without --force. Example:

  keyway certs --out tls

`

// certsValidity is how long the certificates of keyway certs are valid.
const certsValidity = 90 * 24 * time.Hour

// localNames are the names of this machine every server certificate of
// keyway certs carries.
var localNames = []string{"localhost", "127.0.0.1", "::1"}

func runCerts(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	var out string
	var force bool
	fs.StringVar(&out, "out", "", "`DIR` to write the files to (made if missing), e.g. tls; required")
	fs.BoolVar(&force, "force", false, "overwrite files of those names in --out")
	if err := parseCLIFlags(fs, args, stderr, certsUsage); err != nil {
		return err
	}
	if out == "" {
		return usageError{"keyway certs needs --out DIR (e.g. keyway certs --out tls, for the examples' tls/ files)"}
	}
	files, err := makeCerts(time.Now())
	if err != nil {
		return err
	}
	if err := writeCertFiles(out, files, force); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "throw-away TLS certificates (valid 90 days): wrote %s\n", out)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, f := range files {
		fmt.Fprintf(tw, "  %s\t%s\n", f.name, f.what)
	}
	tw.Flush()
	ca, client := filepath.Join(out, "ca.crt"), filepath.Join(out, "client")
	fmt.Fprintf(stdout, `
Next, from the directory that holds %[1]s:
  keyway validate -c examples/tls.yaml
  keyway proxy -c examples/tls.yaml
  curl --cacert %[2]s --resolve orders.example.com:8443:127.0.0.1 https://orders.example.com:8443/ingest
  keyway status --admin https://localhost:9901 --ca-file %[2]s --cert-file %[3]s.crt --key-file %[3]s.key
`, out, ca, client)
	return nil
}

// certFile is one file keyway certs writes.
type certFile struct {
	name, what string
	data       []byte
}

// makeCerts makes the CA and the certificates it signs, valid from an
// hour before now.
func makeCerts(now time.Time) ([]certFile, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "keyway throw-away CA " + now.UTC().Format("2006-01-02 15:04:05")},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, ca, err := signCert(caTmpl, now, &caKey.PublicKey, nil, caKey)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := []certFile{{"ca.crt", "the CA (its key is not kept): what clients trust", caPEM}}
	for _, c := range []struct {
		name, what string
		names      []string
		usage      x509.ExtKeyUsage
	}{
		{"tls", "the proxy listener (tls.certificates[0])", slices.Concat(localNames, []string{"orders.example.com", "*.orders.example.com"}), x509.ExtKeyUsageServerAuth},
		{"events", "a second name, chosen by SNI (tls.certificates[1])", []string{"events.example.com"}, x509.ExtKeyUsageServerAuth},
		{"admin", "the admin listener (admin.tls.certificates[0])", localNames, x509.ExtKeyUsageServerAuth},
		{"client", "a client certificate for the CLI (--cert-file, --key-file)", nil, x509.ExtKeyUsageClientAuth},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: c.name},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{c.usage},
		}
		if len(c.names) > 0 {
			tmpl.Subject.CommonName = c.names[0]
		}
		for _, n := range c.names {
			if ip := net.ParseIP(n); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, n)
			}
		}
		der, _, err := signCert(tmpl, now, &key.PublicKey, ca, caKey)
		if err != nil {
			return nil, err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		what := c.what
		if len(c.names) > 0 {
			what += ": " + strings.Join(c.names, ", ")
		}
		files = append(files,
			certFile{c.name + ".crt", what, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
			certFile{c.name + ".key", "its private key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})})
		if c.name == "admin" {
			files = append(files, certFile{"clients-ca.crt", "the CA that issued client.crt: admin.tls.client_ca_file", caPEM})
		}
	}
	return files, nil
}

// signCert signs tmpl, given a random serial and the validity of keyway
// certs, with parent's key (tmpl itself when parent is nil: self-signed).
func signCert(tmpl *x509.Certificate, now time.Time, pub *ecdsa.PublicKey, parent *x509.Certificate, signer *ecdsa.PrivateKey) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(certsValidity)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return der, cert, err
}

// writeCertFiles writes files into dir, refusing to replace any unless
// force.
func writeCertFiles(dir string, files []certFile, force bool) error {
	if !force {
		var exist []string
		for _, f := range files {
			if _, err := os.Lstat(filepath.Join(dir, f.name)); err == nil {
				exist = append(exist, f.name)
			}
		}
		if len(exist) > 0 {
			return usageError{fmt.Sprintf("--out %s: %s exist already: keyway certs does not overwrite them; pass --force to replace them (and restart or reload what uses them)",
				dir, strings.Join(exist, ", "))}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data); err != nil {
			return err
		}
	}
	return nil
}
