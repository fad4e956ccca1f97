package tlsconfig

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FileError is a problem with one file of a tls section: it cannot be
// read, or what it holds cannot be served. Its text starts with the key
// that names the file.
type FileError struct {
	// Key is the YAML path of the key naming the file, e.g.
	// "tls.certificates[0].key_file".
	Key string
	// File is the file's name as configured.
	File string
	// Err says what is wrong; its text names the file.
	Err error
}

func (e *FileError) Error() string { return e.Key + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// CertificateInfo describes a loaded certificate, for logs, the audit
// trail and metrics.
type CertificateInfo struct {
	// CertFile is the file it was read from.
	CertFile string `json:"cert_file"`
	// Names are its DNS names (those SNI selects by), then its IP
	// addresses.
	Names []string `json:"names"`
	// Subject and Issuer are the common names of the certificate and of
	// its issuer.
	Subject string `json:"subject"`
	Issuer  string `json:"issuer"`
	// NotBefore and NotAfter bound its validity.
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	// SHA256 is the fingerprint of the certificate (DER), in hex: what
	// `openssl x509 -fingerprint -sha256` prints, without the colons.
	SHA256 string `json:"sha256"`
}

// Name is the certificate's name in metrics: its first DNS name, else its
// subject's common name, else its file's base name.
func (i CertificateInfo) Name() string {
	switch {
	case len(i.Names) > 0:
		return i.Names[0]
	case i.Subject != "":
		return i.Subject
	}
	return filepath.Base(i.CertFile)
}

// fileSet is one reading of a configuration's files: each file's contents
// or read error, and a fingerprint of them all (what the watcher
// compares).
type fileSet struct {
	data map[string][]byte
	errs map[string]error
	sum  [sha256.Size]byte
}

// files lists every file the configuration names, in key order.
func (c ServerConfig) files() []string {
	var out []string
	for _, cert := range c.Certificates {
		out = append(out, cert.CertFile, cert.KeyFile)
	}
	if c.ClientCAFile != "" {
		out = append(out, c.ClientCAFile)
	}
	return out
}

// readFiles reads every file of c once (a file named twice is read once,
// so that both keys see the same contents).
func readFiles(c ServerConfig) *fileSet {
	fs := &fileSet{data: map[string][]byte{}, errs: map[string]error{}}
	h := sha256.New()
	var n [8]byte
	for _, name := range c.files() {
		h.Write([]byte(name))
		h.Write([]byte{0})
		b, seen := fs.data[name]
		err := fs.errs[name]
		if !seen && err == nil {
			b, err = os.ReadFile(name)
			if err != nil {
				fs.errs[name] = err
			} else {
				fs.data[name] = b
			}
		}
		if err != nil {
			h.Write([]byte(err.Error()))
			continue
		}
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	h.Sum(fs.sum[:0])
	return fs
}

// generation is one loaded configuration of a listener: immutable once
// built; a reload builds the next one and swaps it in whole.
type generation struct {
	cfg    ServerConfig
	sum    [sha256.Size]byte // the fileSet it was built from
	certs  []*tls.Certificate
	infos  []CertificateInfo
	byName map[string][]int // lower-case DNS name (wildcards as "*.example.com") → indexes into certs
	config *tls.Config      // what the handshakes of new connections use
}

// build makes a generation from c and the files read for it. prefix is
// the section's YAML path with a trailing dot ("tls.", "admin.tls.") or
// "": errors' keys start with it. Every problem is reported, joined; each
// is a *FileError.
func build(c ServerConfig, fs *fileSet, prefix string) (*generation, error) {
	minVersion, err := ParseVersion(c.MinVersion)
	if err != nil {
		return nil, fmt.Errorf("%smin_version: %w", prefix, err)
	}
	g := &generation{cfg: c, sum: fs.sum, byName: map[string][]int{}}
	var errs []error
	for i, cc := range c.Certificates {
		p := fmt.Sprintf("%scertificates[%d].", prefix, i)
		cert, info, err := loadPair(cc, fs, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		dns := cert.Leaf.DNSNames
		if len(dns) == 0 && i > 0 {
			errs = append(errs, &FileError{Key: p + "cert_file", File: cc.CertFile, Err: fmt.Errorf(
				"%s: the certificate has no DNS names (subject alternative names), so SNI never selects it: only the first certificate (the default) may lack them; reissue it with its host names, or list it first", cc.CertFile)})
			continue
		}
		for _, n := range dns {
			n = strings.ToLower(n)
			g.byName[n] = append(g.byName[n], len(g.certs))
		}
		g.certs = append(g.certs, cert)
		g.infos = append(g.infos, info)
	}
	var pool *x509.CertPool
	if c.ClientCAFile != "" {
		if pool, err = loadCAs(c.ClientCAFile, fs, prefix+"client_ca_file"); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(g.certs) == 0 {
		return nil, fmt.Errorf("%scertificates: no certificate is configured", prefix)
	}
	g.config = &tls.Config{
		MinVersion:     minVersion,
		GetCertificate: g.getCertificate,
		// keyway's listeners speak HTTP/1.1 only; saying so lets a client
		// that offers h2 fall back instead of guessing.
		NextProtos: []string{"http/1.1"},
	}
	if pool != nil {
		g.config.ClientAuth = tls.RequireAndVerifyClientCert
		g.config.ClientCAs = pool
	}
	return g, nil
}

// loadPair parses one certificate and its key. p is the entry's key
// prefix ("tls.certificates[0].").
func loadPair(cc CertificateConfig, fs *fileSet, p string) (*tls.Certificate, CertificateInfo, error) {
	certKey, keyKey := p+"cert_file", p+"key_file"
	certPEM, keyPEM := fs.data[cc.CertFile], fs.data[cc.KeyFile]
	var errs []error
	if err := fs.errs[cc.CertFile]; err != nil {
		errs = append(errs, &FileError{Key: certKey, File: cc.CertFile, Err: err})
	}
	if err := fs.errs[cc.KeyFile]; err != nil {
		errs = append(errs, &FileError{Key: keyKey, File: cc.KeyFile, Err: err})
	}
	if len(errs) > 0 {
		return nil, CertificateInfo{}, errors.Join(errs...)
	}
	var chain [][]byte
	hasKey := false
	for rest := certPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		switch {
		case b.Type == "CERTIFICATE":
			chain = append(chain, b.Bytes)
		case strings.HasSuffix(b.Type, "PRIVATE KEY"):
			hasKey = true
		}
	}
	if len(chain) == 0 {
		hint := ""
		if hasKey {
			hint = "; it holds a private key: are cert_file and key_file swapped?"
		}
		return nil, CertificateInfo{}, &FileError{Key: certKey, File: cc.CertFile, Err: fmt.Errorf("%s holds no PEM certificate (a -----BEGIN CERTIFICATE----- block)%s", cc.CertFile, hint)}
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, CertificateInfo{}, &FileError{Key: certKey, File: cc.CertFile, Err: fmt.Errorf("%s: the certificate does not parse: %w", cc.CertFile, err)}
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "tls: ")
		if strings.Contains(msg, "does not match") {
			msg = fmt.Sprintf("the private key does not match the certificate in %scert_file (%s); use the key the certificate was issued for", p, cc.CertFile)
		}
		return nil, CertificateInfo{}, &FileError{Key: keyKey, File: cc.KeyFile, Err: fmt.Errorf("%s: %s", cc.KeyFile, msg)}
	}
	pair.Leaf = leaf
	info := CertificateInfo{
		CertFile:  cc.CertFile,
		Names:     append([]string{}, leaf.DNSNames...),
		Subject:   leaf.Subject.CommonName,
		Issuer:    leaf.Issuer.CommonName,
		NotBefore: leaf.NotBefore,
		NotAfter:  leaf.NotAfter,
	}
	for _, ip := range leaf.IPAddresses {
		info.Names = append(info.Names, ip.String())
	}
	sum := sha256.Sum256(leaf.Raw)
	info.SHA256 = hex.EncodeToString(sum[:])
	return &pair, info, nil
}

// loadCAs parses a CA file into a pool.
func loadCAs(file string, fs *fileSet, key string) (*x509.CertPool, error) {
	if err := fs.errs[file]; err != nil {
		return nil, &FileError{Key: key, File: file, Err: err}
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := fs.data[file]; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, &FileError{Key: key, File: file, Err: fmt.Errorf("%s: certificate %d does not parse: %w", file, n+1, err)}
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, &FileError{Key: key, File: file, Err: fmt.Errorf("%s holds no PEM certificate (a -----BEGIN CERTIFICATE----- block): name the file of the CA(s) that issue the clients' certificates", file)}
	}
	return pool, nil
}

// getCertificate picks the certificate for a handshake: the first whose
// DNS names match the SNI exactly, then the first whose wildcard matches
// it, preferring among several for one name one the client supports
// (e.g. ECDSA or RSA); else the first certificate.
func (g *generation) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if name := hello.ServerName; name != "" && len(g.certs) > 1 {
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		if c := g.pick(name, hello); c != nil {
			return c, nil
		}
		if i := strings.IndexByte(name, '.'); i > 0 {
			if c := g.pick("*"+name[i:], hello); c != nil {
				return c, nil
			}
		}
	}
	return g.certs[0], nil
}

func (g *generation) pick(name string, hello *tls.ClientHelloInfo) *tls.Certificate {
	idx := g.byName[name]
	if len(idx) == 0 {
		return nil
	}
	if len(idx) > 1 {
		for _, i := range idx {
			if hello.SupportsCertificate(g.certs[i]) == nil {
				return g.certs[i]
			}
		}
	}
	return g.certs[idx[0]]
}
