package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"keyway/balancer"
	"keyway/eventlog"
	"keyway/health"
	"keyway/proxy"
)

// env returns an environment lookup backed by a map, so tests never read or
// change the process environment.
func env(vars map[string]string) Option {
	return WithEnv(func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	})
}

// noEnv ignores the process environment.
var noEnv = WithEnv(nil)

// problems returns the lines of a *Error, failing the test for any other error.
func problems(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		t.Fatal("Load succeeded, want an error")
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("error is %T (%v), want *config.Error", err, err)
	}
	return strings.Split(ce.Error(), "\n")
}

// sameLines compares problem lines. "…" in a wanted line stands for any
// text: that part of the message is worded by a component's Validate or
// UnmarshalText, not by this package.
func sameLines(t *testing.T, got, want []string) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		if pre, suf, elided := strings.Cut(want[i], "…"); elided {
			ok = len(got[i]) >= len(pre)+len(suf) && strings.HasPrefix(got[i], pre) && strings.HasSuffix(got[i], suf)
		} else {
			ok = got[i] == want[i]
		}
	}
	if !ok {
		t.Errorf("problems:\n  got:\n\t%s\n  want:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

const fullYAML = `listen: "127.0.0.1:8081"
server:
  read_timeout: 10s
  write_timeout: 11s
  idle_timeout: 1m30s
  max_header_bytes: 32KiB
  max_conns: 500
  shutdown_timeout: 5s
  drain_idle: 2s
  reduce_memory: true
  park_idle_after: 3s
replica_sets:
  - name: orders
    match: {host: orders.example.com, path_prefix: /ingest/}
    replicas: 3
    key:
      - header: X-Tenant
      - path_segment: 2
      - query: k
    fallback: least_inflight
    failover: strict
    hash: {partitions: 271, replication_factor: 20, load: 1.5}
    timeouts: {connect: 250ms, request: 5s, idle: 30s}
    retries: {attempts: 3, idempotency_header: X-Idem}
    max_body_bytes: 1MB
    max_response_body_bytes: 2MB
    max_conns_per_replica: 64
    static:
      - {name: orders-0, addr: "10.0.0.1:9000", weight: 2, zone: a}
      - {name: orders-1, addr: "10.0.0.2:9000"}
admin:
  listen: ""
log:
  level: debug
  format: console
  access_log: true
gossip:
  enabled: true
  bind_addr: 127.0.0.1
  bind_port: 7950
  advertise_addr: 127.0.0.2
  advertise_port: 7951
  join: [proxy-0.keyway.svc, "10.0.0.9:7946"]
  rejoin_interval: 20s
  label: prod
  forget_after: 2m
  profile: fast
  push_pull_interval: 10s
health:
  all_down: fail_open
  active: {enabled: true, path: /ready, interval: 2s, timeout: 500ms, rise: 1, fall: 2, expect_status: "200,204", concurrency: 4}
  passive: {enabled: false, consecutive_failures: 3, count: [connect, 5xx], base_ejection: 5s, max_ejection: 1m, max_ejected_share: 0.25, interval: 250ms}
  supervision: {max_ejections: 3, window: 5m, cooldown: 10m}
audit: {dir: /var/lib/keyway/audit, max_file_bytes: 1048576, retain: 3, buffer: 128, memory: 50}
`

func fullConfig() Config {
	c := Default()
	c.Listen = "127.0.0.1:8081"
	c.Server = proxy.ServerConfig{
		ReadTimeout: 10 * time.Second, WriteTimeout: 11 * time.Second, IdleTimeout: 90 * time.Second,
		MaxHeaderBytes: 32 << 10, MaxConns: 500, ShutdownTimeout: 5 * time.Second, DrainIdle: 2 * time.Second, ReduceMemory: true, ParkIdleAfter: 3 * time.Second,
		MaxInflightBodyBytes: 256 << 20, BodyBufferBytes: 64 << 10,
	}
	c.ReplicaSets = []proxy.SetConfig{{
		Name:     "orders",
		Match:    proxy.MatchConfig{Host: "orders.example.com", PathPrefix: "/ingest/"},
		Replicas: 3,
		Key:      []balancer.KeySource{{Header: "X-Tenant"}, {PathSegment: 2}, {Query: "k"}},
		Fallback: balancer.FallbackLeastInflight,
		Failover: balancer.FailoverStrict,
		Hash:     balancer.HashConfig{Partitions: 271, ReplicationFactor: 20, Load: 1.5},
		Timeouts: proxy.TimeoutsConfig{Connect: 250 * time.Millisecond, Request: 5 * time.Second, Idle: 30 * time.Second},
		Retries:  proxy.RetriesConfig{Attempts: 3, IdempotencyHeader: "X-Idem"},

		MaxBodyBytes:       1000 * 1000,
		MaxConnsPerReplica: 64,
		Limits:             proxy.DefaultSetConfig().Limits,
		Run:                proxy.DefaultSetConfig().Run,
		Static: []proxy.StaticReplica{
			{Name: "orders-0", Addr: "10.0.0.1:9000", Weight: 2, Zone: "a"},
			{Name: "orders-1", Addr: "10.0.0.2:9000", Weight: 1},
		},
		MaxResponseBodyBytes: 2000 * 1000,
	}}
	c.Admin.Listen = ""
	c.Log.Level, c.Log.Format, c.Log.AccessLog = "debug", "console", true
	c.Gossip.Enabled = true
	c.Gossip.BindAddr, c.Gossip.BindPort = "127.0.0.1", 7950
	c.Gossip.AdvertiseAddr, c.Gossip.AdvertisePort = "127.0.0.2", 7951
	c.Gossip.Join = []string{"proxy-0.keyway.svc", "10.0.0.9:7946"}
	c.Gossip.RejoinInterval, c.Gossip.Label = 20*time.Second, "prod"
	c.Gossip.ForgetAfter, c.Gossip.Profile, c.Gossip.PushPullInterval = 2*time.Minute, "fast", 10*time.Second
	c.Health.AllDown = "fail_open"
	c.Health.Active = health.ActiveConfig{Enabled: true, Path: "/ready", Interval: 2 * time.Second, Timeout: 500 * time.Millisecond, Rise: 1, Fall: 2, ExpectStatus: "200,204", Concurrency: 4}
	c.Health.Passive = health.PassiveConfig{ConsecutiveFailures: 3, Count: []string{"connect", "5xx"}, BaseEjection: 5 * time.Second, MaxEjection: time.Minute, MaxEjectedShare: 0.25, Interval: 250 * time.Millisecond}
	c.Health.Supervision = health.SupervisionConfig{MaxEjections: 3, Window: 5 * time.Minute, Cooldown: 10 * time.Minute}
	c.Audit = eventlog.Config{Dir: "/var/lib/keyway/audit", MaxFileBytes: 1 << 20, Retain: 3, Buffer: 128, Memory: 50,
		SegmentBytes: 1 << 20, SegmentAge: 10 * time.Second, SpoolBytes: 64 << 20}
	return c
}

func TestLoadFullFileRoundTrip(t *testing.T) {
	got, err := LoadBytes("full.yaml", []byte(fullYAML), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if want := fullConfig(); !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	// What yaml.v3 writes, keyway reads back unchanged.
	out, err := yaml.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadBytes("marshalled.yaml", out, noEnv)
	if err != nil {
		t.Fatalf("reloading the marshalled config: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(again, got) {
		t.Fatalf("round trip changed the config:\n%s\ngot  %+v\nwant %+v", out, again, got)
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keyway.yaml")
	if err := os.WriteFile(path, []byte(fullYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, fullConfig()) {
		t.Fatalf("Load(%s) differs from LoadBytes", path)
	}
	_, err = Load(filepath.Join(t.TempDir(), "missing.yaml"), noEnv)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: got %v, want an error wrapping os.ErrNotExist", err)
	}
}

func TestListElementsStartFromDefaults(t *testing.T) {
	got, err := LoadBytes("sets.yaml", []byte(`
replica_sets:
  - name: a
    static: [{name: a-0, addr: "127.0.0.1:1"}]
  - name: b
    match: {host: b.example}
    timeouts: {request: 20s}
    static:
      - {name: b-0, addr: "127.0.0.1:2", weight: 5}
      - {name: b-1, addr: "127.0.0.1:3"}
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	a := proxy.DefaultSetConfig()
	a.Name = "a"
	a.Static = []proxy.StaticReplica{{Name: "a-0", Addr: "127.0.0.1:1", Weight: 1}}
	b := proxy.DefaultSetConfig()
	b.Name = "b"
	b.Match.Host = "b.example" // path_prefix keeps its default "/"
	b.Timeouts.Request = 20 * time.Second
	b.Static = []proxy.StaticReplica{{Name: "b-0", Addr: "127.0.0.1:2", Weight: 5}, {Name: "b-1", Addr: "127.0.0.1:3", Weight: 1}}
	want := Default()
	want.ReplicaSets = []proxy.SetConfig{a, b}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got.ReplicaSets, want.ReplicaSets)
	}
}

// A list in the file replaces the default list; its entries start from the
// entry type's defaults (zero for a key source).
func TestListReplacesDefault(t *testing.T) {
	got, err := LoadBytes("k.yaml", []byte(`
replica_sets:
  - name: a
    key: [{query: k}]
    static: [{name: a-0, addr: "127.0.0.1:1"}]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if k := got.ReplicaSets[0].Key; !reflect.DeepEqual(k, []balancer.KeySource{{Query: "k"}}) {
		t.Fatalf("key = %+v, want only the query source", k)
	}
}

func TestAnchorsAndMerge(t *testing.T) {
	got, err := LoadBytes("anchors.yaml", []byte(`
x-common: &common
  replicas: 2
  timeouts: {request: 3s}
replica_sets:
  - <<: *common
    name: a
    static: &static [{name: r-0, addr: "127.0.0.1:1"}]
  - <<: *common
    name: b
    replicas: 4
    match: {path_prefix: /b/}
    static: *static
`), noEnv)
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Path != "x-common" {
		t.Fatalf("want exactly one problem, for the unknown top-level key x-common; got %v", err)
	}
	got, err = LoadBytes("anchors.yaml", []byte(`
replica_sets:
  - &a
    name: a
    replicas: 2
    timeouts: {request: 3s}
    static: &static [{name: r-0, addr: "127.0.0.1:1"}]
  - <<: *a
    name: b
    replicas: 4
    match: {path_prefix: /b/}
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	a, b := got.ReplicaSets[0], got.ReplicaSets[1]
	if b.Name != "b" || b.Replicas != 4 || b.Timeouts.Request != 3*time.Second || b.Timeouts.Connect != time.Second || len(b.Static) != 1 || a.Replicas != 2 {
		t.Fatalf("merge: got a=%+v b=%+v", a, b)
	}
}

func TestLoadProblems(t *testing.T) {
	for name, tc := range map[string]struct {
		yaml string
		want []string
	}{
		"empty file": {
			yaml: "",
			want: []string{"f.yaml: " + emptyMessage},
		},
		"only comments": {
			yaml: "# nothing here\n\n# still nothing\n",
			want: []string{"f.yaml: " + emptyMessage},
		},
		"only a document marker": {
			yaml: "---\n",
			want: []string{"f.yaml: " + emptyMessage},
		},
		"trailing document": {
			yaml: "replica_sets: [{name: a, static: [{name: a-0, addr: \"h:1\"}]}]\n---\nlisten: \":9\"\n",
			want: []string{`f.yaml:2: a second YAML document starts here; keyway reads one document per file: remove this "---" and what follows it, or merge the documents`},
		},
		"syntax error": {
			yaml: "listen: \":8080\"\nserver:\n  max_conns: 1\n   read_timeout: 2s\n",
			want: []string{"f.yaml:4: invalid YAML: mapping values are not allowed in this context"},
		},
		"top level is a list": {
			yaml: "- listen: x\n",
			want: []string{"f.yaml:1: the top level must be a mapping of keys (listen, replica_sets, admin, ...), got a list"},
		},
		"duplicate key": {
			yaml: okSets + "log:\n  level: debug\n  format: json\n  level: warn\n",
			want: []string{`f.yaml:7: log.level: key "level" is already defined at line 5; write each key once`},
		},
		"unknown key with did-you-mean": {
			yaml: okSets + "    timeouts:\n      conect: 2s\n",
			want: []string{`f.yaml:5: replica_sets[0].timeouts.conect: unknown key "conect"; did you mean "connect"?`},
		},
		"unknown key, transposed letters": {
			yaml: "lisetn: \":1\"\n" + okSets,
			want: []string{`f.yaml:1: lisetn: unknown key "lisetn"; did you mean "listen"?`},
		},
		"unknown key, camel case": {
			yaml: "server: {maxConns: 3}\n" + okSets,
			want: []string{`f.yaml:1: server.maxConns: unknown key "maxConns"; did you mean "max_conns"?`},
		},
		"unknown key, one word of a key": {
			yaml: "server:\n  header: 3s\n" + okSets,
			want: []string{`f.yaml:2: server.header: unknown key "header"; did you mean "max_header_bytes"?`},
		},
		"unknown key, no close match": {
			yaml: "admin:\n  password: s3cret\n" + okSets,
			want: []string{`f.yaml:2: admin.password: unknown key "password"; allowed keys: listen, token_file, debug, allowed_hosts, tls`},
		},
		"unknown key from another section": {
			yaml: "level: debug\n" + okSets,
			want: []string{`f.yaml:1: level: unknown key "level" here (log.level is a key of another section); allowed keys here: listen, tls, server, replica_sets, fleet, admin, log, gossip, health, audit, runtime, kubernetes`},
		},
		"statefulset set with replicas": {
			yaml: "gossip: {enabled: true, bind_addr: 127.0.0.1}\nreplica_sets:\n  - name: orders\n    replicas: 3\n    statefulset: {name: orders}\n",
			want: []string{`f.yaml:4: replica_sets[0].replicas: the set's count is its StatefulSet's spec.replicas (orders): remove replicas here, and scale with keyway scale or kubectl scale`},
		},
		"statefulset without gossip, with run, bad names": {
			yaml: "replica_sets:\n  - name: orders\n    run: {command: [x]}\n    statefulset: {namespace: Bad_NS, name: Orders}\n",
			want: []string{
				`f.yaml:3: replica_sets[0].run.command: the replicas keyway runs announce themselves by gossip, which is off: set gossip.enabled: true, or remove the run section`,
				`f.yaml:4: replica_sets[0].statefulset: a set runs either on this machine (run) or on Kubernetes (statefulset), not both; remove one`,
				`f.yaml:4: replica_sets[0].statefulset: the pods' agents announce the replicas by gossip, which is off: set gossip.enabled: true, or remove the statefulset section`,
				`f.yaml:4: replica_sets[0].statefulset.namespace: "Bad_NS" is not a namespace name: lower-case letters, digits and '-', at most 63 characters`,
				`f.yaml:4: replica_sets[0].statefulset.name: "Orders" is not a StatefulSet name: lower-case letters, digits and '-', starting and ending with a letter or digit, at most 52 characters`,
			},
		},
		"kubernetes lease timings": {
			yaml: "kubernetes: {lease_duration: 5s, renew_deadline: 10s}\n" + okSets,
			want: []string{`f.yaml:1: kubernetes.lease_duration: must be more than renew_deadline (10s), got 5s`},
		},
		"mapping merged into itself": {
			yaml: "server: &a {<<: *a}\n" + okSets,
			want: []string{`f.yaml:1: server: << merges a mapping into itself`},
		},
		"key that is not a name": {
			yaml: "? [a]\n: 1\n" + okSets,
			want: []string{`f.yaml:1: a key must be a plain name, got a list`},
		},
		"bare integer duration": {
			yaml: okSets + "    timeouts: {connect: 5}\n",
			want: []string{`f.yaml:4: replica_sets[0].timeouts.connect: 5 is a bare number; write a duration with a unit, e.g. "5s"`},
		},
		"bare float duration": {
			yaml: "server: {read_timeout: 1.5}\n" + okSets,
			want: []string{`f.yaml:1: server.read_timeout: 1.5 is a bare number; write a duration with a unit, e.g. "1.5s"`},
		},
		"duration in words": {
			yaml: "server: {read_timeout: 2 seconds}\n" + okSets,
			want: []string{`f.yaml:1: server.read_timeout: "2 seconds" is not a duration; write a number with a unit (ns, us, ms, s, m, h), e.g. "2s", "500ms" or "1m30s"`},
		},
		"bad byte size": {
			yaml: okSets + "    max_body_bytes: 8 megabytes\n",
			want: []string{`f.yaml:4: replica_sets[0].max_body_bytes: invalid size "8 megabytes"…`},
		},
		"byte size out of range": {
			yaml: okSets + "    max_body_bytes: 2GiB\n",
			want: []string{`f.yaml:4: replica_sets[0].max_body_bytes: must be between 1B and 1GiB…`},
		},
		"reply bound out of range": {
			yaml: okSets + "    max_response_body_bytes: 0\n",
			want: []string{`f.yaml:4: replica_sets[0].max_response_body_bytes: must be between 1KiB and 1GiB, got 0B (a reply past it gets 502, or is cut once streamed: set it above the largest reply a replica sends)`},
		},
		"string for an int": {
			yaml: okSets + "    replicas: three\n",
			want: []string{`f.yaml:4: replica_sets[0].replicas: expected a whole number, got "three"`},
		},
		"quoted int": {
			yaml: okSets + "    replicas: \"3\"\n",
			want: []string{`f.yaml:4: replica_sets[0].replicas: expected a whole number, got "3"`},
		},
		"float for an int": {
			yaml: okSets + "    replicas: 2.5\n",
			want: []string{`f.yaml:4: replica_sets[0].replicas: expected a whole number, got 2.5`},
		},
		"int out of range": {
			yaml: okSets + "    replicas: 99999999999999999999\n",
			want: []string{`f.yaml:4: replica_sets[0].replicas: 99999999999999999999 is out of range for this key`},
		},
		"word for a bool": {
			yaml: "log: {access_log: yes}\n" + okSets,
			want: []string{`f.yaml:1: log.access_log: expected true or false, got "yes"`},
		},
		"mapping for a string": {
			yaml: "listen: {port: 80}\n" + okSets,
			want: []string{`f.yaml:1: listen: expected a string, got a mapping`},
		},
		"scalar for a section": {
			yaml: "server: fast\n" + okSets,
			want: []string{`f.yaml:1: server: expected a mapping of keys, got "fast"`},
		},
		"mapping for a list": {
			yaml: "replica_sets: {name: a}\n",
			want: []string{`f.yaml:1: replica_sets: expected a list, got a mapping`},
		},
		"bad enum": {
			yaml: okSets + "    failover: sometimes\n",
			want: []string{`f.yaml:4: replica_sets[0].failover: must be one of next, strict…`},
		},
		"no replica sets": {
			yaml: "listen: \":8080\"\n",
			want: []string{`f.yaml: replica_sets: at least one replica set is required…`},
		},
		"validation error at its line": {
			yaml: okSets + "    hash:\n      load: 0.5\n",
			want: []string{`f.yaml:5: replica_sets[0].hash.load: must be between 1.01 and 10…`},
		},
		"validation error of a default points at its parent": {
			yaml: okSets + "    timeouts:\n      request: 500ms\n",
			want: []string{`f.yaml:4: replica_sets[0].timeouts.connect: 1s is longer than timeouts.request… (default value: not in the file)`},
		},
		"section validation is prefixed": {
			yaml: okSets + "admin: {listen: nowhere}\nlog: {format: xml}\n",
			want: []string{
				`f.yaml:4: admin.listen: "nowhere" is not host:port…`,
				`f.yaml:5: log.format: must be json or console…`,
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := LoadBytes("f.yaml", []byte(tc.yaml), noEnv)
			sameLines(t, problems(t, err), tc.want)
		})
	}
}

// okSets is a valid replica_sets section (lines 1-3); tests append keys of
// replica_sets[0] at four spaces, or sections after it.
const okSets = `replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:9001"}]
`

func TestSeveralProblemsAtOnce(t *testing.T) {
	const file = `listen: 8080                  # 1: not host:port
server:
  read_timeout: 5               # 3: bare number
  max_conns: lots               # 4: not a number
replica_sets:
  - name: Orders                # 6: upper case
    timeouts:
      conect: 2s                # 8: typo
      request: 50ms             # 9: too short, and shorter than the default connect
    static:
      - name: orders-0
        addr: "127.0.0.1:9001"
        weight: 0               # 13: out of range
      - name: orders-0          # 14: duplicate name
        addr: "127.0.0.1:9002"
log:
  level: loud                   # 17: not a level
`
	_, err := LoadBytes("proxy.yaml", []byte(file), noEnv)
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want *Error", err)
	}
	type at struct {
		line int
		path string
	}
	var got []at
	for _, p := range ce.Problems {
		if p.File != "proxy.yaml" {
			t.Errorf("problem %q: File = %q, want proxy.yaml", p, p.File)
		}
		got = append(got, at{p.Line, p.Path})
	}
	want := []at{
		{1, "listen"},
		{3, "server.read_timeout"},
		{4, "server.max_conns"},
		{6, "replica_sets[0].name"},
		{7, "replica_sets[0].timeouts.connect"}, // the default connect, reported at timeouts:
		{8, "replica_sets[0].timeouts.conect"},
		{9, "replica_sets[0].timeouts.request"},
		{13, "replica_sets[0].static[0].weight"},
		{14, "replica_sets[0].static[1].name"},
		{17, "log.level"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems at\n%v\nwant\n%v\nfull error:\n%v", got, want, err)
	}
	if c := ce.Problems[3].Column; c != 11 {
		t.Errorf("column of the set name = %d, want 11 (the value)", c)
	}
}

func TestOverridePrecedence(t *testing.T) {
	const file = okSets + `listen: ":8080"
server: {max_conns: 100}
log: {level: warn}
`
	for name, tc := range map[string]struct {
		opts  []Option
		check func(Config) bool
	}{
		"file beats defaults": {
			opts: []Option{noEnv},
			check: func(c Config) bool {
				return c.Listen == ":8080" && c.Server.MaxConns == 100 && c.Log.Level == "warn" && c.Log.Format == "json"
			},
		},
		"env beats file": {
			opts: []Option{env(map[string]string{
				"KEYWAY_LISTEN": ":9000", "KEYWAY_SERVER_MAX_CONNS": "5000", "KEYWAY_LOG_FORMAT": "console",
				"KEYWAY_SERVER_READ_TIMEOUT": "2s", "KEYWAY_SERVER_MAX_HEADER_BYTES": "64KiB", "KEYWAY_LOG_ACCESS_LOG": "true",
			})},
			check: func(c Config) bool {
				return c.Listen == ":9000" && c.Server.MaxConns == 5000 && c.Log.Format == "console" &&
					c.Server.ReadTimeout == 2*time.Second && c.Server.MaxHeaderBytes == 64<<10 && c.Log.AccessLog
			},
		},
		"set empty env var": {
			opts:  []Option{env(map[string]string{"KEYWAY_ADMIN_LISTEN": ""})},
			check: func(c Config) bool { return c.Admin.Listen == "" },
		},
		"flags beat env": {
			opts: []Option{
				env(map[string]string{"KEYWAY_LISTEN": ":9000", "KEYWAY_LOG_LEVEL": "error"}),
				WithFlag("--listen", "listen", ":9100"),
				WithSet("log.level", "debug"),
			},
			check: func(c Config) bool { return c.Listen == ":9100" && c.Log.Level == "debug" },
		},
		"later flag wins": {
			opts:  []Option{noEnv, WithSet("log.level", "debug"), WithFlag("--log-level", "log.level", "error")},
			check: func(c Config) bool { return c.Log.Level == "error" },
		},
		"set into a list entry": {
			opts: []Option{noEnv, WithSet("replica_sets[0].replicas", "3"), WithSet("replica_sets[0].timeouts.connect", "250ms"),
				WithSet("replica_sets[0].static[0].zone", "a")},
			check: func(c Config) bool {
				s := c.ReplicaSets[0]
				return s.Replicas == 3 && s.Timeouts.Connect == 250*time.Millisecond && s.Static[0].Zone == "a"
			},
		},
		"set a whole list as YAML": {
			opts: []Option{noEnv, WithSet("replica_sets[0].key", "[{header: X-Tenant}, {query: t}]")},
			check: func(c Config) bool {
				return reflect.DeepEqual(c.ReplicaSets[0].Key, []balancer.KeySource{{Header: "X-Tenant"}, {Query: "t"}})
			},
		},
		"set a section as YAML merges into it": {
			opts:  []Option{noEnv, WithSet("server", "{read_timeout: 3s}")},
			check: func(c Config) bool { return c.Server.ReadTimeout == 3*time.Second && c.Server.MaxConns == 100 },
		},
		"strings are literal": {
			opts:  []Option{noEnv, WithSet("replica_sets[0].static[0].zone", "null # not a comment")},
			check: func(c Config) bool { return c.ReplicaSets[0].Static[0].Zone == "null # not a comment" },
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := LoadBytes("f.yaml", []byte(file), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("unexpected config: listen %q server %+v log %+v admin %+v sets %+v", c.Listen, c.Server, c.Log, c.Admin, c.ReplicaSets)
			}
		})
	}
}

func TestOverrideProblems(t *testing.T) {
	for name, tc := range map[string]struct {
		opts []Option
		want []string
	}{
		"env var with a bad number": {
			opts: []Option{env(map[string]string{"KEYWAY_SERVER_MAX_CONNS": "lots"})},
			want: []string{`$KEYWAY_SERVER_MAX_CONNS: server.max_conns: expected a whole number, got "lots"`},
		},
		"env var with a bare duration": {
			opts: []Option{env(map[string]string{"KEYWAY_SERVER_READ_TIMEOUT": "5"})},
			want: []string{`$KEYWAY_SERVER_READ_TIMEOUT: server.read_timeout: 5 is a bare number; write a duration with a unit, e.g. "5s"`},
		},
		"env var with a bad byte size": {
			opts: []Option{env(map[string]string{"KEYWAY_SERVER_MAX_HEADER_BYTES": "lots"})},
			want: []string{`$KEYWAY_SERVER_MAX_HEADER_BYTES: server.max_header_bytes: invalid size "lots"…`},
		},
		"env var that fails validation": {
			opts: []Option{env(map[string]string{"KEYWAY_LOG_LEVEL": "loud"})},
			want: []string{`$KEYWAY_LOG_LEVEL: log.level: must be one of debug, info, warn, error…`},
		},
		"flag that fails validation": {
			opts: []Option{noEnv, WithFlag("--listen", "listen", "8080")},
			want: []string{`--listen: listen: "8080" is not host:port…`},
		},
		"set with a typo in the path": {
			opts: []Option{noEnv, WithSet("lg.level", "debug")},
			want: []string{`--set: lg: unknown key "lg"; did you mean "log"?`},
		},
		"set past the end of a list": {
			opts: []Option{noEnv, WithSet("replica_sets[1].replicas", "2")},
			want: []string{`--set: replica_sets: has 1 entry, so [1] does not exist; an override can change an entry the file has, not add one`},
		},
		"set into a scalar": {
			opts: []Option{noEnv, WithSet("listen.port", "80")},
			want: []string{`--set: listen: is a single value; it has no key "port"`},
		},
		"set with a malformed path": {
			opts: []Option{noEnv, WithSet("replica_sets[x].replicas", "2")},
			want: []string{`--set: "replica_sets[x].replicas" is not a key path; list indexes are written [0], [1], ...`},
		},
		"set with invalid YAML": {
			opts: []Option{noEnv, WithSet("replica_sets[0].key", "[{header: X")},
			want: []string{`--set: replica_sets[0].key: "[{header: X" is not a valid value: line 1: did not find expected ',' or '}'`},
		},
		"file problems come first": {
			opts: []Option{env(map[string]string{"KEYWAY_LOG_LEVEL": "loud"}), WithSet("log.format", "xml")},
			want: []string{
				`f.yaml:4: server.max_conns: must be between 1 and 1000000…`,
				`$KEYWAY_LOG_LEVEL: log.level: must be one of…`,
				`--set: log.format: must be json or console…`,
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			file := okSets
			if name == "file problems come first" {
				file += "server: {max_conns: 0}\n"
			}
			_, err := LoadBytes("f.yaml", []byte(file), tc.opts...)
			sameLines(t, problems(t, err), tc.want)
		})
	}
}

// A value that failed to decode keeps its default; Validate's complaint
// about that default would be noise and is left out.
func TestDecodeErrorHidesValidationOfSameKey(t *testing.T) {
	_, err := LoadBytes("f.yaml", []byte(okSets+"    timeouts: {request: soon}\n"), noEnv)
	sameLines(t, problems(t, err), []string{
		`f.yaml:4: replica_sets[0].timeouts.request: "soon" is not a duration; write a number with a unit (ns, us, ms, s, m, h), e.g. "2s", "500ms" or "1m30s"`,
	})
}

func TestConfigValidatePaths(t *testing.T) {
	c := Default()
	c.Admin.Listen = "x"
	c.Log.Level = "loud"
	var msgs []string
	for _, e := range leafErrors(c.Validate()) {
		msgs = append(msgs, e.Error())
	}
	want := []string{
		`admin.listen: "x" is not host:port…`,
		`log.level: must be one of…`,
		`replica_sets: at least one replica set is required…`,
	}
	sameLines(t, msgs, want)
	// With gossip the sets may come from the fleet's run-time state.
	c.Gossip.Enabled = true
	for _, e := range leafErrors(c.Validate()) {
		if strings.HasPrefix(e.Error(), "replica_sets:") {
			t.Errorf("with gossip enabled: %v", e)
		}
	}
}

func TestSummary(t *testing.T) {
	c, err := LoadBytes("f.yaml", []byte(okSets+`  - name: events
    replicas: 2
    match: {path_prefix: /events/}
admin: {listen: ""}
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := "ok: 2 replica sets (orders: 1 replica declared, 1 static; events: 2 replicas declared, 0 static), listen :8080, admin off"
	if got := Summary(c); got != want {
		t.Fatalf("Summary =\n%s\nwant\n%s", got, want)
	}
}

func TestRedactedIsADeepCopy(t *testing.T) {
	c := fullConfig()
	r := Redacted(c)
	if !reflect.DeepEqual(r, c) {
		t.Fatal("Redacted changed a config that has no secrets")
	}
	r.ReplicaSets[0].Static[0].Name = "changed"
	r.ReplicaSets[0].Key[0].Header = "changed"
	if c.ReplicaSets[0].Static[0].Name != "orders-0" || c.ReplicaSets[0].Key[0].Header != "X-Tenant" {
		t.Fatal("Redacted shares slices with its input")
	}
}

func TestProblemString(t *testing.T) {
	for name, tc := range map[string]struct {
		p    Problem
		want string
	}{
		"full":    {Problem{File: "a.yaml", Line: 3, Column: 5, Path: "log.level", Message: "bad"}, "a.yaml:3: log.level: bad"},
		"no line": {Problem{File: "$KEYWAY_LISTEN", Path: "listen", Message: "bad"}, "$KEYWAY_LISTEN: listen: bad"},
		"no path": {Problem{File: "a.yaml", Line: 1, Message: "bad"}, "a.yaml:1: bad"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.p.String(); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestScalarForms(t *testing.T) {
	c, err := LoadBytes("f.yaml", []byte(okSets+"    replicas: 0x3\n    max_conns_per_replica: 1_000\n    max_body_bytes: 1000\nserver: {max_conns: +7}\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	s := c.ReplicaSets[0]
	if s.Replicas != 3 || s.MaxConnsPerReplica != 1000 || s.MaxBodyBytes != 1000 || c.Server.MaxConns != 7 {
		t.Fatalf("got replicas %d, max_conns_per_replica %d, max_body_bytes %d, max_conns %d", s.Replicas, s.MaxConnsPerReplica, s.MaxBodyBytes, c.Server.MaxConns)
	}
}

// Aliases are expanded while decoding; a small file that expands to
// millions of values is refused instead of decoded.
func TestAliasExpansionIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("replica_sets:\n  - &s\n    name: a\n    static: [")
	for i := range 200 {
		if i == 0 {
			b.WriteString(`&r {name: r, addr: "h:1"}`)
			continue
		}
		b.WriteString(", *r")
	}
	b.WriteString("]\n")
	for range 200 {
		b.WriteString("  - *s\n")
	}
	_, err := LoadBytes("laughs.yaml", []byte(b.String()), noEnv, func(o *options) { o.maxNodes = 10_000 })
	var ce *Error
	if !errors.As(err, &ce) || !strings.Contains(ce.Problems[0].Message, "expands to more than") {
		t.Fatalf("got %.300v, want the expansion limit", err)
	}
}

func TestMergedProblemsReportedOnce(t *testing.T) {
	_, err := LoadBytes("f.yaml", []byte(`replica_sets:
  - &a
    name: a
    replicas: 1
    replicas: 2
    static: [{name: a-0, addr: "h:1"}]
  - <<: *a
    name: b
    match: {path_prefix: /b/}
`), noEnv)
	sameLines(t, problems(t, err), []string{`f.yaml:5: replica_sets[0].replicas: key "replicas" is already defined at line 4; write each key once`})
}
