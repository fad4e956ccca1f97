package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"keyway/membership"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"keyway/agent"
)

// This file loads the second file type, the agent's (`keyway agent -c
// FILE`), with the same decoder as the proxy's file: strict keys, located
// problems, defaults < file < environment < flags. What differs:
//
//   - the root type is agent.Config, starting from agent.DefaultConfig();
//   - environment variables are KEYWAY_AGENT_<PATH> (see AgentEnvName), a
//     namespace the proxy's KEYWAY_<PATH> names never enter because the
//     proxy's file has no top-level "agent" key (a test keeps it so);
//   - list-of-string keys (gossip.join) have an environment variable and
//     a flag too, written comma-separated ("a:7946,b:7946") or as YAML;
//   - the file is optional: with no file, or an empty one, every value comes
//     from the defaults, the environment and the flags.

// agentNoFile names the source of problems when there is no file.
const agentNoFile = "(no config file)"

// LoadAgent reads the agent's YAML file at path and returns the
// configuration it describes, with defaults, KEYWAY_AGENT_* environment
// variables and explicit overrides ([WithFlag], [WithSet]) applied and
// validated. An empty path means no file. Problems are reported together
// as an *Error; an unreadable file is a plain error wrapping the os error.
// It keeps no state and is safe for concurrent use.
func LoadAgent(path string, opts ...Option) (agent.Config, error) {
	if path == "" {
		c, _, err := loadAgent("", nil, false, opts...)
		return c, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return agent.Config{}, fmt.Errorf("read agent config: %w", err)
	}
	return LoadAgentBytes(path, data, opts...)
}

// LoadAgentBytes is LoadAgent for a file already in memory; name is used
// in problems. On error the returned Config is the zero value.
func LoadAgentBytes(name string, data []byte, opts ...Option) (agent.Config, error) {
	c, _, err := loadAgent(name, data, true, opts...)
	return c, err
}

func loadAgent(name string, data []byte, hasFile bool, opts ...Option) (agent.Config, map[string]loc, error) {
	o := options{env: os.LookupEnv, maxNodes: maxNodes}
	for _, opt := range opts {
		opt(&o)
	}
	src := name
	if !hasFile {
		src = agentNoFile
	}
	cfg := agent.DefaultConfig()
	v := reflect.ValueOf(&cfg).Elem()
	d := &decoder{src: src, positions: true, sources: []string{src}, locs: map[string]loc{}, maxNodes: o.maxNodes}
	if hasFile {
		root, probs := parseAgentDocument(name, data)
		if len(probs) > 0 {
			return agent.Config{}, nil, &Error{Problems: probs}
		}
		if root != nil {
			d.decode(root, v, "")
		}
		if d.tooBig {
			return agent.Config{}, nil, &Error{Problems: d.probs[len(d.probs)-1:]}
		}
	}

	// Precedence: defaults < file < environment < flags.
	t := v.Type()
	if o.env != nil {
		for _, p := range agentEnvPaths(t, "") {
			if val, ok := o.env(AgentEnvName(p)); ok {
				d.override(v, "$"+AgentEnvName(p), p, listValue(t, p, val))
			}
		}
	}
	for _, s := range o.sets {
		d.override(v, s.source, s.path, listValue(t, s.path, s.value))
	}

	for _, e := range leafErrors(cfg.Validate()) {
		d.validationProblem(src, e.Error())
	}
	d.checkGossipKey(src, cfg.Gossip, o.env)
	if len(d.probs) == 0 { // the credentials are checked for a valid set
		d.checkGossipCredentials(src, cfg.Gossip, membership.RoleReplica, cfg.Replica.Set, o.env)
	}
	if len(d.probs) > 0 {
		probs := sortProblems(d.sources, d.probs)
		for i := range probs {
			probs[i] = agentProblem(probs[i], hasFile, d.locs)
		}
		return agent.Config{}, nil, &Error{Problems: probs}
	}
	return cfg, d.locs, nil
}

// parseAgentDocument parses at most one YAML document whose top level is
// a mapping; an empty document (nil root) is allowed.
func parseAgentDocument(name string, data []byte) (*yaml.Node, []Problem) {
	return parseOneDocument(name, data, true, "replica, probe, drain, supervise, listen, log, gossip")
}

// agentProblem rewords a problem for the agent's file: an unknown key's
// hint names the agent's sections (the decoder's names the proxy's), and
// a required key's problem says how to set it.
func agentProblem(p Problem, hasFile bool, locs map[string]loc) Problem {
	if key, ok := strings.CutPrefix(p.Message, "unknown key "); ok && !strings.Contains(p.Message, "did you mean") {
		if k, err := unquoteKey(key); err == nil {
			if pt, ok := typeAt(reflect.TypeFor[agent.Config](), parentPath(p.Path)); ok && pt.Kind() == reflect.Struct {
				p.Message = agentUnknownKey(k, fieldsOf(pt))
			}
		}
	}
	if !hasFile {
		p.Message = strings.TrimSuffix(p.Message, " (default value: not in the file)")
	}
	if _, set := locs[p.Path]; !set && strings.HasPrefix(p.Message, "required") {
		if _, ok := typeAt(reflect.TypeFor[agent.Config](), p.Path); ok {
			p.Message = strings.TrimSuffix(p.Message, " (default value: not in the file)")
			how := fmt.Sprintf("pass --%s or set %s", p.Path, AgentEnvName(p.Path))
			if hasFile {
				how = "add it to the file, " + how
			}
			p.Message += " (" + how + ")"
		}
	}
	return p
}

// unquoteKey reads the quoted key at the start of `"name"; ...`.
func unquoteKey(s string) (string, error) {
	var k string
	end := strings.Index(s[1:], `"`)
	if !strings.HasPrefix(s, `"`) || end < 0 {
		return "", errors.New("no quoted key")
	}
	err := json.Unmarshal([]byte(s[:end+2]), &k)
	return k, err
}

// agentUnknownKey is decoder.unknownKey for the agent's file.
func agentUnknownKey(key string, fs []field) string {
	names := fieldNames(fs)
	if other := elsewhere(reflect.TypeFor[agent.Config](), key); len(other) > 0 {
		return fmt.Sprintf("unknown key %q here (%s is a key of another section); allowed keys here: %s", key, strings.Join(other, " and "), strings.Join(names, ", "))
	}
	return fmt.Sprintf("unknown key %q; allowed keys: %s", key, strings.Join(names, ", "))
}

// typeAt returns the type of the key at a dotted path without list
// indexes ("" is t itself).
func typeAt(t reflect.Type, path string) (reflect.Type, bool) {
	if path == "" {
		return t, true
	}
	for _, k := range strings.Split(path, ".") {
		if t.Kind() != reflect.Struct || isScalar(t) {
			return nil, false
		}
		f, ok := lookupField(fieldsOf(t), k)
		if !ok {
			return nil, false
		}
		t = f.typ
	}
	return t, true
}

// AgentEnvName is the environment variable that overrides an agent key:
// KEYWAY_AGENT_ followed by the path in upper case with dots as
// underscores (replica.addr → KEYWAY_AGENT_REPLICA_ADDR).
func AgentEnvName(path string) string {
	return "KEYWAY_AGENT_" + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// agentEnvPaths lists the keys of t that have an environment variable
// and a flag: every scalar and every list of scalars.
func agentEnvPaths(t reflect.Type, prefix string) []string {
	var out []string
	for _, f := range fieldsOf(t) {
		p := joinKey(prefix, f.name)
		switch {
		case isScalar(f.typ) || isScalarList(f.typ):
			out = append(out, p)
		case f.typ.Kind() == reflect.Struct:
			out = append(out, agentEnvPaths(f.typ, p)...)
		}
	}
	return out
}

func isScalarList(t reflect.Type) bool {
	return t.Kind() == reflect.Slice && !isScalar(t) && isScalar(t.Elem())
}

// listValue turns a comma-separated value for a list-of-scalars key into a
// YAML list ("a:1, b:2" → ["a:1","b:2"]; "" → []). A value that already
// is a YAML flow list ("[a, b]") and values for other keys pass unchanged.
func listValue(root reflect.Type, path, value string) string {
	t, ok := typeAt(root, path)
	if !ok || !isScalarList(t) || strings.HasPrefix(strings.TrimSpace(value), "[") {
		return value
	}
	items := []string{}
	for _, s := range strings.Split(value, ",") {
		if s = strings.TrimSpace(s); s != "" {
			items = append(items, s)
		}
	}
	b, _ := json.Marshal(items) // JSON is YAML
	return string(b)
}

// DescribeAgent lists every key of the agent's file in file order, with
// its type, default, environment variable and note; docs/agent.md's
// reference table is generated from it.
func DescribeAgent() []Field {
	notes := agentFieldDocs()
	var out []Field
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		for _, f := range fieldsOf(v.Type()) {
			fv := v.FieldByIndex(f.index)
			p := joinKey(prefix, f.name)
			switch {
			case isScalar(f.typ) || isScalarList(f.typ):
				out = append(out, Field{Path: p, Type: typeName(f.typ), Default: formatValue(fv), Env: AgentEnvName(p), Doc: notes[p]})
			case f.typ.Kind() == reflect.Struct:
				walk(fv, p)
			default:
				panic(fmt.Sprintf("config: agent key %s: unsupported field type %s", p, f.typ))
			}
		}
	}
	walk(reflect.ValueOf(agent.DefaultConfig()), "")
	return out
}

// AgentSummary describes a valid agent configuration in one line, e.g.
//
//	ok: replica orders/orders-0 at 10.0.0.5:9001, probe GET /readyz every 1s (rise 2, fall 3), drain timeout 30s, join [keyway-gossip:7946], listen 127.0.0.1:9902
func AgentSummary(c agent.Config) string {
	name := c.Replica.Name
	if name == "" {
		name = "(host name)"
	}
	listen := c.Listen
	if listen == "" {
		listen = "off"
	}
	s := fmt.Sprintf("ok: replica %s/%s at %s, probe GET %s every %s (rise %d, fall %d), drain timeout %s, join %v, listen %s",
		c.Replica.Set, name, c.Replica.Addr, c.Probe.Path, formatDuration(c.Probe.Interval), c.Probe.Rise, c.Probe.Fall,
		formatDuration(c.Drain.Timeout), c.Gossip.Join, listen)
	if len(c.Command) > 0 {
		sv := c.Supervise
		s += fmt.Sprintf(", supervises %q (restart backoff %s to %s, give up after %d restarts in %s, stop grace %s)",
			c.Command, formatDuration(sv.BackoffMin), formatDuration(sv.BackoffMax), sv.MaxRestarts, formatDuration(sv.Window),
			formatDuration(sv.StopGrace))
	}
	return s
}

// agentFieldDocs holds the one-line note of every agent key, for
// DescribeAgent, the flags' help and docs/agent.md. TestDescribeAgent
// fails when a key has no note or a note has no key.
func agentFieldDocs() map[string]string {
	return map[string]string{
		"replica.set":    "required: the replica set, as named in the proxies' replica_sets; 1 to 63 of a-z, 0-9, '-', '_'",
		"replica.name":   "the replica's ring identity, stable across restarts (e.g. a StatefulSet pod name); empty means the host name; 1 to 128 bytes, no spaces",
		"replica.addr":   "required: host:port proxies forward to and the agent probes; not 0.0.0.0 (in Kubernetes: the pod IP)",
		"replica.weight": "advisory, reported to proxies; 1 to 1000",
		"replica.zone":   "optional failure-domain label; at most 64 bytes, no spaces",

		"probe.path":          "path of the readiness probe, GET http://replica.addr/path; must start with '/'",
		"probe.interval":      "time between probe starts; the first probe waits a random part of one interval; at least 10ms",
		"probe.timeout":       "bounds one probe (answer and body); a probe that takes longer fails; at least 10ms; at most one probe is in flight",
		"probe.rise":          "consecutive passes that make a starting or recovering replica ready; 1 to 100",
		"probe.fall":          "consecutive failures that make a ready replica recovering; 1 to 100",
		"probe.expect_status": "status codes that pass, codes and ranges separated by commas, e.g. 200-399 or 200,204; redirects are not followed",

		"drain.timeout":       "on SIGTERM, the longest wait for every live proxy to report nothing in flight to the replica; 0 does not wait",
		"drain.quiet":         "extra wait after the replica is drained, before advertising stopped; 0 for none",
		"drain.probe_path":    "HTTP path on the replica answering 200 once its own pending work is done; after the proxies report it drained the agent waits for it before stopping the process and leaving. Empty: no drain probe",
		"drain.probe_timeout": "the longest wait for the drain probe; then the agent leaves anyway, with a warning; at least 100ms",
		"drain.remove":        "leave for good (scale-in): proxies drop the replica from the ring at once. false: a restart, which gets its partitions back",

		"supervise.stop_grace":   "with -- CMD: on shutdown, once drained, the agent sends SIGTERM to the process group, then SIGKILL after this long; 0 sends SIGKILL right after SIGTERM",
		"supervise.backoff_min":  "with -- CMD: delay before the first restart within supervise.window; doubled for each further one, plus a random 0-25%; at least 10ms",
		"supervise.backoff_max":  "with -- CMD: the longest restart delay before jitter; at least supervise.backoff_min",
		"supervise.max_restarts": "with -- CMD: restarts allowed within supervise.window; the next unexpected exit makes the agent give up and advertise failed; 1 to 1000",
		"supervise.window":       "with -- CMD: sliding period over which unexpected exits count, for max_restarts and the backoff's doubling; at least 1s",

		"exit_with_parent": "drain and exit, as on SIGTERM, once the process that started the agent has exited (the demo's agents go with the demo); false: the agent outlives it",
		"lock_file":        "a file the agent holds locked while it runs (its PID, set and replica inside): a second agent for the same file refuses to start, and the local runner finds its agents again after its proxy restarts; empty: none",
		"listen":           "host:port of the agent's HTTP listener (/healthz, /readyz, /metrics); empty disables it. In Kubernetes use :9902 so the kubelet can reach it",

		"log.level":                  "debug, info, warn or error",
		"log.format":                 "json or console",
		"log.access_log":             "not used by the agent; must stay false",
		"log.access.path":            "not used by the agent; must stay empty",
		"log.access.key":             "not used by the agent",
		"log.access.key_secret_file": "not used by the agent; must stay empty",

		"gossip.bind_addr":          "IP address gossip listens on (UDP and TCP); 0.0.0.0 for all interfaces",
		"gossip.bind_port":          "gossip port; 0 picks a free one, which is advertised (set one when a firewall or NetworkPolicy needs it)",
		"gossip.advertise_addr":     "IP address other members reach this one at; empty means bind_addr, or a private address of this host when bind_addr is 0.0.0.0. Set it in containers (the pod IP)",
		"gossip.advertise_port":     "advertised gossip port; 0 means the bound port",
		"gossip.join":               "required: members to join, host:port or a DNS name that resolves to several (a Kubernetes headless Service of the proxies); retried with backoff. Comma-separated in flags and the environment",
		"gossip.rejoin_interval":    "re-join the join addresses this often so a healed partition merges; 0 disables, else at least 1s",
		"gossip.label":              "prepended to every gossip packet: must match the proxies' gossip.label; at most 255 bytes",
		"gossip.key_file":           "file of base64 AES keys (16, 24 or 32 bytes), one per line: the first encrypts, all decrypt (rotation). KEYWAY_GOSSIP_KEY (comma-separated keys) takes precedence. Must match the proxies'. Required unless bind_addr and advertise_addr are loopback (or gossip.insecure)",
		"gossip.credentials_file":   "this set's agent credentials file from keyway keys (every public key, and the set's agent private key, which signs this replica's claim to its name and its reports). Required wherever a gossip key is (off loopback, unless gossip.insecure); empty on loopback: nothing is signed or checked",
		"gossip.signatures":         "required: commands not signed with the proxy key are refused. optional: also obey unsigned commands from members whose own metadata says proxy (a version without signatures), only during a rolling upgrade from that version; signed ones are verified either way",
		"gossip.insecure":           "allow gossip without an encryption key on an address off loopback; any host that reaches the gossip port can then join, claim this replica's name and drain it. Only for a trusted network; logged at error level at start. false: such an agent refuses to start",
		"gossip.forget_after":       "how long this member keeps a dead member in its own view; proxies decide ring membership with their own value; at least 1s",
		"gossip.profile":            "failure detection: lan (memberlist's LAN preset, about 5s to detect a crash) or fast (about 2s); use the proxies' value",
		"gossip.push_pull_interval": "full state sync period, bounding how stale a member's view can get; at least 1s",
	}
}

// FileKind is which of keyway's two configuration files a file is, as
// its top-level keys tell: the proxy's (keyway proxy, validate) or the
// agent's (keyway agent).
type FileKind int

const (
	// KindUnknown: no top-level key that only one of the files has (an
	// empty file, not YAML, or only listen, log and gossip).
	KindUnknown FileKind = iota
	// KindProxy: keys only the proxy's file has (replica_sets, admin, ...)
	// and none that only the agent's has.
	KindProxy
	// KindAgent: keys only the agent's file has (replica, probe, drain,
	// supervise) and none that only the proxy's has.
	KindAgent
	// KindMixed: keys of both.
	KindMixed
)

// DetectKind tells from data's top-level keys which configuration file it
// is, and returns the keys that only the agent's file has and those that
// only the proxy's has, in file order. Keys of both files (listen, log,
// gossip) and unknown keys do not count. It never fails: data that is not
// a YAML mapping is KindUnknown.
func DetectKind(data []byte) (kind FileKind, agentKeys, proxyKeys []string) {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return KindUnknown, nil, nil
	}
	proxyFields, agentFields := fieldsOf(reflect.TypeFor[Config]()), fieldsOf(reflect.TypeFor[agent.Config]())
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i].Value
		_, inProxy := lookupField(proxyFields, k)
		_, inAgent := lookupField(agentFields, k)
		switch {
		case inAgent && !inProxy:
			agentKeys = append(agentKeys, k)
		case inProxy && !inAgent:
			proxyKeys = append(proxyKeys, k)
		}
	}
	switch {
	case len(agentKeys) > 0 && len(proxyKeys) > 0:
		return KindMixed, agentKeys, proxyKeys
	case len(agentKeys) > 0:
		return KindAgent, agentKeys, nil
	case len(proxyKeys) > 0:
		return KindProxy, nil, proxyKeys
	}
	return KindUnknown, nil, nil
}
