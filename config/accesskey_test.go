package config

import (
	"os"
	"path/filepath"
	"testing"
)

// Loading refuses what the access log would refuse at start: key: hmac
// without a secret, a short secret in the environment or the file, and
// access keys set while the access log is off; the problem names the key,
// where its value came from and the fix.
func TestLoadAccessLogKey(t *testing.T) {
	const sets = "replica_sets:\n  - name: orders\n    replicas: 1\n    static: [{name: o0, addr: \"10.0.0.1:1\"}]\n"
	const hmacOn = "log:\n  access_log: true\n  access:\n    key: hmac\n"
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		file string
		opts []Option
		want []string // none: loads
	}{
		"hmac without a secret": {
			file: hmacOn + sets, opts: []Option{noEnv},
			want: []string{"proxy.yaml:4: log.access.key: hmac needs a secret: set log.access.key_secret_file to a file holding at least 16 random bytes (e.g. openssl rand -hex 32 > FILE) or the environment variable KEYWAY_ACCESS_LOG_KEY_SECRET, or use key: omit"},
		},
		"hmac, secret file":       {file: hmacOn + "    key_secret_file: " + secret + "\n" + sets, opts: []Option{noEnv}},
		"hmac, secret in the env": {file: hmacOn + sets, opts: []Option{env(map[string]string{"KEYWAY_ACCESS_LOG_KEY_SECRET": "0123456789abcdef"})}},
		"hmac, key from the env":  {file: "log: {access_log: true}\n" + sets, opts: []Option{env(map[string]string{"KEYWAY_LOG_ACCESS_KEY": "hmac", "KEYWAY_ACCESS_LOG_KEY_SECRET": "0123456789abcdef"})}},
		"plain needs no secret":   {file: "log: {access_log: true, access: {key: plain}}\n" + sets, opts: []Option{noEnv}},
		"legacy access_log: true": {file: "log: {access_log: true}\n" + sets, opts: []Option{noEnv}},
		"short secret in the env": {
			file: hmacOn + sets, opts: []Option{env(map[string]string{"KEYWAY_ACCESS_LOG_KEY_SECRET": "short"})},
			want: []string{"$KEYWAY_ACCESS_LOG_KEY_SECRET: the secret has 5 bytes, want at least 16 (e.g. openssl rand -hex 32)"},
		},
		"missing secret file, reported once": {
			file: hmacOn + "    key_secret_file: " + secret + ".none\n" + sets, opts: []Option{noEnv},
			want: []string{"proxy.yaml:5: log.access.key_secret_file: open …: no such file or directory"},
		},
		"path while off": {
			file: "log: {access: {path: /tmp/access.log}}\n" + sets, opts: []Option{noEnv},
			want: []string{`proxy.yaml:1: log.access.path: "/tmp/access.log" is set but access_log is false, so nothing is written: set log.access_log: true, or remove log.access.path`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := LoadBytes("proxy.yaml", []byte(tc.file), tc.opts...)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			sameLines(t, problems(t, err), tc.want)
		})
	}
}
