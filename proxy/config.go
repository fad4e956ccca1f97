package proxy

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"keyway/balancer"
	"keyway/kube"
	"keyway/proxy/internal/wire"
	"keyway/runner"
	"keyway/tlsconfig"
)

// Config configures the proxy: its listener, server limits and the replica
// sets it routes to. In the YAML file these keys sit at the top level.
type Config struct {
	// Listen is the address of the proxy's HTTP listener. Default ":8080".
	Listen string `yaml:"listen"`
	// TLS makes the listener serve HTTPS: certificates chosen by SNI, a
	// minimum version, optional client certificates, files re-read on
	// reload and when they change. Without certificates (the default) the
	// listener speaks plain HTTP.
	TLS tlsconfig.ServerConfig `yaml:"tls"`
	// Server holds the front end's limits and timeouts.
	Server ServerConfig `yaml:"server"`
	// ReplicaSets lists the replica sets; at least one is required. A
	// request belongs to the first set whose match it satisfies, most
	// specific first (see MatchConfig).
	ReplicaSets []SetConfig `yaml:"replica_sets"`
	// Gone are the routes of replica sets deleted at run time (the
	// fleet's tombstones; config.ApplyRuntime fills it in, a file never
	// does): a request one matches more specifically than any set served
	// gets 410 Gone naming the deleted set, rather than falling through to
	// a broader set: one pipeline's data does not land in another's.
	Gone []GoneRoute `yaml:"-"`
	// Fleet says how this proxy shares its evidence with the other
	// proxies and follows theirs (with gossip on).
	Fleet FleetConfig `yaml:"fleet"`
}

// GoneRoute is the route of a replica set deleted at run time.
type GoneRoute struct {
	Set   string
	Match MatchConfig
}

// ServerConfig bounds what one client may cost the proxy.
type ServerConfig struct {
	// ReadTimeout bounds reading one whole request, body included. Default
	// 30s; at least 100ms.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing one response. Default 30s; at least 100ms.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout closes a keep-alive connection idle this long. Default
	// 120s; at least 100ms.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes caps a request's head, request line and headers (431
	// beyond; 414 when the request line alone is longer). Default 16KiB;
	// allowed 1KiB..1MiB.
	MaxHeaderBytes ByteSize `yaml:"max_header_bytes"`
	// MaxConns caps concurrent client connections; over it new connections
	// get 503. Default 10000; allowed 1..1000000.
	MaxConns int `yaml:"max_conns"`
	// ShutdownTimeout is how long a graceful shutdown waits for in-flight
	// requests before closing connections. Default 30s; at least 100ms.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// DrainIdle is the grace a stopping proxy gives its idle keep-alive
	// client connections (parked ones included): a request arriving on
	// one within it is answered, with Connection: close, instead of
	// meeting a connection closed under it. Connections still idle after
	// it are closed. A stop that has no connection left ends at once.
	// Default 5s; 0 closes idle connections at once; at most 10m.
	DrainIdle time.Duration `yaml:"drain_idle"`
	// ReduceMemory frees the buffers of idle keep-alive client
	// connections: measured 22 KiB → 10 KiB per idle connection (the rest
	// is mostly the connection's goroutine stack), at the cost of a
	// one-byte allocation per request on a reused connection and no
	// measurable CPU. Default false (the request path allocates nothing).
	ReduceMemory bool `yaml:"reduce_memory"`
	// ParkIdleAfter parks a plain-HTTP keep-alive client connection idle
	// this long: its goroutine ends and its buffers are released, and
	// one epoll set holds the socket until the client sends again (then
	// it is served on a new goroutine) or idle_timeout closes it.
	// Measured 22 KB → 2.4 KB of memory per idle connection; waking one
	// costs about 27 µs of CPU, once per idle spell. Default 2s; 0
	// turns it off; else at least 100ms. Nothing parks when it is not
	// below idle_timeout. Linux only; read at start only.
	ParkIdleAfter time.Duration `yaml:"park_idle_after"`
	// RuntimeDeepSleep lets the Go runtime's monitor thread (sysmon)
	// sleep deeply while keyway is idle, as Go programs do by default.
	// Default false: `keyway proxy` starts itself with sysmon kept out of
	// deep sleep (see cmd/keyway), because at a moderate request rate
	// the process goes idle between requests and waking sysmon again
	// cost every request a futex wake and two context switches
	// (measured 73 → 50 µs of CPU per request at 3,000 req/s). The price
	// is sysmon's 100 wake-ups a second while keyway is wholly idle.
	// Read at start only.
	RuntimeDeepSleep bool `yaml:"runtime_deep_sleep"`
	// MaxHeapBytes is the memory guard: while the process's live heap
	// (sampled every 20ms) is above it, new requests are shed with 503
	// (reason memory). Default 0: off; else at least 16MiB.
	MaxHeapBytes ByteSize `yaml:"max_heap_bytes"`
	// MaxInflightBodyBytes bounds the request body bytes buffered, summed
	// over all requests and sets. It is checked as bytes arrive, before
	// each 4 KiB of a body's buffer is allocated: a request whose next
	// chunk would take the sum above it is shed with 503 and Retry-After
	// (reason memory). Default 256MiB; 0: off; else at least 1MiB.
	MaxInflightBodyBytes ByteSize `yaml:"max_inflight_body_bytes"`
	// BodyBufferBytes is how much of a request body keyway buffers
	// before it takes a replica connection. A body that fits is read
	// whole first, and can be sent again to another replica (the
	// delivery contract). A longer one is read until the buffer is full,
	// then streamed to the replica as the replica takes it: it is sent
	// once, never replayed. The buffer grows 4 KiB at a time as bytes
	// arrive, never by what Content-Length announces. Default 64KiB;
	// allowed 16KiB..1MiB.
	BodyBufferBytes ByteSize `yaml:"body_buffer_bytes"`
}

// SetConfig describes one replica set.
type SetConfig struct {
	// Name identifies the set in metrics, logs, errors and gossip
	// (lower-case letters, digits, '-', '_'; at most 63 bytes). Required.
	Name string `yaml:"name"`
	// Match selects the requests that belong to this set.
	Match MatchConfig `yaml:"match"`
	// Replicas is the declared replica count, used for the set's phase.
	// Default 1; allowed 1..1000 (balancer.MaxReplicas).
	Replicas int `yaml:"replicas"`
	// Key lists where a request's key is looked for, in order. Default
	// [{header: X-Key}].
	Key []balancer.KeySource `yaml:"key"`
	// Fallback routes requests without a key: round_robin (default),
	// least_inflight, random or reject.
	Fallback balancer.Fallback `yaml:"fallback"`
	// Failover says where a key goes when its owner is out of rotation:
	// next (default) or strict.
	Failover balancer.Failover `yaml:"failover"`
	// Hash fixes the ring's shape; every proxy must agree on it.
	Hash balancer.HashConfig `yaml:"hash"`
	// Timeouts bound the work with one replica.
	Timeouts TimeoutsConfig `yaml:"timeouts"`
	// TLS makes the proxy reach the set's replicas over TLS. Off by
	// default (plain HTTP). See docs/proxy.md, TLS to replicas.
	TLS tlsconfig.ClientConfig `yaml:"tls"`
	// Retries configures which failed requests are tried on the next
	// candidate.
	Retries RetriesConfig `yaml:"retries"`
	// MaxBodyBytes caps a request body (413 beyond). Default 8MiB; allowed
	// 1B..1GiB.
	MaxBodyBytes ByteSize `yaml:"max_body_bytes"`
	// MaxResponseBodyBytes caps a reply body from one of the set's
	// replicas. A reply whose Content-Length is larger, or one of unknown
	// length that passes it within server.body_buffer_bytes, is not
	// relayed but answered 502 (upstream kind reply_too_large), and the
	// replica's connection is closed. Replies beyond the buffer are
	// streamed to the client: one that passes the cap then is cut there,
	// both connections closed. Default 64MiB; allowed 1KiB..1GiB.
	MaxResponseBodyBytes ByteSize `yaml:"max_response_body_bytes"`
	// MaxConnsPerReplica caps the keep-alive pool to each replica. Default
	// 1024; allowed 1..100000.
	MaxConnsPerReplica int `yaml:"max_conns_per_replica"`
	// Static lists replicas that are not discovered by gossip. They are
	// always on the ring and in rotation unless health checks exclude them.
	Static []StaticReplica `yaml:"static"`
	// RouteContext tells the replicas how keyway routed each request, in
	// one header. Off by default.
	RouteContext RouteContextConfig `yaml:"route_context"`
	// Stopped stops the set: every request for it is answered 503 with
	// Retry-After, its phase is Stopped, and the proxies tell its agents
	// to drain their replicas and stop the processes they supervise.
	// Default false. An operator usually stops and starts a set at run
	// time (PATCH /v1/replica_sets/{set}), which overrides this key.
	Stopped bool `yaml:"stopped"`
	// Limits bound the requests in flight, and say how keyway sheds the
	// rest (docs/proxy.md, Overload).
	Limits LimitsConfig `yaml:"limits"`
	// Run says how the set's replicas run on this machine: with a
	// command, the proxy's local runner starts and stops one agent per
	// replica (package runner), and Replicas is the number of running
	// jobs. Without one (the default) someone else starts the replicas
	// and Replicas is only declared. The proxy itself only carries it.
	Run runner.Spec `yaml:"run"`
	// StatefulSet names the Kubernetes StatefulSet that runs the set's
	// replicas (package kube): its spec.replicas is then the declared
	// count (Replicas follows it, and a file may not set it), scaling
	// writes it, and keyway drives its scale-ins key-aware. The proxy
	// itself only carries it.
	StatefulSet kube.Ref `yaml:"statefulset"`
}

// LimitsConfig bounds the requests a set's replicas are given at once.
// Beyond a bound keyway answers at once (overload_status, Retry-After)
// rather than letting latency and memory grow; a keyed request is never
// moved to another replica because its own replica is full.
type LimitsConfig struct {
	// MaxInflightPerReplica bounds the requests forwarded to one replica
	// at once. Default 0: max_conns_per_replica (a request beyond the pool
	// would only wait for a connection). Allowed 0..max_conns_per_replica.
	MaxInflightPerReplica int `yaml:"max_inflight_per_replica"`
	// MaxQueuedPerReplica lets up to this many requests wait, in order,
	// for a slot of a replica that is at max_inflight_per_replica, each at
	// most max_queue_wait; beyond either keyway sheds at once. Default 0:
	// no queue. Allowed 0..4096.
	MaxQueuedPerReplica int `yaml:"max_queued_per_replica"`
	// MaxQueueWait bounds one request's wait in a replica's queue (and the
	// request's timeout bounds it too). Default 100ms; allowed 1ms..10s.
	MaxQueueWait time.Duration `yaml:"max_queue_wait"`
	// MaxInflight bounds the set's requests in flight on this proxy, all
	// replicas together. Default 0: unbounded; allowed 0..10000000.
	MaxInflight int `yaml:"max_inflight"`
	// OverloadStatus is the status of an answer shed by these bounds: 503
	// (default; the set is full) or 429 (the clients are deemed the cause).
	// The memory guard and replica-reported pressure always answer 503.
	OverloadStatus int `yaml:"overload_status"`
	// PressureHeader is the response header by which a replica says it is
	// saturated (value "saturated"): keyway then sheds the replica's new
	// keyed requests for the answer's Retry-After (1s without it), at most
	// max_pressure_hold. Default "X-Keyway-Pressure"; empty disables it.
	PressureHeader string `yaml:"pressure_header"`
	// MaxPressureHold caps how long one pressure answer sheds its
	// replica's requests. Default 5s; allowed 100ms..1m.
	MaxPressureHold time.Duration `yaml:"max_pressure_hold"`
}

// RouteContextConfig makes every request forwarded to a replica of the
// set carry one header describing the routing decision of that attempt,
// e.g. "partition=1281; standin=1; ring=5dd67cb170aa7cfa; key=order-42; owner=orders-0"
// (the format is in docs/proxy.md). Whatever a client sent under that
// name is replaced.
type RouteContextConfig struct {
	// Header names the header, e.g. X-Keyway-Route. Default empty: off,
	// and requests are forwarded without it.
	Header string `yaml:"header"`
}

// MatchConfig selects a replica set's requests. Empty fields match
// everything. Among sets that match, the one with the longest host, then
// the longest path prefix, wins.
type MatchConfig struct {
	// Host matches the request's Host header exactly (port ignored,
	// case-insensitive). Empty matches any host.
	Host string `yaml:"host"`
	// PathPrefix matches the start of the raw request path. Default "/".
	PathPrefix string `yaml:"path_prefix"`
}

// TimeoutsConfig bounds one replica exchange.
type TimeoutsConfig struct {
	// Connect bounds dialing a replica. Default 1s; at least 10ms.
	Connect time.Duration `yaml:"connect"`
	// Request bounds the whole exchange, retries included, from the first
	// dial to the last response byte. Default 15s; at least 100ms. An
	// attempt that times out has spent this whole budget, so a timeout is
	// never retried, even for a replayable request: the client gets 504.
	// Dial failures (bounded by Connect) leave time for the next candidate.
	Request time.Duration `yaml:"request"`
	// Idle closes a pooled connection to a replica idle this long; keep it
	// below the replica's own keep-alive timeout. Default 90s; at least 1s.
	Idle time.Duration `yaml:"idle"`
}

// RetriesConfig says how often a request may be tried. A request that
// never reached a replica (dial failure, refused, no free connection) may
// always go to the next candidate; one whose fate is unknown (reset or
// malformed answer after sending) only if its method is idempotent (GET,
// HEAD, OPTIONS, TRACE, PUT, DELETE) or it carries the idempotency header.
// A timeout is never retried: see TimeoutsConfig.Request. Retries stay
// within timeouts.request and go to the next candidate along the ring (or
// the next replica in rotation for requests without a key).
type RetriesConfig struct {
	// Attempts is the total number of tries per request, the first
	// included: 1 disables retries. Default 2; allowed 1..8.
	Attempts int `yaml:"attempts"`
	// IdempotencyHeader marks a request as safe to replay. Default
	// "Idempotency-Key"; empty disables it.
	IdempotencyHeader string `yaml:"idempotency_header"`
}

// StaticReplica is a replica given in the configuration.
type StaticReplica struct {
	// Name is the replica's ring identity. Required, unique within the set.
	Name string `yaml:"name"`
	// Addr is host:port of the replica's HTTP listener. Required.
	Addr string `yaml:"addr"`
	// Weight is advisory (reported only). Default 1.
	Weight int `yaml:"weight"`
	// Zone is an optional failure-domain label.
	Zone string `yaml:"zone"`
}

// DefaultConfig returns the proxy configuration used when the YAML omits a
// field. It has no replica sets: at least one must be configured.
func DefaultConfig() Config {
	return Config{
		Listen: ":8080",
		TLS:    tlsconfig.DefaultServerConfig(),
		Server: ServerConfig{
			ReadTimeout:     30 * time.Second,
			WriteTimeout:    30 * time.Second,
			IdleTimeout:     120 * time.Second,
			MaxHeaderBytes:  16 << 10,
			MaxConns:        10000,
			ShutdownTimeout: 30 * time.Second,
			DrainIdle:       5 * time.Second,
			ParkIdleAfter:   2 * time.Second,

			MaxInflightBodyBytes: 256 << 20,
			BodyBufferBytes:      64 << 10,
		},
		Fleet: DefaultFleetConfig(),
	}
}

// DefaultSetConfig returns the values a replica set starts from.
func DefaultSetConfig() SetConfig {
	return SetConfig{
		Match:              MatchConfig{PathPrefix: "/"},
		Replicas:           1,
		Key:                []balancer.KeySource{{Header: "X-Key"}},
		Fallback:           balancer.FallbackRoundRobin,
		Failover:           balancer.FailoverNext,
		Hash:               balancer.DefaultHashConfig(),
		Timeouts:           TimeoutsConfig{Connect: time.Second, Request: 15 * time.Second, Idle: 90 * time.Second},
		Retries:            RetriesConfig{Attempts: 2, IdempotencyHeader: "Idempotency-Key"},
		MaxBodyBytes:       8 << 20,
		MaxConnsPerReplica: 1024,
		Limits: LimitsConfig{
			OverloadStatus:  503,
			PressureHeader:  "X-Keyway-Pressure",
			MaxPressureHold: 5 * time.Second,
			MaxQueueWait:    100 * time.Millisecond,
		},
		MaxResponseBodyBytes: 64 << 20,
		Run:                  runner.DefaultSpec(),
	}
}

// DefaultStaticReplica returns the values a static replica starts from.
func DefaultStaticReplica() StaticReplica { return StaticReplica{Weight: 1} }

// Validate reports every problem in the configuration. Each error starts
// with the YAML path of the offending field followed by ": ".
func (c Config) Validate() error {
	var errs []error
	if err := validateListen(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen: %w", err))
	}
	errs = append(errs, prefixed("tls.", c.TLS.Validate()))
	errs = append(errs, prefixed("server.", c.Server.Validate()))
	errs = append(errs, prefixed("fleet.", c.Fleet.Validate()))
	names := map[string]int{}
	matches := map[MatchConfig]int{}
	for i, s := range c.ReplicaSets {
		p := fmt.Sprintf("replica_sets[%d].", i)
		errs = append(errs, prefixed(p, s.Validate()))
		if j, dup := names[s.Name]; dup && s.Name != "" {
			errs = append(errs, fmt.Errorf("%sname: %q is already used by replica_sets[%d]; set names must be unique", p, s.Name, j))
		} else {
			names[s.Name] = i
		}
		m := MatchConfig{Host: strings.ToLower(s.Match.Host), PathPrefix: s.Match.PathPrefix}
		if j, dup := matches[m]; dup {
			errs = append(errs, fmt.Errorf("%smatch: host %q and path_prefix %q are the same as replica_sets[%d]'s; the second set would never receive a request", p, s.Match.Host, s.Match.PathPrefix, j))
		} else {
			matches[m] = i
		}
	}
	return errors.Join(errs...)
}

// Validate reports every problem with the server settings.
func (c ServerConfig) Validate() error {
	var errs []error
	errs = append(errs,
		minDuration("read_timeout", c.ReadTimeout, 100*time.Millisecond),
		minDuration("write_timeout", c.WriteTimeout, 100*time.Millisecond),
		minDuration("idle_timeout", c.IdleTimeout, 100*time.Millisecond),
		minDuration("shutdown_timeout", c.ShutdownTimeout, 100*time.Millisecond),
	)
	if c.DrainIdle < 0 || c.DrainIdle > 10*time.Minute {
		errs = append(errs, fmt.Errorf("drain_idle: must be between 0 (close idle connections at once) and 10m, got %s", c.DrainIdle))
	}
	if c.MaxHeaderBytes < 1<<10 || c.MaxHeaderBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("max_header_bytes: must be between 1KiB and 1MiB, got %s", c.MaxHeaderBytes))
	}
	if c.MaxConns < 1 || c.MaxConns > 1000000 {
		errs = append(errs, fmt.Errorf("max_conns: must be between 1 and 1000000, got %d", c.MaxConns))
	}
	if c.ParkIdleAfter != 0 && c.ParkIdleAfter < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("park_idle_after: must be 0 (off) or at least 100ms, got %s", c.ParkIdleAfter))
	}
	if c.MaxHeapBytes != 0 && c.MaxHeapBytes < 16<<20 {
		errs = append(errs, fmt.Errorf("max_heap_bytes: must be 0 (off) or at least 16MiB, got %s", c.MaxHeapBytes))
	}
	if c.MaxInflightBodyBytes != 0 && c.MaxInflightBodyBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("max_inflight_body_bytes: must be 0 (off) or at least 1MiB, got %s", c.MaxInflightBodyBytes))
	}
	if c.BodyBufferBytes < 16<<10 || c.BodyBufferBytes > wire.MaxBuffered {
		errs = append(errs, fmt.Errorf("body_buffer_bytes: must be between 16KiB and 1MiB, got %s", c.BodyBufferBytes))
	}
	return errors.Join(errs...)
}

// Validate reports every problem with one replica set.
func (s SetConfig) Validate() error {
	var errs []error
	if !balancer.ValidSetName(s.Name) {
		errs = append(errs, fmt.Errorf("name: %q is not a valid set name: use 1 to 63 lower-case letters, digits, '-' or '_', e.g. orders", s.Name))
	}
	if s.Match.PathPrefix == "" || s.Match.PathPrefix[0] != '/' {
		errs = append(errs, fmt.Errorf("match.path_prefix: must start with '/', got %q", s.Match.PathPrefix))
	}
	if strings.ContainsAny(s.Match.Host, "/ \t") {
		errs = append(errs, fmt.Errorf("match.host: %q is not a host name; write it without scheme or path, e.g. orders.example.com", s.Match.Host))
	}
	if s.Replicas < 1 || s.Replicas > balancer.MaxReplicas {
		errs = append(errs, fmt.Errorf("replicas: must be between 1 and %d, got %d", balancer.MaxReplicas, s.Replicas))
	}
	if len(s.Key) == 0 && s.Fallback != balancer.FallbackRoundRobin && s.Fallback != balancer.FallbackLeastInflight && s.Fallback != balancer.FallbackRandom {
		errs = append(errs, errors.New("key: no key source is configured and fallback is reject: every request would be rejected; add e.g. [{header: X-Key}]"))
	}
	for i, k := range s.Key {
		if err := k.Validate(); err != nil {
			sep := ": "
			if m := err.Error(); strings.HasPrefix(m, "header:") || strings.HasPrefix(m, "path_segment:") || strings.HasPrefix(m, "query:") {
				sep = "."
			}
			errs = append(errs, fmt.Errorf("key[%d]%s%w", i, sep, err))
		} else if err := keyHeaderOwn(k.Header); err != nil {
			errs = append(errs, fmt.Errorf("key[%d].header: %w", i, err))
		}
	}
	errs = append(errs, prefixed("hash.", s.Hash.Validate()))
	errs = append(errs,
		minDuration("timeouts.connect", s.Timeouts.Connect, 10*time.Millisecond),
		minDuration("timeouts.request", s.Timeouts.Request, 100*time.Millisecond),
		minDuration("timeouts.idle", s.Timeouts.Idle, time.Second),
	)
	if s.Timeouts.Connect > s.Timeouts.Request && s.Timeouts.Request > 0 {
		errs = append(errs, fmt.Errorf("timeouts.connect: %s is longer than timeouts.request (%s), which bounds the whole exchange; lower it", s.Timeouts.Connect, s.Timeouts.Request))
	}
	errs = append(errs, prefixed("tls.", s.TLS.Validate()))
	if s.Retries.Attempts < 1 || s.Retries.Attempts > 8 {
		errs = append(errs, fmt.Errorf("retries.attempts: must be between 1 (no retry) and 8, got %d", s.Retries.Attempts))
	}
	if h := s.Retries.IdempotencyHeader; h != "" {
		if err := (balancer.KeySource{Header: h}).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("retries.idempotency_header: %q is not a valid HTTP header name", h))
		}
	}
	if err := s.RouteContext.validate(s); err != nil {
		errs = append(errs, fmt.Errorf("route_context.header: %w", err))
	}
	if s.MaxBodyBytes < 1 || s.MaxBodyBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("max_body_bytes: must be between 1B and 1GiB, got %s", s.MaxBodyBytes))
	}
	if s.MaxResponseBodyBytes < 1<<10 || s.MaxResponseBodyBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("max_response_body_bytes: must be between 1KiB and 1GiB, got %s (a reply past it gets 502, or is cut once streamed: set it above the largest reply a replica sends)", s.MaxResponseBodyBytes))
	}
	if s.MaxConnsPerReplica < 1 || s.MaxConnsPerReplica > 100000 {
		errs = append(errs, fmt.Errorf("max_conns_per_replica: must be between 1 and 100000, got %d", s.MaxConnsPerReplica))
	}
	errs = append(errs, prefixed("limits.", s.Limits.validate(s.MaxConnsPerReplica)))
	errs = append(errs, prefixed("run.", s.Run.Validate(s.Replicas)))
	errs = append(errs, prefixed("statefulset.", s.StatefulSet.Validate()))
	if s.StatefulSet.Enabled() && s.Run.Enabled() {
		errs = append(errs, errors.New("statefulset: a set runs either on this machine (run) or on Kubernetes (statefulset), not both; remove one"))
	}
	if s.StatefulSet.Enabled() && len(s.Static) > 0 {
		errs = append(errs, errors.New("static: a set on a StatefulSet finds its replicas (the pods' agents) by gossip; remove static, or the statefulset section"))
	}
	seen := map[string]int{}
	addrs := map[string]int{}
	for i, r := range s.Static {
		p := fmt.Sprintf("static[%d].", i)
		if !balancer.ValidReplicaName(r.Name) {
			errs = append(errs, fmt.Errorf("%sname: %q is not a valid replica name: use 1 to 128 bytes without spaces, e.g. orders-0", p, r.Name))
		} else if j, dup := seen[r.Name]; dup {
			errs = append(errs, fmt.Errorf("%sname: %q is already used by static[%d]; replica names must be unique in a set", p, r.Name, j))
		} else {
			seen[r.Name] = i
		}
		if err := validateHostPort(r.Addr); err != nil {
			errs = append(errs, fmt.Errorf("%saddr: %w", p, err))
		} else if j, dup := addrs[r.Addr]; dup {
			errs = append(errs, fmt.Errorf("%saddr: %q is already used by static[%d]", p, r.Addr, j))
		} else {
			addrs[r.Addr] = i
		}
		if r.Weight < 1 || r.Weight > balancer.MaxWeight {
			errs = append(errs, fmt.Errorf("%sweight: must be between 1 and %d, got %d", p, balancer.MaxWeight, r.Weight))
		}
	}
	return errors.Join(errs...)
}

// validate reports every problem with a set's limits; maxConns is the
// set's max_conns_per_replica.
func (l LimitsConfig) validate(maxConns int) error {
	var errs []error
	if l.MaxInflightPerReplica < 0 || l.MaxInflightPerReplica > maxConns {
		errs = append(errs, fmt.Errorf("max_inflight_per_replica: must be between 0 (max_conns_per_replica) and max_conns_per_replica (%d), got %d; a request beyond the pool would only wait for a connection", maxConns, l.MaxInflightPerReplica))
	}
	if l.MaxQueuedPerReplica < 0 || l.MaxQueuedPerReplica > 4096 {
		errs = append(errs, fmt.Errorf("max_queued_per_replica: must be between 0 (no queue) and 4096, got %d; the queue is meant to absorb bursts of about one service time, not to hold a backlog", l.MaxQueuedPerReplica))
	}
	if l.MaxQueueWait < time.Millisecond || l.MaxQueueWait > 10*time.Second {
		errs = append(errs, fmt.Errorf("max_queue_wait: must be between 1ms and 10s, got %s; e.g. 2× the replicas' service time", l.MaxQueueWait))
	}
	if l.MaxInflight < 0 || l.MaxInflight > 10000000 {
		errs = append(errs, fmt.Errorf("max_inflight: must be between 0 (unbounded) and 10000000, got %d", l.MaxInflight))
	}
	if l.OverloadStatus != 503 && l.OverloadStatus != 429 {
		errs = append(errs, fmt.Errorf("overload_status: must be 503 (the set is full) or 429 (the client is the cause), got %d", l.OverloadStatus))
	}
	if h := l.PressureHeader; h != "" {
		if err := (balancer.KeySource{Header: h}).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("pressure_header: %q is not a valid HTTP header name, e.g. X-Keyway-Pressure; empty disables it", h))
		}
	}
	if l.MaxPressureHold < 100*time.Millisecond || l.MaxPressureHold > time.Minute {
		errs = append(errs, fmt.Errorf("max_pressure_hold: must be between 100ms and 1m, got %s", l.MaxPressureHold))
	}
	return errors.Join(errs...)
}

// validate checks the header name of a set's route context: a valid
// header name that keyway does not manage otherwise (hop-by-hop and
// forwarding headers, Host, Content-Length) and that does not already
// mean something to the set (a key source or the idempotency header).
func (c RouteContextConfig) validate(s SetConfig) error {
	h := c.Header
	if h == "" {
		return nil
	}
	if err := (balancer.KeySource{Header: h}).Validate(); err != nil {
		return fmt.Errorf("%q is not a valid HTTP header name (letters, digits and !#$%%&'*+-.^_`|~ only), e.g. X-Keyway-Route", h)
	}
	for _, k := range hopHeaders {
		if strings.EqualFold(h, string(k)) {
			return fmt.Errorf("%q is a hop-by-hop header; choose a name of your own, e.g. X-Keyway-Route", h)
		}
	}
	if protectedHeader([]byte(h)) || strings.EqualFold(h, "Expect") {
		return fmt.Errorf("%q is a header keyway sets or relies on itself; choose a name of your own, e.g. X-Keyway-Route", h)
	}
	for _, k := range s.Key {
		if strings.EqualFold(h, k.Header) {
			return fmt.Errorf("%q is a key source of this set; the route context would replace the key", h)
		}
	}
	if strings.EqualFold(h, s.Retries.IdempotencyHeader) {
		return fmt.Errorf("%q is the set's retries.idempotency_header; the route context would mark every request replayable", h)
	}
	return nil
}

// keyHeaderOwn refuses a key header that fasthttp, the hop-by-hop rules
// or the framing give a meaning of their own. fasthttp keeps one of
// several Content-Type, User-Agent or Host fields and folds Cookie and
// Connection: a request that sent two keys in them could not be told
// from one that sent one (see "Finding the key" in docs/proxy.md).
func keyHeaderOwn(h string) error {
	if h == "" {
		return nil
	}
	for _, k := range []string{"Host", "Content-Length", "Content-Type", "User-Agent", "Cookie", "Expect"} {
		if strings.EqualFold(h, k) {
			return fmt.Errorf("%q is a header HTTP or fasthttp gives a meaning of its own, and two of them in one request cannot be told apart; choose a header of your own, e.g. X-Key", h)
		}
	}
	for _, k := range hopHeaders {
		if strings.EqualFold(h, string(k)) {
			return fmt.Errorf("%q is a hop-by-hop header, never forwarded to a replica; choose a header of your own, e.g. X-Key", h)
		}
	}
	return nil
}

func validateListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (e.g. \":8080\" or \"127.0.0.1:8080\"): %v", addr, err)
	}
	if host != "" && net.ParseIP(host) == nil && strings.ContainsAny(host, "/ ") {
		return fmt.Errorf("%q has an invalid host", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%q has an invalid port: use 0 to 65535 (0 picks a free port)", addr)
	}
	return nil
}

func validateHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" || port == "0" {
		return fmt.Errorf("%q is not host:port with a non-zero port, e.g. \"10.0.0.7:9001\"", addr)
	}
	if n, err := net.LookupPort("tcp", port); err != nil || n == 0 {
		return fmt.Errorf("%q has an invalid port: use 1 to 65535", addr)
	}
	return nil
}

func minDuration(path string, d, floor time.Duration) error {
	if d < floor {
		return fmt.Errorf("%s: must be at least %s, got %s (write a duration with a unit, e.g. \"2s\" or \"500ms\")", path, floor, d)
	}
	return nil
}

// prefixed prepends a YAML path prefix to every error joined in err.
func prefixed(prefix string, err error) error {
	if err == nil {
		return nil
	}
	var out []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			out = append(out, prefixed(prefix, e))
		}
		return errors.Join(out...)
	}
	return fmt.Errorf("%s%w", prefix, err)
}
