package config

import (
	"strings"
	"testing"
)

// A port out of 0..65535 (or a port of 0 where one must be dialled) is a
// problem at start, named by its key and line, in every address key of
// both files: not a failure later when keyway binds or dials it. (The
// proxy checks its gossip keys when gossip is enabled.)
func TestPortsOutOfRange(t *testing.T) {
	noEnv := WithEnv(nil)
	const set = "replica_sets: [{name: orders, static: [{name: orders-0, addr: \"127.0.0.1:9001\"}]}]\n"
	for name, tc := range map[string]struct {
		yaml, want string
	}{
		"listen":                 {"listen: \"127.0.0.1:99999\"\n" + set, `p.yaml:1: listen: "127.0.0.1:99999" has an invalid port: use 0 to 65535 (0 picks a free port)`},
		"admin.listen":           {"admin:\n  listen: \"127.0.0.1:99999\"\n" + set, `p.yaml:2: admin.listen: "127.0.0.1:99999" has an invalid port: use 0 to 65535 (0 picks a free port)`},
		"admin.listen negative":  {"admin: {listen: \"127.0.0.1:-1\"}\n" + set, `p.yaml:1: admin.listen: "127.0.0.1:-1" has an invalid port`},
		"gossip.bind_port":       {"gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 70000}\n" + set, `p.yaml:1: gossip.bind_port: must be between 0 and 65535, got 70000`},
		"gossip.advertise_port":  {"gossip: {enabled: true, bind_addr: 127.0.0.1,\n  advertise_port: -2}\n" + set, `p.yaml:2: gossip.advertise_port: must be between 0 and 65535, got -2`},
		"gossip.join":            {"gossip: {enabled: true, bind_addr: 127.0.0.1, join: [\"10.0.0.1:7946\", \"10.0.0.2:99999\"]}\n" + set, `gossip.join[1]: "10.0.0.2:99999" has an invalid port: use 1 to 65535`},
		"static addr":            {"replica_sets: [{name: orders, static: [{name: orders-0, addr: \"127.0.0.1:65536\"}]}]\n", `p.yaml:1: replica_sets[0].static[0].addr: "127.0.0.1:65536" has an invalid port: use 1 to 65535`},
		"static addr port zero":  {"replica_sets: [{name: orders, static: [{name: orders-0, addr: \"127.0.0.1:0\"}]}]\n", `replica_sets[0].static[0].addr: "127.0.0.1:0" is not host:port with a non-zero port`},
		"listen with a bad name": {"listen: \":no-such-service\"\n" + set, `p.yaml:1: listen: ":no-such-service" has an invalid port`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadBytes("p.yaml", []byte(tc.yaml), noEnv)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v\nwant %q", err, tc.want)
			}
		})
	}
	// A valid port at each end of the range passes.
	if _, err := LoadBytes("p.yaml", []byte("listen: \"127.0.0.1:65535\"\nadmin: {listen: \"127.0.0.1:0\"}\ngossip: {enabled: true, bind_addr: 127.0.0.1, join: [\"h:1\", \"h\"]}\n"+set), noEnv); err != nil {
		t.Fatalf("valid ports: %v", err)
	}

	const agent = "replica: {set: orders, addr: \"127.0.0.1:9001\"}\ngossip: {bind_addr: 127.0.0.1, join: [\"127.0.0.1:7946\"]}\n"
	for name, tc := range map[string]struct {
		yaml string
		opts []Option
		want string
	}{
		"listen":                {"listen: \"127.0.0.1:99999\"\n" + agent, nil, `a.yaml:1: listen: "127.0.0.1:99999" has an invalid port: use 0 to 65535 (0 picks a free port)`},
		"listen from the flag":  {agent, []Option{WithFlag("--listen", "listen", ":123456")}, `--listen: listen: ":123456" has an invalid port`},
		"replica.addr":          {"replica: {set: orders, addr: \"127.0.0.1:99999\"}\ngossip: {bind_addr: 127.0.0.1, join: [\"127.0.0.1:7946\"]}\n", nil, `a.yaml:1: replica.addr: "127.0.0.1:99999" has an invalid port: use 1 to 65535`},
		"gossip.bind_port":      {agent, []Option{WithFlag("--gossip.bind_port", "gossip.bind_port", "65536")}, `gossip.bind_port: must be between 0 and 65535, got 65536`},
		"gossip.advertise_port": {agent + "listen: \"\"\n", []Option{WithFlag("--gossip.advertise_port", "gossip.advertise_port", "99999")}, `gossip.advertise_port: must be between 0 and 65535, got 99999`},
		"gossip.join":           {"replica: {set: orders, addr: \"127.0.0.1:9001\"}\ngossip: {bind_addr: 127.0.0.1, join: [\"127.0.0.1:0\"]}\n", nil, `a.yaml:2: gossip.join[0]: "127.0.0.1:0" has an invalid port: use 1 to 65535`},
	} {
		t.Run("agent "+name, func(t *testing.T) {
			_, err := LoadAgentBytes("a.yaml", []byte(tc.yaml), append(tc.opts, noEnv)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v\nwant %q", err, tc.want)
			}
		})
	}
}
