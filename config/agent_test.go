package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/agent"
)

const agentDocsPath = "../docs/agent.md"

const agentYAML = `replica:
  set: orders
  name: orders-0
  addr: "10.0.0.5:9001"
  weight: 3
  zone: eu-1
probe:
  path: /ready
  interval: 2s
  timeout: 1s
  rise: 1
  fall: 5
  expect_status: "200,204"
drain:
  timeout: 1m
  quiet: 2s
  remove: true
listen: ":9902"
log: {level: debug, format: console}
gossip:
  bind_addr: 10.0.0.5
  join: [keyway-gossip:7946, 10.0.0.9:7946]
  label: prod
`

// testGossipKey is a gossip key for configurations that gossip off
// loopback.
const testGossipKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

// withKey is an environment holding only KEYWAY_GOSSIP_KEY.
var withKey = keyEnv(nil)

func TestLoadAgentBytes(t *testing.T) {
	c, err := LoadAgentBytes("agent.yaml", []byte(agentYAML), withKey)
	if err != nil {
		t.Fatal(err)
	}
	want := agent.DefaultConfig()
	want.Replica = agent.ReplicaConfig{Set: "orders", Name: "orders-0", Addr: "10.0.0.5:9001", Weight: 3, Zone: "eu-1"}
	want.Probe = agent.ProbeConfig{Path: "/ready", Interval: 2 * time.Second, Timeout: time.Second, Rise: 1, Fall: 5, ExpectStatus: "200,204"}
	want.Drain = agent.DrainConfig{Timeout: time.Minute, Quiet: 2 * time.Second, Remove: true, ProbeTimeout: time.Minute}
	want.Listen = ":9902"
	want.Log.Level, want.Log.Format = "debug", "console"
	want.Gossip.BindAddr = "10.0.0.5"
	want.Gossip.Join = []string{"keyway-gossip:7946", "10.0.0.9:7946"}
	want.Gossip.Label = "prod"
	want.Gossip.CredentialsFile = testCredentials
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
	if got := AgentSummary(c); got != "ok: replica orders/orders-0 at 10.0.0.5:9001, probe GET /ready every 2s (rise 1, fall 5), drain timeout 1m, join [keyway-gossip:7946 10.0.0.9:7946], listen :9902" {
		t.Errorf("AgentSummary: %s", got)
	}
}

// No file at all, and an empty file: everything from flags and environment.
func TestLoadAgentWithoutFile(t *testing.T) {
	flags := []Option{noEnv,
		WithFlag("--replica.set", "replica.set", "orders"),
		WithFlag("--replica.addr", "replica.addr", "127.0.0.1:9001"),
		WithFlag("--gossip.join", "gossip.join", "127.0.0.1:7946"),
		WithFlag("--gossip.bind_addr", "gossip.bind_addr", "127.0.0.1"),
	}
	for name, load := range map[string]func() (agent.Config, error){
		"no file":       func() (agent.Config, error) { return LoadAgent("", flags...) },
		"empty file":    func() (agent.Config, error) { return LoadAgentBytes("agent.yaml", nil, flags...) },
		"comments only": func() (agent.Config, error) { return LoadAgentBytes("agent.yaml", []byte("# nothing\n"), flags...) },
	} {
		t.Run(name, func(t *testing.T) {
			c, err := load()
			if err != nil {
				t.Fatal(err)
			}
			if c.Replica.Set != "orders" || c.Replica.Addr != "127.0.0.1:9001" || !slices.Equal(c.Gossip.Join, []string{"127.0.0.1:7946"}) ||
				c.Probe.Interval != time.Second || c.Listen != "127.0.0.1:9902" || c.Gossip.BindPort != 0 {
				t.Fatalf("%+v", c)
			}
		})
	}
	_, err := LoadAgent("", noEnv, WithFlag("--replica.set", "replica.set", "orders"))
	sameLines(t, problems(t, err), []string{
		"(no config file): replica.addr: required: host:port proxies use to reach the replica, e.g. 10.0.0.5:9001 (pass --replica.addr or set KEYWAY_AGENT_REPLICA_ADDR)",
		"(no config file): gossip.join: required: … (pass --gossip.join or set KEYWAY_AGENT_GOSSIP_JOIN)",
		`(no config file): gossip.bind_addr: gossip would listen on "0.0.0.0", which is not a loopback address, without an encryption key: …`,
	})
	if _, err := LoadAgent("/nonexistent/agent.yaml"); err == nil || !strings.Contains(err.Error(), "read agent config") {
		t.Fatalf("missing file: %v", err)
	}
}

// defaults < file < environment < flags, key by key; lists from the
// environment and flags are comma-separated or YAML.
func TestLoadAgentPrecedence(t *testing.T) {
	file := []byte("replica: {set: orders, addr: \"127.0.0.1:9001\"}\nprobe: {interval: 2s, timeout: 1s, rise: 4}\ngossip: {join: [file:7946]}\n")
	vars := map[string]string{
		"KEYWAY_AGENT_PROBE_TIMEOUT":  "300ms",
		"KEYWAY_AGENT_PROBE_RISE":     "5",
		"KEYWAY_AGENT_GOSSIP_JOIN":    " a:7946, b:7946 ,",
		"KEYWAY_AGENT_LISTEN":         "",      // set but empty: disables the listener
		"KEYWAY_LOG_LEVEL":            "debug", // the proxy's variable: ignored
		"KEYWAY_AGENT_DRAIN_REMOVE":   "true",
		"KEYWAY_AGENT_REPLICA_WEIGHT": "7",
		"KEYWAY_GOSSIP_KEY":           testGossipKey,
	}
	c, err := LoadAgentBytes("agent.yaml", file, keyEnv(vars), WithFlag("--probe.rise", "probe.rise", "6"), WithFlag("--replica.weight", "replica.weight", "8"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Probe.Interval != 2*time.Second || c.Probe.Timeout != 300*time.Millisecond || c.Probe.Rise != 6 || c.Probe.Fall != 3 ||
		!slices.Equal(c.Gossip.Join, []string{"a:7946", "b:7946"}) || c.Listen != "" || c.Log.Level != "info" || !c.Drain.Remove || c.Replica.Weight != 8 {
		t.Fatalf("%+v", c)
	}
	c, err = LoadAgentBytes("agent.yaml", file, noEnv, WithFlag("--gossip.join", "gossip.join", "[x:1, y:2]"), WithFlag("--gossip.insecure", "gossip.insecure", "true"))
	if err != nil || !slices.Equal(c.Gossip.Join, []string{"x:1", "y:2"}) || !c.Gossip.Insecure {
		t.Fatalf("YAML list flag: %v %v insecure %v", err, c.Gossip.Join, c.Gossip.Insecure)
	}
}

func TestLoadAgentProblems(t *testing.T) {
	cases := map[string]struct {
		file string
		opts []Option
		want []string
	}{
		"unknown keys name the agent's sections": {
			file: "replica: {set: orders, addr: \"127.0.0.1:9001\", nmae: x, static: []}\nlevel: debug\nreplica_sets: []\ngossip: {join: [a:1]}\n",
			want: []string{
				`agent.yaml:1: replica.nmae: unknown key "nmae"; did you mean "name"?`,
				`agent.yaml:1: replica.static: unknown key "static"; allowed keys: set, name, addr, weight, zone`,
				`agent.yaml:2: level: unknown key "level" here (log.level is a key of another section); allowed keys here: replica, probe, drain, supervise, listen, log, gossip, lock_file, exit_with_parent`,
				`agent.yaml:3: replica_sets: unknown key "replica_sets"; allowed keys: replica, probe, drain, supervise, listen, log, gossip, lock_file, exit_with_parent`,
			},
		},
		"values": {
			file: "replica:\n  set: Orders\n  addr: \"0.0.0.0:9001\"\nprobe:\n  interval: 5\n  rise: two\n  expect_status: 2xx\ndrain: {timeout: soon}\ngossip: {join: a:1}\n",
			want: []string{
				`agent.yaml:2: replica.set: "Orders" is not a valid set name…`,
				`agent.yaml:3: replica.addr: "0.0.0.0:9001" is an all-interfaces address…`,
				`agent.yaml:5: probe.interval: 5 is a bare number; write a duration with a unit, e.g. "5s"`,
				`agent.yaml:6: probe.rise: expected a whole number, got "two"`,
				`agent.yaml:7: probe.expect_status: "2xx" is not a status code or a range such as 200-399`,
				`agent.yaml:8: drain.timeout: "soon" is not a duration…`,
				`agent.yaml:9: gossip.join: expected a list, got "a:1"`,
			},
		},
		"required keys in a file": {
			file: "probe: {path: /ready}\n",
			want: []string{
				"agent.yaml: replica.set: required: the replica set this replica belongs to, e.g. orders (add it to the file, pass --replica.set or set KEYWAY_AGENT_REPLICA_SET)",
				"agent.yaml: replica.addr: required: … (add it to the file, pass --replica.addr or set KEYWAY_AGENT_REPLICA_ADDR)",
				"agent.yaml: gossip.join: required: … (add it to the file, pass --gossip.join or set KEYWAY_AGENT_GOSSIP_JOIN)",
			},
		},
		"environment and flags are named": {
			file: "replica: {set: orders, addr: \"127.0.0.1:9001\"}\ngossip: {join: [a:1]}\n",
			opts: []Option{keyEnv(map[string]string{"KEYWAY_AGENT_PROBE_FALL": "0", "KEYWAY_AGENT_DRAIN_QUIET": "1"}), WithFlag("--log.level", "log.level", "loud")},
			want: []string{
				"$KEYWAY_AGENT_PROBE_FALL: probe.fall: must be between 1 and 100, got 0",
				`$KEYWAY_AGENT_DRAIN_QUIET: drain.quiet: 1 is a bare number; write a duration with a unit, e.g. "1s"`,
				`--log.level: log.level: must be one of debug, info, warn, error, got "loud"`,
			},
		},
		"not a mapping": {
			file: "- replica\n",
			want: []string{`agent.yaml:1: the top level must be a mapping of keys (replica, probe, drain, supervise, listen, log, gossip), got a list`},
		},
		"two documents": {
			file: "replica: {set: orders}\n---\nlisten: x\n",
			want: []string{`agent.yaml:2: a second YAML document starts here…`},
		},
		"syntax": {
			file: "replica: [\n",
			want: []string{`agent.yaml:1: invalid YAML: …`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := append([]Option{withKey}, tc.opts...)
			_, err := LoadAgentBytes("agent.yaml", []byte(tc.file), opts...)
			sameLines(t, problems(t, err), tc.want)
		})
	}
}

func TestDescribeAgent(t *testing.T) {
	fields := DescribeAgent()
	notes := agentFieldDocs()
	paths := map[string]bool{}
	envs := map[string]bool{}
	for _, f := range fields {
		if paths[f.Path] || envs[f.Env] {
			t.Errorf("%s (%s) is described twice", f.Path, f.Env)
		}
		paths[f.Path], envs[f.Env] = true, true
		if f.Doc == "" || f.Type == "" || f.Default == "" || f.Env != AgentEnvName(f.Path) {
			t.Errorf("%+v: want a note, a type, a default and %s", f, AgentEnvName(f.Path))
		}
	}
	for p := range notes {
		if !paths[p] {
			t.Errorf("agentFieldDocs has a note for %q, which is not a key", p)
		}
	}
	// The environment variables shown are the ones LoadAgent reads.
	var fromLoad []string
	for _, p := range agentEnvPaths(reflect.TypeFor[agent.Config](), "") {
		fromLoad = append(fromLoad, AgentEnvName(p))
	}
	var fromDescribe []string
	for _, f := range fields {
		fromDescribe = append(fromDescribe, f.Env)
	}
	if !slices.Equal(fromLoad, fromDescribe) {
		t.Errorf("env vars: LoadAgent reads %v, DescribeAgent lists %v", fromLoad, fromDescribe)
	}
	for _, want := range []Field{
		{Path: "replica.name", Type: "string", Default: `""`, Env: "KEYWAY_AGENT_REPLICA_NAME"},
		{Path: "probe.interval", Type: "duration", Default: "1s", Env: "KEYWAY_AGENT_PROBE_INTERVAL"},
		{Path: "probe.expect_status", Type: "string", Default: `"200-399"`, Env: "KEYWAY_AGENT_PROBE_EXPECT_STATUS"},
		{Path: "drain.timeout", Type: "duration", Default: "30s", Env: "KEYWAY_AGENT_DRAIN_TIMEOUT"},
		{Path: "drain.remove", Type: "bool", Default: "false", Env: "KEYWAY_AGENT_DRAIN_REMOVE"},
		{Path: "listen", Type: "string", Default: `"127.0.0.1:9902"`, Env: "KEYWAY_AGENT_LISTEN"},
		{Path: "gossip.join", Type: "list", Default: "[]", Env: "KEYWAY_AGENT_GOSSIP_JOIN"},
		{Path: "gossip.bind_port", Type: "int", Default: "0", Env: "KEYWAY_AGENT_GOSSIP_BIND_PORT"},
	} {
		i := slices.IndexFunc(fields, func(f Field) bool { return f.Path == want.Path })
		if i < 0 {
			t.Errorf("%s is not described", want.Path)
			continue
		}
		got := fields[i]
		got.Doc = ""
		if got != want {
			t.Errorf("DescribeAgent: got %+v, want %+v", got, want)
		}
	}
	// The two files' variables can never collide: no proxy variable enters
	// the KEYWAY_AGENT_ namespace.
	for _, f := range Describe() {
		if strings.HasPrefix(f.Env, "KEYWAY_AGENT_") {
			t.Errorf("proxy key %s uses %s, in the agent's namespace", f.Path, f.Env)
		}
	}
}

// examples/agent.yaml validates and sets every key.
func TestAgentExample(t *testing.T) {
	data, err := os.ReadFile("../examples/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, locs, err := loadAgent("agent.yaml", data, true, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range DescribeAgent() {
		if l, ok := locs[f.Path]; !ok || l.line == 0 {
			t.Errorf("examples/agent.yaml does not set %s", f.Path)
		}
	}
	if c.Replica.Set != "orders" || c.Replica.Addr != "127.0.0.1:9001" {
		t.Fatalf("%+v", c.Replica)
	}
}

// docs/agent.md's reference table is what DescribeAgent generates (go test
// ./config -run TestAgentDocs -update rewrites it), and every
// KEYWAY_AGENT_* variable it names exists.
func TestAgentDocs(t *testing.T) {
	data, err := os.ReadFile(agentDocsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	const begin = "<!-- BEGIN AGENT REFERENCE: generated by `go test ./config -run TestAgentDocs -update`; edit config/agent.go, not this table -->"
	start, end := strings.Index(doc, begin), strings.Index(doc, endMarker)
	if start < 0 || end < start {
		t.Fatalf("%s: reference markers missing:\n%s\n%s", agentDocsPath, begin, endMarker)
	}
	var b strings.Builder
	b.WriteString("\n| Key | Type | Default | Environment | Allowed values, unit, meaning |\n|---|---|---|---|---|\n")
	for _, f := range DescribeAgent() {
		b.WriteString("| `" + f.Path + "` | " + f.Type + " | `" + f.Default + "` | `" + f.Env + "` | " + strings.ReplaceAll(f.Doc, "|", `\|`) + " |\n")
	}
	b.WriteString("\n")
	table := b.String()
	if *update {
		doc = doc[:start+len(begin)] + table + doc[end:]
		if err := os.WriteFile(agentDocsPath, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if doc[start+len(begin):end] != table {
		t.Errorf("%s: the reference table is out of date; run: go test ./config -run TestAgentDocs -update", agentDocsPath)
	}
	envs := map[string]bool{}
	for _, f := range DescribeAgent() {
		envs[f.Env] = true
	}
	for _, e := range regexp.MustCompile(`KEYWAY_AGENT_[A-Z0-9_]*[A-Z0-9]`).FindAllString(doc, -1) {
		if !envs[e] {
			t.Errorf("%s names %s, which is not an environment variable the agent reads", agentDocsPath, e)
		}
	}
}
