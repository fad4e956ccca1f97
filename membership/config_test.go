package membership

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// Gossip off loopback needs a key (from KEYWAY_GOSSIP_KEY or key_file) or
// an explicit insecure: true; the error names the field, the value and
// every fix.
func TestCheckKey(t *testing.T) {
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	keyFile := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bindFixes := []string{`bind_addr: gossip would listen on "0.0.0.0", which is not a loopback address, without an encryption key`,
		"gossip.key_file or KEYWAY_GOSSIP_KEY", "bind to loopback (gossip.bind_addr: 127.0.0.1)", "gossip.insecure: true if the network is trusted"}
	cases := map[string]struct {
		modify func(*Config)
		env    map[string]string
		want   []string // substrings of the error; none: no error
	}{
		"loopback":                    {modify: func(c *Config) { c.BindAddr = "127.0.0.1" }},
		"loopback v6":                 {modify: func(c *Config) { c.BindAddr = "::1" }},
		"loopback, advertised":        {modify: func(c *Config) { c.BindAddr, c.AdvertiseAddr = "127.0.0.2", "127.0.0.3" }},
		"all interfaces":              {want: bindFixes},
		"all interfaces v6":           {modify: func(c *Config) { c.BindAddr = "::" }, want: []string{`bind_addr: gossip would listen on "::"`}},
		"an empty variable is no key": {env: map[string]string{KeyEnv: ""}, want: bindFixes},
		"advertised off loopback": {modify: func(c *Config) { c.BindAddr, c.AdvertiseAddr = "127.0.0.1", "10.0.0.5" },
			want: []string{`advertise_addr: gossip would advertise "10.0.0.5", which is not a loopback address, without an encryption key`,
				"gossip.key_file or KEYWAY_GOSSIP_KEY", "bind and advertise loopback only", "gossip.insecure: true"}},
		"key from the environment": {env: map[string]string{KeyEnv: key}},
		"key from the file":        {modify: func(c *Config) { c.KeyFile = keyFile }},
		"insecure":                 {modify: func(c *Config) { c.Insecure = true }},
		"insecure, advertised":     {modify: func(c *Config) { c.BindAddr, c.AdvertiseAddr, c.Insecure = "127.0.0.1", "10.0.0.5", true }},
		"not an IP: Validate's":    {modify: func(c *Config) { c.BindAddr = "here" }},
		"bad variable":             {env: map[string]string{KeyEnv: "not base64!"}, want: []string{"$KEYWAY_GOSSIP_KEY: key 1 is not base64"}},
		"bad variable, insecure":   {modify: func(c *Config) { c.Insecure = true }, env: map[string]string{KeyEnv: "c2hvcnQ="}, want: []string{"$KEYWAY_GOSSIP_KEY: key 1 is 5 bytes"}},
		"missing file":             {modify: func(c *Config) { c.KeyFile = filepath.Join(t.TempDir(), "none") }, want: []string{"key_file: open "}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			if tc.modify != nil {
				tc.modify(&c)
			}
			err := c.CheckKey(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("CheckKey = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckKey = nil, want an error with %q", tc.want)
			}
			if !strings.HasPrefix(err.Error(), tc.want[0]) {
				t.Errorf("CheckKey = %q, want it to start with %q", err, tc.want[0])
			}
			for _, w := range tc.want[1:] {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("CheckKey = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// New refuses what CheckKey refuses, before binding anything.
func TestNewRefusesKeylessGossipOffLoopback(t *testing.T) {
	c := DefaultConfig()
	_, err := New(c, Meta{Role: RoleProxy}, Options{Env: func(string) (string, bool) { return "", false }})
	if err == nil || !strings.HasPrefix(err.Error(), `gossip config: bind_addr: gossip would listen on "0.0.0.0"`) {
		t.Fatalf("New = %v, want the bind_addr refusal", err)
	}
}

// A node that gossips in clear off loopback because insecure: true allows
// it says so at error level (without a stack trace) when it starts; with a
// key, or on loopback, it does not.
func TestInsecureWarns(t *testing.T) {
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	cases := map[string]struct {
		bind, advertise string
		env             map[string]string
		field           string // the field the warning names; "" for no warning
	}{
		"all interfaces":          {bind: "0.0.0.0", field: "bind_addr"},
		"advertised off loopback": {bind: "127.0.0.1", advertise: "10.0.0.5", field: "advertise_addr"},
		"with a key":              {bind: "0.0.0.0", env: map[string]string{KeyEnv: key}},
		"loopback":                {bind: "127.0.0.1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			c.BindAddr, c.AdvertiseAddr, c.Insecure = tc.bind, tc.advertise, true
			core, logs := observer.New(zapcore.InfoLevel)
			log := zap.New(core, zap.AddStacktrace(zapcore.ErrorLevel))
			n, err := New(c, Meta{Role: RoleProxy}, Options{Logger: log, Env: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }})
			if err != nil {
				t.Fatal(err)
			}
			n.warnInsecure() // what Run does once bound
			got := logs.FilterLevelExact(zapcore.ErrorLevel).All()
			if tc.field == "" {
				if len(got) != 0 {
					t.Fatalf("warned: %v", got)
				}
				return
			}
			if len(got) != 1 || !strings.Contains(got[0].Message, "NOT ENCRYPTED") || !strings.Contains(got[0].Message, "gossip.insecure") {
				t.Fatalf("error-level lines %v, want one saying gossip is not encrypted", got)
			}
			if _, ok := got[0].ContextMap()[tc.field]; !ok || got[0].Stack != "" {
				t.Fatalf("warning %+v: want field %s and no stack trace", got[0], tc.field)
			}
		})
	}
}
