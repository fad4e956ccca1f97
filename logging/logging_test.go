package logging

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAccessLogIsNotSampled: every access-log line reaches stdout, while
// the application log samples identical messages.
func TestAccessLogIsNotSampled(t *testing.T) {
	var stderr bytes.Buffer
	var stdout syncBuffer
	l, err := New(Config{Level: "info", Format: "json", AccessLog: true, Access: AccessConfig{Key: KeyOmit}}, &stderr, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		_, _ = l.Access.Write([]byte(`{"msg":"access"}` + "\n"))
		l.App.Info("same message")
	}
	l.Close()
	if n := strings.Count(stdout.String(), "\n"); n != 1000 {
		t.Fatalf("access log kept %d of 1000 entries", n)
	}
	if n := strings.Count(stderr.String(), "\n"); n >= 1000 || n < 100 {
		t.Fatalf("app log kept %d of 1000 identical entries; want sampling to keep 100..999", n)
	}
}

func TestLevelAndFormat(t *testing.T) {
	var stderr bytes.Buffer
	l, err := New(Config{Level: "warn", Format: "console", Access: AccessConfig{Key: KeyOmit}}, &stderr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Access != nil {
		t.Fatal("access logger built with access_log off")
	}
	l.App.Info("hidden")
	l.App.Warn("shown")
	l.Close()
	if out := stderr.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "WARN") || strings.HasPrefix(out, "{") {
		t.Fatalf("unexpected console output %q", out)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(short, []byte("  tooshort\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	on := func(mod func(*AccessConfig)) func(*Config) {
		return func(c *Config) {
			c.AccessLog = true
			mod(&c.Access)
		}
	}
	cases := map[string]struct {
		modify func(*Config)
		want   string
	}{
		"default":            {func(*Config) {}, ""},
		"bad level":          {func(c *Config) { c.Level = "verbose" }, "level: must be one of debug, info, warn, error"},
		"bad format":         {func(c *Config) { c.Format = "xml" }, "format: must be json or console"},
		"access on, stdout":  {on(func(a *AccessConfig) { a.Path = "stdout" }), ""},
		"access on, file":    {on(func(a *AccessConfig) { a.Path = filepath.Join(dir, "access.log") }), ""},
		"access on, hmac":    {on(func(a *AccessConfig) { a.Key = KeyHMAC; a.KeySecretFile = good }), ""},
		"access on, plain":   {on(func(a *AccessConfig) { a.Key = KeyPlain }), ""},
		"bad key mode":       {on(func(a *AccessConfig) { a.Key = "hash" }), `access.key: must be omit, hmac or plain, got "hash"`},
		"no directory":       {on(func(a *AccessConfig) { a.Path = filepath.Join(dir, "nope", "access.log") }), "access.path: the directory of"},
		"path with space":    {on(func(a *AccessConfig) { a.Path = " /tmp/a.log" }), "access.path: \" /tmp/a.log\" has leading or trailing white space"},
		"short secret":       {on(func(a *AccessConfig) { a.Key = KeyHMAC; a.KeySecretFile = short }), "access.key_secret_file: " + short + " holds 8 bytes (white space aside), want at least 16"},
		"missing secret":     {on(func(a *AccessConfig) { a.Key = KeyHMAC; a.KeySecretFile = filepath.Join(dir, "none") }), "access.key_secret_file: open"},
		"path, access off":   {func(c *Config) { c.Access.Path = "/tmp/a.log" }, "access.path: \"/tmp/a.log\" is set but access_log is false"},
		"key, access off":    {func(c *Config) { c.Access.Key = KeyPlain }, "access.key: \"plain\" is set but access_log is false"},
		"omit, access off":   {func(c *Config) { c.Access.Key = KeyOmit }, ""},
		"stdout, access off": {func(c *Config) { c.Access.Path = "stdout" }, "is set but access_log is false"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.modify(&cfg)
			err := cfg.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSetLevel(t *testing.T) {
	var stderr bytes.Buffer
	l, err := New(Config{Level: "warn", Format: "json"}, &stderr, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.App.Info("hidden")
	if err := l.SetLevel("debug"); err != nil {
		t.Fatal(err)
	}
	l.App.Debug("shown")
	if err := l.SetLevel("loud"); err == nil {
		t.Fatal("SetLevel accepted an unknown level")
	}
	if l.Level() != "debug" {
		t.Fatalf("Level() = %q after a refused change, want debug", l.Level())
	}
	l.Close()
	if out := stderr.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "shown") {
		t.Fatalf("log output %q: want the debug line after SetLevel and not the info line before", out)
	}
}

// TestCheckKeySecret: key: hmac needs a secret from the environment or
// the file; New refuses to start without one.
func TestCheckKeySecret(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AccessLog = true
	cfg.Access.Key = KeyHMAC
	env := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) { return v, k == KeySecretEnv && v != "" }
	}
	if err := cfg.CheckKeySecret(env("")); err == nil || !strings.Contains(err.Error(), "access.key: hmac needs a secret: set log.access.key_secret_file") {
		t.Fatalf("no secret: %v", err)
	}
	if err := cfg.CheckKeySecret(env("short")); err == nil || !strings.HasPrefix(err.Error(), "$KEYWAY_ACCESS_LOG_KEY_SECRET: the secret has 5 bytes") {
		t.Fatalf("short secret: %v", err)
	}
	if err := cfg.CheckKeySecret(env("0123456789abcdef")); err != nil {
		t.Fatalf("good secret: %v", err)
	}
	cfg.Access.Key = KeyOmit
	if err := cfg.CheckKeySecret(env("")); err != nil {
		t.Fatalf("omit needs no secret: %v", err)
	}
	cfg.Access.Key = KeyHMAC
	t.Setenv(KeySecretEnv, "")
	if _, err := New(cfg, io.Discard, nil); err == nil {
		t.Fatal("New started key: hmac without a secret")
	}
}

// TestNewAccessFile: New opens (creates) the access log file, refuses a
// path it cannot open, and the loggers register the access log's metrics
// and reopen it.
func TestNewAccessFile(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.AccessLog = true
	cfg.Access.Path = filepath.Join(dir, "access.log")
	l, err := New(cfg, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.Access.Path); err != nil {
		t.Fatalf("the file was not created: %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := l.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := l.ReopenAccessLog(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	cfg.Access.Path = dir // a directory
	if _, err := New(cfg, io.Discard, nil); err == nil || !strings.HasPrefix(err.Error(), "access.path: ") {
		t.Fatalf("New with a directory as the file: %v", err)
	}
	// Without an access log: nothing to register or reopen.
	off, err := New(DefaultConfig(), io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	if off.Access != nil || off.Register(reg) != nil || off.ReopenAccessLog() != nil {
		t.Fatal("an access log without access_log")
	}
	off.Close()
}
