package config

import (
	"path/filepath"
	"testing"
)

// Loading refuses what the proxy's and the agent's gossip node would
// refuse at start: gossip off loopback without a key (from the file's
// key_file or the environment) unless gossip.insecure; the problem names
// the key, where its value came from, the value and the fixes.
func TestLoadGossipKey(t *testing.T) {
	const base = "replica_sets:\n  - name: orders\n    replicas: 1\ngossip:\n  enabled: true\n  join: [a:7946]\n"
	const fixes = "without an encryption key: any host that reaches it could join the cluster, take a replica's keys by claiming its name and drain replicas; " +
		"set a key with gossip.key_file or KEYWAY_GOSSIP_KEY (make one with: head -c 32 /dev/urandom | base64), " +
		"or bind to loopback (gossip.bind_addr: 127.0.0.1), or set gossip.insecure: true if the network is trusted"
	cases := map[string]struct {
		file string
		opts []Option
		want []string // none: loads
	}{
		"default bind address": {
			file: base, opts: []Option{noEnv},
			want: []string{`proxy.yaml:4: gossip.bind_addr: gossip would listen on "0.0.0.0", which is not a loopback address, ` + fixes + " (default value: not in the file)"},
		},
		"in the file": {
			file: base + "  bind_addr: 10.0.0.5\n", opts: []Option{noEnv},
			want: []string{`proxy.yaml:7: gossip.bind_addr: gossip would listen on "10.0.0.5", which is not a loopback address, ` + fixes},
		},
		"from the environment": {
			file: base + "  bind_addr: 127.0.0.1\n", opts: []Option{env(map[string]string{"KEYWAY_GOSSIP_BIND_ADDR": "0.0.0.0"})},
			want: []string{`$KEYWAY_GOSSIP_BIND_ADDR: gossip.bind_addr: gossip would listen on "0.0.0.0"…`},
		},
		"advertised": {
			file: base + "  bind_addr: 127.0.0.1\n  advertise_addr: 10.0.0.5\n", opts: []Option{noEnv},
			want: []string{`proxy.yaml:8: gossip.advertise_addr: gossip would advertise "10.0.0.5", which is not a loopback address, without an encryption key: …or bind and advertise loopback only, or set gossip.insecure: true if the network is trusted`},
		},
		"loopback":                    {file: base + "  bind_addr: 127.0.0.1\n", opts: []Option{noEnv}},
		"key from the environment":    {file: base, opts: []Option{keyEnv(nil)}},
		"insecure in the file":        {file: base + "  insecure: true\n", opts: []Option{noEnv}},
		"insecure in the environment": {file: base, opts: []Option{env(map[string]string{"KEYWAY_GOSSIP_INSECURE": "true"})}},
		"insecure by --set":           {file: base, opts: []Option{noEnv, WithSet("gossip.insecure", "true")}},
		"gossip off":                  {file: "replica_sets:\n  - name: orders\n    replicas: 1\n    static: [{name: o0, addr: \"10.0.0.1:1\"}]\n", opts: []Option{noEnv}},
		"bad key in the environment": {
			file: base + "  bind_addr: 127.0.0.1\n", opts: []Option{env(map[string]string{"KEYWAY_GOSSIP_KEY": "c2hvcnQ="})},
			want: []string{"$KEYWAY_GOSSIP_KEY: key 1 is 5 bytes; AES keys are 16, 24 or 32 bytes (32 recommended)"},
		},
		"missing key file, reported once": {
			file: base + "  key_file: " + filepath.Join(t.TempDir(), "none") + "\n", opts: []Option{noEnv},
			want: []string{"proxy.yaml:7: gossip.key_file: open …: no such file or directory"},
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

func TestLoadAgentGossipKey(t *testing.T) {
	const base = "replica: {set: orders, addr: \"10.0.0.5:9001\"}\ngossip:\n  join: [a:7946]\n"
	cases := map[string]struct {
		file string
		opts []Option
		want []string
	}{
		"default bind address": {
			file: base, opts: []Option{noEnv},
			want: []string{`agent.yaml:2: gossip.bind_addr: gossip would listen on "0.0.0.0", which is not a loopback address, without an encryption key: …, or set gossip.insecure: true if the network is trusted (default value: not in the file)`},
		},
		"advertised from the environment": {
			file: base + "  bind_addr: 127.0.0.1\n", opts: []Option{env(map[string]string{"KEYWAY_AGENT_GOSSIP_ADVERTISE_ADDR": "10.0.0.5"})},
			want: []string{`$KEYWAY_AGENT_GOSSIP_ADVERTISE_ADDR: gossip.advertise_addr: gossip would advertise "10.0.0.5"…`},
		},
		"no file": {
			opts: []Option{noEnv, WithFlag("--replica.set", "replica.set", "orders"), WithFlag("--replica.addr", "replica.addr", "10.0.0.5:1"), WithFlag("--gossip.join", "gossip.join", "a:1")},
			want: []string{`(no config file): gossip.bind_addr: gossip would listen on "0.0.0.0"…the network is trusted`},
		},
		"key":                         {file: base, opts: []Option{withKey}},
		"insecure in the environment": {file: base, opts: []Option{env(map[string]string{"KEYWAY_AGENT_GOSSIP_INSECURE": "true"})}},
		"insecure by flag":            {file: base, opts: []Option{noEnv, WithFlag("--gossip.insecure", "gossip.insecure", "true")}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var err error
			if tc.file == "" {
				_, err = LoadAgent("", tc.opts...)
			} else {
				_, err = LoadAgentBytes("agent.yaml", []byte(tc.file), tc.opts...)
			}
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
