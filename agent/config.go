package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"keyway/balancer"
	"keyway/health"
	"keyway/logging"
	"keyway/membership"
)

// Config is the agent's whole configuration: the file given to
// `keyway agent -c FILE`. Each field's comment gives its unit, its default
// and what the zero value means. A Config is a plain value; Gossip.Join
// and Command are its only slices, so treat a loaded Config as read-only
// or copy them before changing it.
type Config struct {
	// Replica describes the replica this agent runs beside.
	Replica ReplicaConfig `yaml:"replica"`
	// Probe configures the readiness probe of the replica.
	Probe ProbeConfig `yaml:"probe"`
	// Drain configures what happens on SIGTERM.
	Drain DrainConfig `yaml:"drain"`
	// Supervise configures how the agent runs the replica's process when
	// it is given one (Command). Without a command it is not used.
	Supervise SuperviseConfig `yaml:"supervise"`
	// Listen is host:port of the agent's own HTTP listener (/healthz,
	// /readyz, /metrics). Default "127.0.0.1:9902"; empty disables it. In
	// Kubernetes the kubelet probes the pod IP, so use ":9902" there.
	Listen string `yaml:"listen"`
	// Log configures the agent's logs (stderr). access_log does not apply
	// to the agent and must stay false.
	Log logging.Config `yaml:"log"`
	// Gossip configures the agent's gossip member. Join is required.
	// BindPort defaults to 0 (a free port, advertised to the cluster) so
	// that several agents and a proxy can share one host.
	Gossip membership.Config `yaml:"gossip"`
	// LockFile, when set, is a file the agent holds locked while it runs,
	// with its PID, set and replica written in it: a second agent for the
	// same file refuses to start, and the local runner (a set's run
	// section) finds the agents it started after a restart of its proxy
	// by their locks. Default "" (none).
	LockFile string `yaml:"lock_file"`
	// ExitWithParent makes the agent drain and exit, as on SIGTERM, once
	// the process that started it has exited (the demo's agents go with
	// the demo, even when it is killed). Default false: an agent outlives
	// whatever started it (the local runner's agents outlive their proxy).
	ExitWithParent bool `yaml:"exit_with_parent"`
	// Command is the replica's command line (`keyway agent … -- CMD
	// ARGS…`): the program and its arguments. Empty (the default) means the
	// agent supervises no process, only probes the replica at
	// Replica.Addr. It is not a key of the file: only the command line
	// sets it.
	Command []string `yaml:"-"`
}

// SuperviseConfig says how the agent supervises the replica's process
// (Config.Command): restarts with backoff, giving up, and stopping it.
type SuperviseConfig struct {
	// StopGrace is how long the agent waits, after sending SIGTERM to the
	// process group on shutdown (once drained), before it sends SIGKILL.
	// Default 10s; 0 sends SIGKILL right after SIGTERM.
	StopGrace time.Duration `yaml:"stop_grace"`
	// BackoffMin is the delay before the first restart within Window.
	// Each further restart within Window doubles it, up to BackoffMax; a
	// random 0-25% is added to every delay. Default 1s; at least 10ms.
	BackoffMin time.Duration `yaml:"backoff_min"`
	// BackoffMax caps the doubling delay (before jitter). Default 30s; at
	// least BackoffMin.
	BackoffMax time.Duration `yaml:"backoff_max"`
	// MaxRestarts is how many restarts the agent makes within Window; the
	// next unexpected exit within Window makes it give up: no more
	// restarts, state failed, until a repair. Default 5; 1 to 1000.
	MaxRestarts int `yaml:"max_restarts"`
	// Window is the sliding period over which unexpected exits are
	// counted, for MaxRestarts and for the backoff's doubling. Default
	// 10m; at least 1s.
	Window time.Duration `yaml:"window"`
}

// ReplicaConfig identifies the replica and tells proxies how to reach it.
type ReplicaConfig struct {
	// Set is the replica set the replica belongs to (e.g. "orders").
	// Required; 1 to 63 of a-z, 0-9, '-', '_', as in the proxy's file.
	Set string `yaml:"set"`
	// Name is the replica's ring identity, stable across restarts (a
	// StatefulSet pod name such as "orders-0"). Empty means the host name.
	Name string `yaml:"name"`
	// Addr is host:port proxies forward to, and the agent probes. Required;
	// the host must be one proxies can reach (not 0.0.0.0).
	Addr string `yaml:"addr"`
	// Weight is advisory, reported to proxies. Default 1; 1 to 1000.
	Weight int `yaml:"weight"`
	// Zone is an optional failure-domain label. Empty means none.
	Zone string `yaml:"zone"`
}

// ProbeConfig is the readiness probe of the replica: GET http://ADDR/PATH.
type ProbeConfig struct {
	// Path is the probed path. Default "/readyz".
	Path string `yaml:"path"`
	// Interval is the time between probe starts. Default 1s; at least 10ms.
	// The first probe starts after a random delay within one interval.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe; a probe that takes longer fails. Default
	// 500ms; at least 10ms. At most one probe is in flight.
	Timeout time.Duration `yaml:"timeout"`
	// Rise is the number of consecutive passes that make a starting or
	// recovering replica ready. Default 2; 1 to 100.
	Rise int `yaml:"rise"`
	// Fall is the number of consecutive failures that make a ready replica
	// recovering. Default 3; 1 to 100.
	Fall int `yaml:"fall"`
	// ExpectStatus lists the status codes that pass, as codes and ranges
	// separated by commas: "200-399" (default), "200,204".
	ExpectStatus string `yaml:"expect_status"`
}

// DrainConfig says how the agent leaves on SIGTERM.
type DrainConfig struct {
	// Timeout is the longest the agent waits, once draining, for every live
	// proxy to report that it sends no more requests to the replica.
	// Default 30s; 0 does not wait. Keep Kubernetes'
	// terminationGracePeriodSeconds above Timeout + Quiet + a few seconds.
	Timeout time.Duration `yaml:"timeout"`
	// Quiet is an extra wait after the replica is drained, before the agent
	// advertises stopped and exits. Default 0 (none).
	Quiet time.Duration `yaml:"quiet"`
	// Remove makes the agent leave for good (scale-in): proxies drop the
	// replica from the ring at once and its partitions move. Default false:
	// a restart, whose partitions wait for it (gossip.forget_after).
	Remove bool `yaml:"remove"`
	// ProbePath, when set, is an HTTP path on the replica that answers 200
	// once the replica's own pending work is done (exchanges waiting at a
	// barrier, retries, an inbox). After the proxies report the replica
	// drained, the agent polls it (every probe.interval) before it stops
	// the replica's process and leaves: work the replica still holds is not
	// lost by a scale-in or a restart. Default "" (no drain probe).
	ProbePath string `yaml:"probe_path"`
	// ProbeTimeout bounds that wait; when it passes, the agent leaves
	// anyway and says so (a warning and keyway_agent_drain_probe_timeouts_total).
	// Default 1m; at least 100ms.
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
}

// DefaultConfig returns the configuration used for every key the file,
// the environment and the flags leave out. It has no set, address or join
// addresses, so it does not validate on its own.
func DefaultConfig() Config {
	g := membership.DefaultConfig()
	g.BindPort = 0
	return Config{
		Replica: ReplicaConfig{Weight: 1},
		Probe: ProbeConfig{
			Path:         "/readyz",
			Interval:     time.Second,
			Timeout:      500 * time.Millisecond,
			Rise:         2,
			Fall:         3,
			ExpectStatus: "200-399",
		},
		Drain: DrainConfig{Timeout: 30 * time.Second, ProbeTimeout: time.Minute},
		Supervise: SuperviseConfig{
			StopGrace:   10 * time.Second,
			BackoffMin:  time.Second,
			BackoffMax:  30 * time.Second,
			MaxRestarts: 5,
			Window:      10 * time.Minute,
		},
		Listen: "127.0.0.1:9902",
		Log:    logging.DefaultConfig(),
		Gossip: g,
	}
}

// Validate reports every problem, joined with errors.Join. Each error's
// text starts with the full YAML path of its key ("replica.addr: ...",
// "gossip.join: ...") followed by ": ". It is safe for concurrent use.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	r := c.Replica
	if r.Set == "" {
		add("replica.set: required: the replica set this replica belongs to, e.g. orders")
	} else if !balancer.ValidSetName(r.Set) {
		add("replica.set: %q is not a valid set name: use 1 to 63 lower-case letters, digits, '-' or '_', e.g. orders", r.Set)
	}
	if r.Name != "" && !balancer.ValidReplicaName(r.Name) {
		add("replica.name: %q is not a valid replica name: use 1 to 128 bytes without spaces, e.g. orders-0 (empty means the host name)", r.Name)
	}
	if r.Addr == "" {
		add("replica.addr: required: host:port proxies use to reach the replica, e.g. 10.0.0.5:9001")
	} else if err := validateReplicaAddr(r.Addr); err != nil {
		add("replica.addr: %v", err)
	}
	if r.Weight < 1 || r.Weight > balancer.MaxWeight {
		add("replica.weight: must be between 1 and %d, got %d", balancer.MaxWeight, r.Weight)
	}
	if len(r.Zone) > 64 || strings.ContainsAny(r.Zone, " \t\r\n") {
		add("replica.zone: %q is not a valid zone: use at most 64 bytes without spaces", r.Zone)
	}

	p := c.Probe
	if p.Path == "" || p.Path[0] != '/' || strings.ContainsAny(p.Path, " \t\r\n#") {
		add("probe.path: must start with '/' and contain no spaces or '#', got %q", p.Path)
	}
	if p.Interval < 10*time.Millisecond {
		add("probe.interval: must be at least 10ms, got %s", p.Interval)
	}
	if p.Timeout < 10*time.Millisecond {
		add("probe.timeout: must be at least 10ms, got %s", p.Timeout)
	}
	if p.Rise < 1 || p.Rise > 100 {
		add("probe.rise: must be between 1 and 100, got %d", p.Rise)
	}
	if p.Fall < 1 || p.Fall > 100 {
		add("probe.fall: must be between 1 and 100, got %d", p.Fall)
	}
	if _, err := parseStatusRanges(p.ExpectStatus); err != nil {
		add("probe.expect_status: %v", err)
	}

	if c.Drain.Timeout < 0 {
		add("drain.timeout: must not be negative, got %s", c.Drain.Timeout)
	}
	if c.Drain.Quiet < 0 {
		add("drain.quiet: must not be negative, got %s", c.Drain.Quiet)
	}
	if p := c.Drain.ProbePath; p != "" && (p[0] != '/' || strings.ContainsAny(p, " \t\r\n#")) {
		add("drain.probe_path: must start with '/' and contain no spaces or '#', got %q (or leave it empty: no drain probe)", p)
	}
	if c.Drain.ProbeTimeout < 100*time.Millisecond {
		add("drain.probe_timeout: must be at least 100ms, got %s", c.Drain.ProbeTimeout)
	}

	s := c.Supervise
	if s.StopGrace < 0 {
		add("supervise.stop_grace: must not be negative, got %s (0 sends SIGKILL right after SIGTERM)", s.StopGrace)
	}
	if s.BackoffMin < 10*time.Millisecond {
		add("supervise.backoff_min: must be at least 10ms, got %s", s.BackoffMin)
	}
	if s.BackoffMax < s.BackoffMin {
		add("supervise.backoff_max: must be at least supervise.backoff_min (%s), got %s", s.BackoffMin, s.BackoffMax)
	}
	if s.MaxRestarts < 1 || s.MaxRestarts > 1000 {
		add("supervise.max_restarts: must be between 1 and 1000, got %d", s.MaxRestarts)
	}
	if s.Window < time.Second {
		add("supervise.window: must be at least 1s, got %s", s.Window)
	}
	if len(c.Command) > 0 && c.Command[0] == "" {
		add("command: the program after -- is empty; write the replica's command after --, e.g. keyway agent … -- /usr/bin/orders-pipeline --port 9001")
	}

	if c.Listen != "" {
		if _, port, err := net.SplitHostPort(c.Listen); err != nil || port == "" {
			add("listen: %q is not host:port (e.g. \"127.0.0.1:9902\", or \":9902\" for all interfaces), or empty to disable the agent's HTTP listener", c.Listen)
		} else if _, err := net.LookupPort("tcp", port); err != nil {
			add("listen: %q has an invalid port: use 0 to 65535 (0 picks a free port)", c.Listen)
		}
	}

	// The access log's keys have the agent's own rule: absent.
	lc := c.Log
	lc.AccessLog, lc.Access = false, logging.DefaultConfig().Access
	for _, e := range leaves(lc.Validate()) {
		add("log.%w", e)
	}
	if c.Log.AccessLog {
		add("log.access_log: the agent forwards no requests and writes no access log; remove this key")
	}
	for _, k := range []struct {
		name string
		set  bool
	}{{"path", c.Log.Access.Path != ""}, {"key", c.Log.Access.Key != logging.KeyOmit}, {"key_secret_file", c.Log.Access.KeySecretFile != ""}} {
		if k.set {
			add("log.access.%s: the agent forwards no requests and writes no access log; remove this key", k.name)
		}
	}
	for _, e := range leaves(c.Gossip.Validate()) {
		add("gossip.%w", e)
	}
	if len(c.Gossip.Join) == 0 {
		add("gossip.join: required: at least one member to join, host:port of a proxy or a DNS name that resolves to proxies (a Kubernetes headless Service), e.g. [keyway-gossip.default.svc:7946]")
	}
	return errors.Join(errs...)
}

// leaves returns the errors joined in err (errors.Join), or err itself.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// validReplicaName is balancer.ValidReplicaName, the one replica-name
// rule, under the name agent.go checks a host name with.
func validReplicaName(s string) bool { return balancer.ValidReplicaName(s) }

// validateReplicaAddr checks a host:port that other hosts dial.
func validateReplicaAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port, e.g. 10.0.0.5:9001", addr)
	}
	if len(addr) > 255 {
		return fmt.Errorf("%q is longer than 255 bytes", addr)
	}
	if host == "" {
		return fmt.Errorf("%q has no host; proxies need an address they can dial, e.g. the pod IP", addr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%q is an all-interfaces address; proxies need an address they can dial, e.g. the pod IP", addr)
	}
	if strings.ContainsAny(host, "/ \t") {
		return fmt.Errorf("%q has an invalid host", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q has an invalid port: use 1 to 65535", addr)
	}
	return nil
}

// The readiness probe's expect_status has the health checker's syntax.
type statusRanges = health.StatusRanges

var parseStatusRanges = health.ParseStatusRanges
