package config

import (
	"encoding"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"keyway/balancer"
	"keyway/proxy"
)

// Field describes one configuration key. docs/configuration.md's reference
// tables are generated from these.
type Field struct {
	// Path is the key's YAML path; "[]" stands for every entry of a list,
	// e.g. "replica_sets[].timeouts.connect".
	Path string
	// Type is one of string, bool, int, float, duration, byte size, enum
	// or list.
	Type string
	// Default is the value used when the key is left out, written as YAML
	// (`":8080"`, `30s`, `16KiB`, `[{header: X-Key}]`). Inside a list it is
	// the default of each new entry.
	Default string
	// Env is the environment variable that overrides the key, or "" for
	// keys inside lists and for lists themselves.
	Env string
	// Doc is a one-line note: unit, allowed values, what empty means.
	Doc string
}

// Describe lists every key of the configuration in file order (depth
// first), generated from the struct types and their defaults: lists first
// as a whole, then the keys of their entries.
func Describe() []Field {
	notes := fieldDocs()
	var out []Field
	var walk func(v reflect.Value, prefix string, inList bool)
	walk = func(v reflect.Value, prefix string, inList bool) {
		for _, f := range fieldsOf(v.Type()) {
			fv := v.FieldByIndex(f.index)
			p := joinKey(prefix, f.name)
			switch {
			case isScalar(f.typ) || f.typ.Kind() == reflect.Slice:
				fd := Field{Path: p, Type: typeName(f.typ), Default: formatValue(fv), Doc: notes[p]}
				if !inList && isScalar(f.typ) {
					fd.Env = envName(p)
				}
				out = append(out, fd)
				if f.typ.Kind() == reflect.Slice && !isScalar(f.typ.Elem()) {
					walk(newDefault(f.typ.Elem()), p+"[]", true)
				}
			case f.typ.Kind() == reflect.Struct:
				walk(fv, p, inList)
			default:
				panic(fmt.Sprintf("config: %s: unsupported field type %s", p, f.typ))
			}
		}
	}
	walk(reflect.ValueOf(Default()), "", false)
	return out
}

func typeName(t reflect.Type) string {
	switch reflect.Zero(t).Interface().(type) {
	case time.Duration:
		return "duration"
	case proxy.ByteSize:
		return "byte size"
	case balancer.Fallback, balancer.Failover:
		return "enum"
	}
	switch t.Kind() {
	case reflect.Slice:
		return "list"
	case reflect.Bool:
		return "bool"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "int"
	}
	return "string"
}

// formatValue writes a value the way it would be written in the file.
func formatValue(v reflect.Value) string {
	if v.Type() == durationType {
		return formatDuration(time.Duration(v.Int()))
	}
	if m, ok := v.Interface().(encoding.TextMarshaler); ok {
		b, err := m.MarshalText()
		if err == nil {
			return string(b)
		}
	}
	switch v.Kind() {
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case reflect.Slice:
		if v.Len() == 0 {
			return "[]"
		}
		var n yaml.Node
		if err := n.Encode(v.Interface()); err != nil {
			return fmt.Sprint(v.Interface())
		}
		setFlow(&n)
		b, err := yaml.Marshal(&n)
		if err != nil {
			return fmt.Sprint(v.Interface())
		}
		return strings.TrimSpace(string(b))
	}
	return fmt.Sprint(v.Interface())
}

func setFlow(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = yaml.FlowStyle
	}
	for _, c := range n.Content {
		setFlow(c)
	}
}

// formatDuration writes whole hours, minutes or seconds without the
// trailing zero units of time.Duration.String ("2m", not "2m0s").
func formatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	case d%time.Millisecond == 0:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	}
	return d.String()
}

// fieldDocs holds the one-line note of every key, for Describe and the
// reference tables in docs/configuration.md. The ranges repeat what each
// component's Validate enforces; TestDescribeDocs fails when a key has no
// note or a note has no key.
func fieldDocs() map[string]string {
	return map[string]string{
		"listen":                         "host:port of the proxy's HTTP listener; empty host means all interfaces",
		"tls.certificates":               "the proxy listener's certificates (PEM files); empty: plain HTTP. With several, the client's SNI picks the first whose DNS names (wildcards included) match; the first is served when none matches or without SNI. Turning TLS on or off needs a restart",
		"tls.certificates[].cert_file":   "the certificate, followed by its intermediates (the chain sent to clients); required",
		"tls.certificates[].key_file":    "the certificate's private key (PKCS #8, PKCS #1 or SEC 1, not encrypted); may be cert_file itself when it holds both; required",
		"tls.min_version":                "oldest TLS version accepted: 1.2 or 1.3",
		"tls.client_ca_file":             "mutual TLS: every client must present a certificate issued by a CA in this PEM file; empty: no client certificates asked for",
		"tls.watch_interval":             "how often the TLS files are read to see whether they changed (by content: renamed files and swapped symlinks count); new connections get the new certificates; 0 disables (a reload still re-reads them), else at least 1s",
		"tls.session_tickets":            "send session tickets so that clients resume sessions (a resumed handshake is much cheaper); false makes every handshake a full one",
		"server.read_timeout":            "bounds reading one whole request, body included; at least 100ms",
		"server.write_timeout":           "bounds writing one response; at least 100ms",
		"server.idle_timeout":            "closes a client keep-alive connection idle this long; at least 100ms",
		"server.max_header_bytes":        "caps a request's head, request line and headers: 414 when the request line alone is longer, 431 beyond; 1KiB to 1MiB",
		"server.max_conns":               "caps concurrent client connections (503 beyond); 1 to 1000000",
		"server.runtime_deep_sleep":      "let the Go runtime's monitor thread sleep deeply while keyway is idle; false (the default) keeps it awake, which saves a thread wake-up per request at moderate rates for 100 wake-ups a second when wholly idle; read at start only",
		"server.reduce_memory":           "free the buffers of keep-alive client connections between requests: 22 KiB → 10 KiB per idle connection, for one tiny allocation per request; park_idle_after does more for connections idle longer",
		"server.park_idle_after":         "park a plain-HTTP keep-alive client connection idle this long: its goroutine and buffers are freed and one epoll set watches the socket until the client sends again or idle_timeout closes it (measured 22 KB → 2.4 KB per idle connection, for about 27 µs of CPU when a parked connection sends again); 0 turns it off; Linux only; read at start only",
		"server.shutdown_timeout":        "how long a graceful shutdown waits for in-flight requests; at least 100ms",
		"server.drain_idle":              "how long a stopping proxy (SIGTERM, or the old process of an upgrade) keeps its idle keep-alive client connections: a request on one is answered with Connection: close instead of meeting a closed connection; then they are closed; a stop with no connection left ends at once; when systemd holds the listening socket (socket activation), a plain stop also accepts new connections meanwhile, answered with close; 0 closes them at once; at most 10m",
		"server.max_heap_bytes":          "memory guard: while the live heap (sampled every 20ms) is above this, new requests get 503 (reason memory); 0 is off, else at least 16MiB",
		"server.max_inflight_body_bytes": "bounds the request body bytes buffered, all requests and sets together, checked before each 4KiB of a body's buffer is allocated: beyond it a request gets 503 with Retry-After (reason memory); default 256MiB; 0 is off, else at least 1MiB",
		"server.body_buffer_bytes":       "how much of a request body is read before a replica connection is taken: a body that fits is buffered whole and can be replayed; a longer one is streamed after it, sent once; 16KiB to 1MiB, default 64KiB",

		"replica_sets[].run.command":          "with a command, keyway runs the set's replicas on this machine: the proxy that holds run.state_dir's lock starts one `keyway agent … -- COMMAND` per replica, and replicas is the number of running jobs (scale starts and stops them); placeholders {set}, {replica} (SET-ORDINAL), {ordinal}, {port}, {host}, {addr} (host:port), {state_dir}, {keyway} (this keyway program); empty: someone else runs the replicas and replicas is only declared",
		"replica_sets[].run.env":              "NAME=value pairs added to each replica's environment (values take the placeholders); the runner also sets variables naming the replica, its set, ordinal, port and state directory (docs/runner.md)",
		"replica_sets[].run.host":             "the host proxies reach the replicas at, and the one the command should listen on ({host}); not an all-interfaces address",
		"replica_sets[].run.port_base":        "replica N's port is port_base + N ({port}); 0 picks a free port for each replica when it first starts and keeps it in the state directory",
		"replica_sets[].run.state_dir":        "absolute directory holding STATE_DIR/{replica}, each replica's working directory, kept across restarts and scale-downs, and STATE_DIR/.runner, the runner's lock (one runner per host), the agents' configurations, locks and logs; empty: $STATE_DIRECTORY/run (systemd), else $XDG_STATE_HOME/keyway/run, else ~/.local/state/keyway/run",
		"replica_sets[].run.credentials_file": "fleet credentials the set's agents sign with (must hold the set's agent private key); empty: gossip.credentials_file",
		"replica_sets[].run.ready_path":       "the replica's readiness path, probed by its agent (200-399 passes)",
		"replica_sets[].run.probe_interval":   "time between the agent's readiness probes of a replica (2 passes make it ready); at least 10ms",
		"replica_sets[].run.drain_probe":      "a path that answers 200 once the replica's own pending work is done: a stopping replica (scale-in, restart) is waited for on it before its process stops; empty: none",
		"replica_sets[].run.drain_timeout":    "how long a stopping replica waits for every proxy to report nothing in flight to it",
		"replica_sets[].run.stop_grace":       "how long a replica has to exit after SIGTERM before SIGKILL",
		"replica_sets[].run.max_restarts":     "restarts of a crashing replica within restart_window before its agent gives up (state failed, until a repair); 1 to 1000",
		"replica_sets[].run.restart_window":   "the period over which a replica's crashes count; at least 1s",

		"fleet.id":                 "this proxy's stable ID in the fleet: the other proxies key its views, votes, run-time records and rolling restarts by it, so the old and the new process of a binary upgrade count as one proxy; empty means HOST:PORT, this machine's host name and the bound proxy port (a process that inherits the listener keeps it); 1 to 128 bytes of letters, digits, '.', '-', '_', ':'; unique in the fleet",
		"fleet.share":              "publish this proxy's evidence (ejections, probe failures, refused connections) to the other proxies and hold out what the fleet's verdict names; false keeps rotation local",
		"fleet.interval":           "how often this proxy's view goes to every other proxy and the verdict is evaluated; a proxy silent for 3 intervals is forgotten; 100ms to 10s",
		"fleet.solo_vote_max":      "how long the fleet follows evidence only one proxy has (a crash is confirmed by gossip well within it; a broken path on one proxy is not followed longer); 0 = no bound",
		"fleet.veto_window":        "a proxy vetoes others' votes against a replica it exchanged with successfully this recently (and not failed since); 100ms to 1m",
		"fleet.max_share":          "largest share of a set's ring members the fleet holds out on votes, in (0, 1]; at least one of two",
		"fleet.disagreement_bound": "another proxy routing a set differently for longer than this is logged at warn level and audited (fleet_disagreement); at least 1s",

		"gossip.enabled":            "join the gossip cluster as a proxy and route to the replicas agents advertise, beside static ones",
		"gossip.bind_addr":          "IP address gossip listens on (UDP and TCP); 0.0.0.0 for all interfaces",
		"gossip.bind_port":          "gossip port; 0 picks a free one",
		"gossip.advertise_addr":     "IP address other members reach this one at; empty means bind_addr, or a private address of this host when bind_addr is 0.0.0.0. Set it in containers",
		"gossip.advertise_port":     "advertised gossip port; 0 means the bound port",
		"gossip.join":               "members to join, host:port or a DNS name that resolves to several (a Kubernetes headless Service); retried with backoff. Empty starts a new cluster",
		"gossip.rejoin_interval":    "re-join the join addresses this often so a healed partition merges; 0 disables, else at least 1s",
		"gossip.label":              "prepended to every gossip packet: members with another label never join; at most 255 bytes",
		"gossip.key_file":           "file of base64 AES keys (16, 24 or 32 bytes), one per line: the first encrypts, all decrypt (rotation). KEYWAY_GOSSIP_KEY (comma-separated keys) takes precedence. Empty: no encryption, allowed only when bind_addr and advertise_addr are loopback (or with gossip.insecure)",
		"gossip.credentials_file":   "the fleet credentials file keyway keys writes for this node's role (a proxy's, or its set's agents'): every public key, and this role's private key. Run-time records, commands to agents, fleet views and each member's claim to its role and replica name are signed with them; what does not verify is refused and counted in keyway_gossip_rejected_total. Required wherever a gossip key is (off loopback, unless gossip.insecure); empty on loopback: nothing is signed or checked",
		"gossip.signatures":         "required: unsigned messages and claims are refused. optional: members of a keyway version without signatures are also believed (by their own metadata, as that version did), only for a rolling upgrade from that version; once every member runs this one, set required. Signed ones are verified either way",
		"gossip.insecure":           "allow gossip without an encryption key on an address off loopback; any host that reaches the gossip port can then join, take a replica's keys and drain replicas. Only for a trusted network; logged at error level at start. false: such a proxy refuses to start",
		"gossip.forget_after":       "how long a dead replica stays on the ring, out of rotation, before its partitions move for good; a restart within it gets its partitions back; at least 1s",
		"gossip.profile":            "failure detection: lan (memberlist's LAN preset, about 5s to detect a crash) or fast (about 2s, more false suspicions under CPU stalls)",
		"gossip.push_pull_interval": "full state sync period, bounding how stale a member's view can get; at least 1s",
		"gossip.isolated_not_ready": "answer /readyz 503 while this proxy is cut off from gossip (keyway_gossip_isolated 1); it keeps routing meanwhile, so set it only where a load balancer in front can send clients to the proxies that still hear the fleet",

		"health.all_down":                     "when no replica of a set is in rotation: fail_closed (503 with Retry-After) or fail_open (route by hash to the ring owner anyway); counted either way",
		"health.active.enabled":               "probe every ring member over HTTP; agents already probe their replica's readiness, so this is mostly for static replicas",
		"health.active.path":                  "path of the probe request (GET)",
		"health.active.interval":              "time between probes of one replica, the first one jittered; at least 100ms",
		"health.active.timeout":               "per-probe timeout; at least 10ms and shorter than interval",
		"health.active.rise":                  "consecutive passes that bring a failing replica back; at least 1",
		"health.active.fall":                  "consecutive failures that take a replica out of rotation; at least 1",
		"health.active.expect_status":         "status codes that pass, as codes and ranges, e.g. 200-399 or 200,204",
		"health.active.concurrency":           "probes in flight at most, across all replicas (one per replica)",
		"health.passive.enabled":              "eject replicas whose requests fail (outlier detection)",
		"health.passive.consecutive_failures": "consecutive failed requests that eject a replica, at the last of them; at least 1",
		"health.passive.count":                "which outcomes count as failures: any of connect, timeout, reset, 5xx",
		"health.passive.base_ejection":        "first ejection length; it doubles on each repeat up to max_ejection, and resets after a success",
		"health.passive.max_ejection":         "cap on one ejection's length",
		"health.passive.max_ejected_share":    "never eject more than this share of a set's replicas at once (one may always be ejected); 0 to 1",
		"health.passive.interval":             "how often ejections that are over end, and share-capped replicas are ejected once there is room",
		"health.supervision.max_ejections":    "ejections within window after which the replica is held out as failed instead of flapping; 0 disables",
		"health.supervision.window":           "the window max_ejections counts in",
		"health.supervision.cooldown":         "how long a failed hold lasts unless an operator undrains the replica first",

		"kubernetes.kubeconfig":                "the kubeconfig file keyway reads and writes StatefulSets with (sets with a statefulset section); empty: the pod's service account inside Kubernetes, else $KUBECONFIG, else ~/.kube/config",
		"kubernetes.namespace":                 "the default namespace of the sets' StatefulSets and the namespace of the Lease; empty: the pod's namespace, else the kubeconfig context's, else default",
		"kubernetes.lease":                     "the Lease the proxies elect the one that drives scale-ins, restarts and repairs with; proxies of another fleet in the same namespace need another name",
		"kubernetes.lease_duration":            "how long a Lease holder that stopped renewing keeps it: another proxy takes over (and resumes a scale-in or restart) within it",
		"kubernetes.renew_deadline":            "how long the holder keeps trying to renew before it gives the Lease up; below lease_duration",
		"kubernetes.retry_period":              "how often proxies try to take or renew the Lease; below renew_deadline",
		"kubernetes.retire_timeout":            "how long a keyway scale-in waits for the leaving replicas to drain and retire before it lowers spec.replicas anyway",
		"replica_sets[].statefulset.namespace": "the StatefulSet's namespace; empty: kubernetes.namespace",
		"replica_sets[].statefulset.name":      "the Kubernetes StatefulSet running the set's replicas (docs/kubernetes.md): its spec.replicas is the set's count (replicas may not be set), keyway scale writes it, scale-ins drain the leaving pods for good first, and jobs, restart and repair act on its pods; empty: none",

		"runtime.state_dir":    "directory keeping the fleet's run-time state (sets created, deleted, stopped or scaled through the admin API) in runtime.json, so that it survives a restart of every proxy; empty keeps it in memory (any running proxy gives it to a restarted one)",
		"audit.dir":            "directory of the audit trail: events go to DIR/NODE/events-NNNNNN.jsonl; empty keeps them in memory only (the admin API's recent events)",
		"audit.max_file_bytes": "a file is rotated before it would exceed this many bytes; at least 4096",
		"audit.retain":         "files kept per node, the oldest deleted; at least 1",
		"audit.buffer":         "events queued for the writer; beyond, new events are dropped and counted, never blocking routing",
		"audit.memory":         "most recent events kept in memory for the admin API",
		"audit.sink":           "object storage the events are also written to, s3://BUCKET/PREFIX: segments under PREFIX/SET/run-RUN/events-NNNNNN.jsonl; credentials and endpoint from the AWS_* environment (AWS_ENDPOINT_URL for S3-compatible servers) or workload identity; empty: off",
		"audit.segment_bytes":  "a set's segment is uploaded once it reaches this many bytes",
		"audit.segment_age":    "or once its first event is this old: a crash loses at most this much",
		"audit.spool_bytes":    "segments kept while the store is unreachable, uploaded in order when it is back; beyond, dropped and counted. With audit.dir they are files in DIR/NODE/spool, uploaded first by the node's next process after a stop or a crash; without, in memory",
		"audit.path_style":     "address objects as ENDPOINT/BUCKET/KEY, as SeaweedFS and MinIO on host:port need",

		"replica_sets":                                   "the replica sets; at least one is required. A request goes to the matching set with the longest host, then the longest path prefix",
		"replica_sets[].name":                            "required, unique; 1 to 63 of a-z, 0-9, '-', '_' (used in metrics, logs and gossip)",
		"replica_sets[].match.host":                      "exact Host header, port ignored, case-insensitive; empty matches any host",
		"replica_sets[].match.path_prefix":               "start of the raw request path; must start with '/'. No two sets may have the same host and path_prefix",
		"replica_sets[].replicas":                        "declared replica count, which decides the set's phase; with a run section, the number of jobs keyway runs; 1 to 1000",
		"replica_sets[].key":                             "where a request's key is looked for, in order; the first source present wins. Each entry sets exactly one of header, path_segment, query",
		"replica_sets[].key[].header":                    "a request header, matched case-insensitively, e.g. X-Key",
		"replica_sets[].key[].path_segment":              "1-based path segment, 1 to 64: 2 takes abc from /ingest/abc/more",
		"replica_sets[].key[].query":                     "a query-string parameter, e.g. key",
		"replica_sets[].fallback":                        "requests without a key: round_robin, least_inflight (power of two choices), random, or reject (400 naming the sources tried)",
		"replica_sets[].failover":                        "when a key's owner is out of rotation: next (the next in-rotation replica along the ring, the same on every proxy) or strict (503 with Retry-After)",
		"replica_sets[].hash.partitions":                 "partitions keys are hashed into; 1 to 65521, keep it much larger than the replica count; must match on every proxy",
		"replica_sets[].hash.replication_factor":         "virtual nodes per replica on the ring; 1 to 1000; must match on every proxy",
		"replica_sets[].hash.load":                       "bounded-load factor: no replica owns more than load × partitions / replicas; 1.01 to 10; must match on every proxy",
		"replica_sets[].timeouts.connect":                "bounds dialing a replica; at least 10ms and not longer than timeouts.request",
		"replica_sets[].timeouts.request":                "bounds the whole exchange with replicas, retries included; at least 100ms",
		"replica_sets[].timeouts.idle":                   "closes a pooled replica connection idle this long; at least 1s, keep it below the replica's own keep-alive timeout",
		"replica_sets[].tls.enabled":                     "reach the set's replicas over TLS (docs/proxy.md, TLS to replicas); off: plain HTTP and the other tls keys are ignored",
		"replica_sets[].tls.ca_file":                     "PEM file of the CAs that sign the replicas' certificates; empty: the system's roots; re-read on every reload",
		"replica_sets[].tls.cert_file":                   "PEM client certificate for replicas that require one (mTLS); with key_file, both or neither; re-read on every reload",
		"replica_sets[].tls.key_file":                    "PEM private key of cert_file; must match it",
		"replica_sets[].tls.server_name":                 "name verified in each replica's certificate and sent as SNI; {replica} stands for the replica's name (e.g. {replica}.orders.default.svc); empty: the host of the replica's address",
		"replica_sets[].tls.min_version":                 "oldest TLS version accepted: 1.2 (what empty means) or 1.3",
		"replica_sets[].tls.insecure_skip_verify":        "accept any replica certificate, unverified: for tests only; warned about at every start, reload and keyway validate",
		"replica_sets[].retries.attempts":                "total tries per request, the first included (1 disables retries); 1 to 8",
		"replica_sets[].retries.idempotency_header":      "a request carrying this header may be replayed after its fate is unknown; empty disables",
		"replica_sets[].max_body_bytes":                  "caps a request body (413 beyond); 1B to 1GiB",
		"replica_sets[].max_response_body_bytes":         "caps a reply body from the set's replicas: one whose Content-Length is larger gets 502 (upstream kind reply_too_large, not retried); replies beyond server.body_buffer_bytes are streamed, and one that passes the cap while streamed is cut there, both connections closed; 1KiB to 1GiB, no unbounded",
		"replica_sets[].max_conns_per_replica":           "keep-alive connection pool size per replica; 1 to 100000",
		"replica_sets[].static":                          "replicas given here rather than discovered by gossip; always on the ring",
		"replica_sets[].static[].name":                   "required, unique in the set: the replica's ring identity; 1 to 128 bytes, no spaces",
		"replica_sets[].static[].addr":                   "required, unique in the set: host:port of the replica's HTTP listener, non-zero port",
		"replica_sets[].static[].weight":                 "advisory, reported only; 1 to 1000",
		"replica_sets[].static[].zone":                   "optional failure-domain label",
		"replica_sets[].limits.max_inflight_per_replica": "requests forwarded to one replica at once; beyond, keyed requests get overload_status (reason overloaded), keyless ones go to the next replica; 0 means max_conns_per_replica, at most that",
		"replica_sets[].limits.max_queued_per_replica":   "requests that may wait, first come first served, for a slot of a replica at max_inflight_per_replica; beyond, shed at once (reason overloaded); 0 (default) is no queue, at most 4096",
		"replica_sets[].limits.max_queue_wait":           "longest wait in a replica's queue (the request's timeout bounds it too); beyond, overload_status (reason queue_timeout); 1ms to 10s",
		"replica_sets[].limits.max_inflight":             "the set's requests in flight on this proxy; beyond, overload_status (reason set_overloaded); 0 is unbounded, at most 10000000",
		"replica_sets[].limits.overload_status":          "status of an answer shed by these limits: 503 (the set is full) or 429 (the clients are the cause)",
		"replica_sets[].limits.pressure_header":          "response header by which a replica says \"saturated\": its keyed requests get 503 (reason replica_saturated) for the answer's Retry-After (1s without), not moved; empty disables",
		"replica_sets[].limits.max_pressure_hold":        "caps how long one saturated answer sheds its replica's requests; 100ms to 1m",
		"replica_sets[].stopped":                         "stop the set: requests get 503 with Retry-After, its phase is Stopped, its agents drain their replicas and stop the processes they supervise; a run-time stop or start (PATCH /v1/replica_sets/{set}) overrides it",
		"replica_sets[].route_context.header":            "header telling the replica how keyway routed each attempt: partition, stand-in flag, ring identifier, the key routed by and the ring owner (format in docs/proxy.md, Route context), e.g. X-Keyway-Route; replaces a client's header of that name; not a hop-by-hop, forwarding, key or idempotency header; empty disables",

		"admin.listen":                       "host:port of the admin listener (/metrics, /healthz, /readyz); empty disables it",
		"admin.tls.certificates":             "the admin listener's certificates, as tls.certificates; empty: plain HTTP",
		"admin.tls.certificates[].cert_file": "as tls.certificates[].cert_file",
		"admin.tls.certificates[].key_file":  "as tls.certificates[].key_file",
		"admin.tls.min_version":              "as tls.min_version",
		"admin.tls.client_ca_file":           "as tls.client_ca_file: clients of the admin API (keyway CLI, Prometheus, the dashboard's browser) must present a certificate",
		"admin.tls.watch_interval":           "as tls.watch_interval",
		"admin.tls.session_tickets":          "as tls.session_tickets",
		"admin.token_file":                   "file holding the bearer token of the admin API's mutating endpoints (drain, undrain); the admin token environment variable overrides it (docs/admin.md); a token is required when admin.listen is not loopback",
		"admin.debug":                        "who may read /debug/pprof/ and /v1/config: auto (anyone on a loopback admin.listen, the bearer token on any other), token (always the token), open (anyone who reaches the listener), off (neither is served)",
		"admin.allowed_hosts":                "names requests may carry as their Host besides IP addresses, localhost, *.localhost, the machine's host name and admin.listen's host (any port); \"*.example.com\" for every name under example.com, \"*\" for any Host; any other Host is 421, a guard against DNS rebinding (docs/admin.md)",
		"log.level":                          "debug, info, warn or error",
		"log.format":                         "json or console",
		"log.access_log":                     "write the access log: one JSON line per request, to stdout or log.access.path (docs/logging.md)",
		"log.access.path":                    "file the access log is appended to (created 0640; its directory must exist), reopened on SIGUSR1 for log rotation; empty or stdout: stdout. Needs log.access_log: true",
		"log.access.key":                     "whether lines carry the request's key: omit (it may be personal data), hmac (HMAC-SHA256 with the key secret, 16 hex digits: correlate without reading) or plain. A key path segment always shows as {key}. Needs log.access_log: true",
		"log.access.key_secret_file":         "file holding the secret of key: hmac, at least 16 bytes (e.g. openssl rand -hex 32 > FILE); KEYWAY_ACCESS_LOG_KEY_SECRET takes precedence. Use one secret on every proxy to correlate keys across them",
	}
}
