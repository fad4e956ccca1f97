package tlsconfig

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// ReplicaPlaceholder in ClientConfig.ServerName stands for the replica's
// name, so that per-pod certificates verify: "{replica}.orders.default.svc"
// becomes "orders-0.orders.default.svc" for the replica orders-0.
const ReplicaPlaceholder = "{replica}"

// ClientConfig is the tls section of a replica set: how the proxy reaches
// the set's replicas over TLS. The zero value is off (plain HTTP). A plain
// value, safe to copy and compare.
type ClientConfig struct {
	// Enabled makes the proxy speak TLS to every replica of the set.
	// Default false: plain HTTP, and the other keys are ignored.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of the CA certificates that sign the replicas'
	// certificates. Default empty: the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and its private
	// key, presented to replicas that require one (mTLS). Both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name verified in each replica's certificate and
	// sent as SNI. "{replica}" is replaced with the replica's name. Default
	// empty: the host of the replica's address (an IP address is verified
	// against the certificate's IP addresses, and no SNI is sent).
	ServerName string `yaml:"server_name"`
	// MinVersion is the oldest TLS version accepted: "1.2" (default) or
	// "1.3".
	MinVersion string `yaml:"min_version"`
	// InsecureSkipVerify accepts any certificate a replica presents:
	// anyone on the network path can then read and change the traffic.
	// For tests only; keyway warns about it at every start and reload.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Validate reports every problem of an enabled configuration, each
// starting with its key ("ca_file: ..."): unknown placeholders in
// server_name, a version keyway does not accept, half a client
// certificate, and files that do not load (missing, not PEM, a key that
// does not match its certificate, an expired certificate). A disabled
// configuration is not checked. It reads the files.
func (c ClientConfig) Validate() error {
	if !c.Enabled {
		return nil
	}
	_, err := c.Load()
	return err
}

// Warnings describes what is valid but dangerous or probably a mistake,
// one sentence each starting with its key: insecure_skip_verify, and
// files set while TLS is off.
func (c ClientConfig) Warnings() []string {
	var w []string
	if !c.Enabled {
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" || c.InsecureSkipVerify {
			w = append(w, "enabled: false, so the replicas are reached over plain HTTP and the other tls keys are ignored; set enabled: true to use them")
		}
		return w
	}
	if c.InsecureSkipVerify {
		w = append(w, "insecure_skip_verify: true: the replicas' certificates are not verified; anyone on the network path can read and change this set's traffic. Use it for tests only: set ca_file to the CA that signs the replicas' certificates instead")
	}
	return w
}

// Client is a loaded ClientConfig: the files read and parsed once, ready
// to make each replica's tls.Config. It is immutable and safe for
// concurrent use.
type Client struct {
	base       *tls.Config // everything but ServerName and the session cache
	serverName string      // the template
	sum        [sha256.Size]byte
}

// Load reads and checks the files of c and returns the Client that makes
// its replicas' TLS configurations, or every problem found (errors.Join,
// each starting with its key). It reads the files every time: a reload
// that calls it again picks up renewed certificates.
func (c ClientConfig) Load() (*Client, error) {
	var errs []error
	minVersion, err := ParseVersion(c.MinVersion)
	if err != nil {
		errs = append(errs, fmt.Errorf("min_version: %w", err))
	}
	if err := checkServerName(c.ServerName); err != nil {
		errs = append(errs, fmt.Errorf("server_name: %w", err))
	}
	h := sha256.New()
	fmt.Fprintf(h, "%t\x00%s\x00%s\x00%s\x00%s\x00%s\x00%t\x00", c.Enabled, c.CAFile, c.CertFile, c.KeyFile, c.ServerName, c.MinVersion, c.InsecureSkipVerify)
	base := &tls.Config{MinVersion: minVersion, InsecureSkipVerify: c.InsecureSkipVerify}
	if c.CAFile != "" {
		pool, data, err := loadClientCAs(c.CAFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("ca_file: %w", err))
		}
		base.RootCAs = pool
		h.Write(data)
	}
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		errs = append(errs, fmt.Errorf("key_file: empty, but cert_file is %q: set both for a client certificate (mTLS), or neither", c.CertFile))
	case c.CertFile == "" && c.KeyFile != "":
		errs = append(errs, fmt.Errorf("cert_file: empty, but key_file is %q: set both for a client certificate (mTLS), or neither", c.KeyFile))
	case c.CertFile != "":
		cert, data, err := loadClientKeyPair(c.CertFile, c.KeyFile, time.Now())
		if err != nil {
			errs = append(errs, err)
		} else {
			base.Certificates = []tls.Certificate{cert}
		}
		h.Write(data)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cl := &Client{base: base, serverName: c.ServerName}
	h.Sum(cl.sum[:0])
	return cl, nil
}

// Config returns the TLS configuration for one replica: the set's with
// the replica's server name (ServerName) and a session cache of its own,
// so that reconnecting to the replica resumes a session (an abbreviated
// handshake) and no session is offered to another replica.
func (c *Client) Config(replica, addr string) *tls.Config {
	cfg := c.base.Clone()
	cfg.ServerName = ServerName(c.serverName, replica, addr)
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	return cfg
}

// Base returns the configuration without a server name (crypto/tls and
// net/http then verify the name dialed) and without a session cache: for
// clients other than the proxy's, e.g. the CLI's calls to an admin
// listener.
func (c *Client) Base() *tls.Config { return c.base.Clone() }

// Same reports whether c and o were loaded from the same settings and the
// same file contents, so that connections made with one are as good as
// connections made with the other. Nil is a Client of its own (TLS off).
func (c *Client) Same(o *Client) bool {
	if c == nil || o == nil {
		return c == o
	}
	return c.sum == o.sum
}

// ServerName returns the name verified for a replica: template with
// "{replica}" replaced by the replica's name, or, for an empty template,
// the host of addr (host:port).
func ServerName(template, replica, addr string) string {
	if template == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return addr
		}
		return host
	}
	return strings.ReplaceAll(template, ReplicaPlaceholder, replica)
}

// checkServerName accepts a DNS name or an IP address, with "{replica}"
// anywhere in it.
func checkServerName(s string) error {
	if s == "" {
		return nil
	}
	rest := strings.ReplaceAll(s, ReplicaPlaceholder, "r")
	if strings.ContainsAny(rest, "{}") {
		return fmt.Errorf("%q has a placeholder keyway does not know: the only one is %s (the replica's name), e.g. \"{replica}.orders.default.svc\"", s, ReplicaPlaceholder)
	}
	if _, _, err := net.SplitHostPort(rest); err == nil || strings.Contains(rest, "://") || strings.ContainsAny(rest, "/ \t") {
		return fmt.Errorf("%q is not a host name: write the name the replicas' certificates are issued for, without scheme, port or path, e.g. \"orders.internal\" or \"{replica}.orders.default.svc\"", s)
	}
	return nil
}

// loadClientCAs reads a PEM file of CA certificates.
func loadClientCAs(file string) (*x509.CertPool, []byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, fmt.Errorf("%v: name a PEM file of CA certificates", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, data, fmt.Errorf("%q: certificate %d does not parse: %v", file, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, data, fmt.Errorf("%q holds no PEM certificate (-----BEGIN CERTIFICATE-----): name the CA certificate file, not a key or a DER file", file)
	}
	return pool, data, nil
}

// loadClientKeyPair reads a client certificate and its key, each error starting
// with the key it concerns. now decides whether the certificate expired.
func loadClientKeyPair(certFile, keyFile string, now time.Time) (tls.Certificate, []byte, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("cert_file: %v", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, certPEM, fmt.Errorf("key_file: %v", err)
	}
	data := append(bytes.Clone(certPEM), keyPEM...)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		switch msg := err.Error(); {
		case strings.Contains(msg, "certificate input"):
			return tls.Certificate{}, data, fmt.Errorf("cert_file: %q holds no PEM certificate (-----BEGIN CERTIFICATE-----): %v", certFile, err)
		case strings.Contains(msg, "does not match"):
			return tls.Certificate{}, data, fmt.Errorf("key_file: %q is not the key of the certificate in cert_file %q: %v; pair each certificate with its own key", keyFile, certFile, err)
		default:
			return tls.Certificate{}, data, fmt.Errorf("key_file: %q: %v: name the PEM private key of cert_file %q", keyFile, err, certFile)
		}
	}
	if leaf := cert.Leaf; leaf != nil && now.After(leaf.NotAfter) {
		return tls.Certificate{}, data, fmt.Errorf("cert_file: %q expired on %s: renew it (servers refuse an expired certificate)", certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return cert, data, nil
}
