package tlsconfig

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"keyway/internal/testcerts"
)

func TestServerName(t *testing.T) {
	cases := map[string]struct{ template, replica, addr, want string }{
		"default: the address's host":     {"", "orders-0", "orders-0.orders.svc:9001", "orders-0.orders.svc"},
		"default: an IP address":          {"", "orders-0", "10.0.0.7:9001", "10.0.0.7"},
		"default: an IPv6 address":        {"", "orders-0", "[fd00::7]:9001", "fd00::7"},
		"fixed name":                      {"orders.internal", "orders-1", "10.0.0.8:9001", "orders.internal"},
		"per-pod name":                    {"{replica}.orders.default.svc", "orders-2", "10.0.0.9:9001", "orders-2.orders.default.svc"},
		"placeholder twice":               {"{replica}.{replica}.test", "r", "h:1", "r.r.test"},
		"default: address without a port": {"", "r", "host", "host"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := ServerName(tc.template, tc.replica, tc.addr); got != tc.want {
				t.Fatalf("ServerName(%q, %q, %q) = %q, want %q", tc.template, tc.replica, tc.addr, got, tc.want)
			}
		})
	}
}

// files are a CA's certificate and a client certificate it issued, in a
// test directory.
type files struct {
	dir, ca, cert, key string
}

func newFiles(t *testing.T) files {
	t.Helper()
	dir := t.TempDir()
	ca := testcerts.New(t)
	cert, key := ca.Issue(t, dir, "keyway-proxy", "keyway-proxy")
	return files{dir: dir, ca: ca.File(t, dir), cert: cert, key: key}
}

func TestClientConfigValidate(t *testing.T) {
	f := newFiles(t)
	other := testcerts.New(t)
	otherCert, otherKey := other.Issue(t, f.dir, "other", "other")
	expiredCert, expiredKey := other.IssueWith(t, f.dir, "expired", testcerts.Options{
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}, "expired")
	garbage := filepath.Join(f.dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := ClientConfig{Enabled: true, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key, ServerName: "{replica}.orders.svc", MinVersion: "1.3"}
	cases := map[string]struct {
		modify func(*ClientConfig)
		want   []string // substrings of the error, each in some line; nil: valid
	}{
		"all keys":                   {modify: func(*ClientConfig) {}},
		"only enabled: system roots": {modify: func(c *ClientConfig) { *c = ClientConfig{Enabled: true} }},
		"disabled: nothing checked": {modify: func(c *ClientConfig) {
			*c = ClientConfig{CAFile: "/nonexistent", ServerName: "{pod}", MinVersion: "1.0"}
		}},
		"missing CA file": {modify: func(c *ClientConfig) { c.CAFile = filepath.Join(f.dir, "nope.pem") },
			want: []string{"ca_file: ", "nope.pem", "no such file", "PEM file of CA certificates"}},
		"CA file is not PEM": {modify: func(c *ClientConfig) { c.CAFile = garbage },
			want: []string{"ca_file: ", "holds no PEM certificate"}},
		"CA file is a key": {modify: func(c *ClientConfig) { c.CAFile = f.key },
			want: []string{"ca_file: ", "holds no PEM certificate"}},
		"cert without key": {modify: func(c *ClientConfig) { c.KeyFile = "" },
			want: []string{"key_file: empty, but cert_file is", "set both"}},
		"key without cert": {modify: func(c *ClientConfig) { c.CertFile = "" },
			want: []string{"cert_file: empty, but key_file is", "set both"}},
		"key of another certificate": {modify: func(c *ClientConfig) { c.KeyFile = otherKey },
			want: []string{"key_file: ", "is not the key of the certificate in cert_file", "other.key"}},
		"certificate file holds a key": {modify: func(c *ClientConfig) { c.CertFile = otherKey },
			want: []string{"cert_file: ", "holds no PEM certificate"}},
		"missing key file": {modify: func(c *ClientConfig) { c.KeyFile = filepath.Join(f.dir, "gone.key") },
			want: []string{"key_file: ", "gone.key"}},
		"expired client certificate": {modify: func(c *ClientConfig) { c.CertFile, c.KeyFile = expiredCert, expiredKey },
			want: []string{"cert_file: ", "expired on", "renew it"}},
		"unknown placeholder": {modify: func(c *ClientConfig) { c.ServerName = "{pod}.orders.svc" },
			want: []string{"server_name: ", "{pod}", "the only one is {replica}"}},
		"server name with a port": {modify: func(c *ClientConfig) { c.ServerName = "orders.internal:443" },
			want: []string{"server_name: ", "without scheme, port or path"}},
		"server name with a scheme": {modify: func(c *ClientConfig) { c.ServerName = "https://orders.internal" },
			want: []string{"server_name: ", "without scheme, port or path"}},
		"old version": {modify: func(c *ClientConfig) { c.MinVersion = "1.1" },
			want: []string{"min_version: ", `"1.1"`, "1.2"}},
		"every problem at once": {modify: func(c *ClientConfig) {
			c.CAFile, c.CertFile, c.ServerName, c.MinVersion = garbage, otherCert, "{x}", "1.0"
		}, want: []string{"ca_file: ", "key_file: ", "server_name: ", "min_version: "}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := good
			tc.modify(&c)
			err := c.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestClientConfigWarnings(t *testing.T) {
	cases := map[string]struct {
		c    ClientConfig
		want string // "" for none
	}{
		"off":                         {ClientConfig{}, ""},
		"on, verified":                {ClientConfig{Enabled: true, CAFile: "ca.pem"}, ""},
		"insecure_skip_verify":        {ClientConfig{Enabled: true, InsecureSkipVerify: true}, "insecure_skip_verify: true: the replicas' certificates are not verified"},
		"files set but TLS off":       {ClientConfig{CAFile: "ca.pem"}, "enabled: false"},
		"insecure set but TLS off":    {ClientConfig{InsecureSkipVerify: true}, "enabled: false"},
		"server name set but TLS off": {ClientConfig{ServerName: "x"}, "enabled: false"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			w := tc.c.Warnings()
			if tc.want == "" {
				if len(w) != 0 {
					t.Fatalf("Warnings = %q, want none", w)
				}
				return
			}
			if len(w) != 1 || !strings.HasPrefix(w[0], tc.want) {
				t.Fatalf("Warnings = %q, want one starting %q", w, tc.want)
			}
		})
	}
}

func TestClientConfigPerReplica(t *testing.T) {
	f := newFiles(t)
	cl, err := ClientConfig{Enabled: true, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key, ServerName: "{replica}.orders.svc", MinVersion: "1.3"}.Load()
	if err != nil {
		t.Fatal(err)
	}
	a, b := cl.Config("orders-0", "10.0.0.1:9001"), cl.Config("orders-1", "10.0.0.2:9001")
	if a.ServerName != "orders-0.orders.svc" || b.ServerName != "orders-1.orders.svc" {
		t.Fatalf("server names %q, %q", a.ServerName, b.ServerName)
	}
	if a.ClientSessionCache == nil || a.ClientSessionCache == b.ClientSessionCache {
		t.Fatal("each replica needs a session cache of its own (resumption, and no session offered to another replica)")
	}
	if a.RootCAs == nil || len(a.Certificates) != 1 || a.MinVersion != tls.VersionTLS13 || a.InsecureSkipVerify {
		t.Fatalf("config %+v", a)
	}
	if base := cl.Base(); base.ServerName != "" || base.ClientSessionCache != nil || base.RootCAs == nil {
		t.Fatalf("Base() = %+v", base)
	}
}

// A reload reads the files again: Same tells the proxy whether the
// connections made with the old ones are still as good.
func TestClientSame(t *testing.T) {
	f := newFiles(t)
	c := ClientConfig{Enabled: true, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key}
	load := func() *Client {
		t.Helper()
		cl, err := c.Load()
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	first := load()
	if !first.Same(load()) {
		t.Fatal("the same files loaded twice are not the Same")
	}
	var none *Client
	if !none.Same(nil) || first.Same(nil) || none.Same(first) {
		t.Fatal("nil (TLS off) is only the Same as nil")
	}
	c.ServerName = "x.test"
	if first.Same(load()) {
		t.Fatal("a new server_name is the Same")
	}
	c.ServerName = ""
	// A renewed client certificate at the same path.
	testcerts.New(t).Issue(t, f.dir, "keyway-proxy", "keyway-proxy")
	if err := os.WriteFile(f.ca, testcerts.New(t).PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if first.Same(load()) {
		t.Fatal("files with new contents at the same paths are the Same")
	}
}
