package runner

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Spec says how a replica set's replicas run on this machine: the set's
// `run` section. A Spec without a command (the zero value, and
// DefaultSpec) runs nothing: someone else starts the replicas, and the
// set's count is only declared. A Spec is a plain value.
type Spec struct {
	// Command is the replica's program and arguments. Every argument may
	// hold the placeholders {set}, {replica} (set-ordinal), {ordinal},
	// {port} (port_base + ordinal), {host}, {addr} (host:port),
	// {state_dir} (the replica's own directory) and {keyway} (the keyway
	// program the runner runs, for `{keyway} replica`, the demo replica).
	Command []string `yaml:"command,omitempty"`
	// Env lists NAME=value pairs added to the replica's environment; the
	// values take the placeholders. KEYWAY_SET, KEYWAY_REPLICA,
	// KEYWAY_ORDINAL, KEYWAY_PORT and KEYWAY_STATE_DIR are always set.
	Env []string `yaml:"env,omitempty"`
	// Host is the host proxies reach the replicas at, and the one the
	// command should listen on ({host}). Default 127.0.0.1.
	Host string `yaml:"host"`
	// PortBase is the first replica's port: replica N listens on
	// port_base + N. 0 (the default) picks a free port for each replica
	// when it is first started, and keeps it in the state directory, so
	// that it comes back on the same port.
	PortBase int `yaml:"port_base"`
	// StateDir holds one directory per replica, STATE_DIR/{replica}: the
	// replica's working directory, kept across restarts, scale-downs and
	// scale-ups, so the same name finds the same state. Also the runner's
	// own files (STATE_DIR/.runner: the lock that makes one runner per
	// host, the agents' configurations, locks and logs). Default "": the
	// systemd StateDirectory ($STATE_DIRECTORY/run), else
	// $XDG_STATE_HOME/keyway/run, else ~/.local/state/keyway/run.
	StateDir string `yaml:"state_dir"`
	// CredentialsFile is the fleet credentials file the set's agents sign
	// their claims with (it must hold the set's agent private key).
	// Default "": the proxy's gossip.credentials_file.
	CredentialsFile string `yaml:"credentials_file"`
	// ReadyPath is the replica's readiness path, probed by its agent.
	// Default "/readyz".
	ReadyPath string `yaml:"ready_path"`
	// ProbeInterval is the time between readiness probes. Default 1s; at
	// least 10ms. A replica is ready after 2 passing probes.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// DrainProbe is the path that answers 200 once the replica's own
	// pending work is done; a stopping replica is waited for on it
	// (agent drain.probe_path). Default "" (none).
	DrainProbe string `yaml:"drain_probe"`
	// DrainTimeout bounds how long a stopping replica waits for the
	// proxies to report nothing in flight to it. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// StopGrace is how long a replica has to exit after SIGTERM before
	// SIGKILL. Default 10s.
	StopGrace time.Duration `yaml:"stop_grace"`
	// MaxRestarts is how many restarts of a crashing replica are made
	// within RestartWindow before its agent gives up (state failed, until
	// a repair). Default 5.
	MaxRestarts int `yaml:"max_restarts"`
	// RestartWindow is the period over which a replica's crashes count.
	// Default 10m.
	RestartWindow time.Duration `yaml:"restart_window"`
}

// DefaultSpec returns a set's run section when its file leaves keys out.
func DefaultSpec() Spec {
	return Spec{
		Host:          "127.0.0.1",
		ReadyPath:     "/readyz",
		ProbeInterval: time.Second,
		DrainTimeout:  30 * time.Second,
		StopGrace:     10 * time.Second,
		MaxRestarts:   5,
		RestartWindow: 10 * time.Minute,
	}
}

// Enabled reports whether the spec runs replicas.
func (s Spec) Enabled() bool { return len(s.Command) > 0 }

// placeholders are the names a command or env value may use.
var placeholders = []string{"set", "replica", "ordinal", "port", "host", "addr", "state_dir", "keyway"}

// Validate reports every problem of a spec for a set of replicas replicas
// (errors.Join). Each error starts with the key's name within the run
// section followed by ": ".
func (s Spec) Validate(replicas int) error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !s.Enabled() {
		d := DefaultSpec()
		if len(s.Env) > 0 || s.PortBase != 0 || s.StateDir != "" || s.CredentialsFile != "" || s.Host != d.Host || s.DrainProbe != "" {
			add("command: required when run is set: the replica's program and arguments, e.g. [keyway, replica, --name, \"{replica}\", --listen, \"{addr}\"]; or remove the run section: someone else starts the replicas")
		}
		return errors.Join(errs...)
	}
	if s.Command[0] == "" {
		add("command: the program (the first entry) is empty; name the replica's program, e.g. /usr/bin/orders-pipeline")
	}
	for i, a := range s.Command {
		if err := checkPlaceholders(a); err != nil {
			add("command[%d]: %v", i, err)
		}
	}
	for i, kv := range s.Env {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") {
			add("env[%d]: %q is not NAME=value, e.g. ORDERS_DATA={state_dir}", i, kv)
			continue
		}
		if strings.HasPrefix(name, "KEYWAY_") {
			add("env[%d]: %s: the KEYWAY_ names are set by the runner; use another name", i, name)
		}
		if err := checkPlaceholders(val); err != nil {
			add("env[%d]: %v", i, err)
		}
	}
	if s.Host == "" || strings.ContainsAny(s.Host, " /:\t") {
		add("host: %q is not a host name or IP address proxies can dial, e.g. 127.0.0.1", s.Host)
	} else if ip := net.ParseIP(s.Host); ip != nil && ip.IsUnspecified() {
		add("host: %q is an all-interfaces address; proxies need one they can dial, e.g. 127.0.0.1 or this host's address", s.Host)
	}
	switch {
	case s.PortBase < 0 || s.PortBase > 65535:
		add("port_base: must be between 0 and 65535, got %d (0 picks a free port per replica)", s.PortBase)
	case s.PortBase > 0 && s.PortBase+max(replicas, 1)-1 > 65535:
		add("port_base: %d + %d replicas passes port 65535; lower port_base, or use 0 (a free port per replica)", s.PortBase, replicas)
	}
	if s.StateDir != "" && !filepath.IsAbs(s.StateDir) {
		add("state_dir: %q is relative; use an absolute path, e.g. /var/lib/keyway/run, so that a restarted proxy finds it", s.StateDir)
	}
	if s.ReadyPath == "" || s.ReadyPath[0] != '/' || strings.ContainsAny(s.ReadyPath, " \t\r\n#") {
		add("ready_path: must start with '/' and contain no spaces or '#', got %q", s.ReadyPath)
	}
	if s.ProbeInterval < 10*time.Millisecond {
		add("probe_interval: must be at least 10ms, got %s", s.ProbeInterval)
	}
	if p := s.DrainProbe; p != "" && (p[0] != '/' || strings.ContainsAny(p, " \t\r\n#")) {
		add("drain_probe: must start with '/' and contain no spaces or '#', got %q (or leave it empty)", p)
	}
	if s.DrainTimeout < 0 {
		add("drain_timeout: must not be negative, got %s", s.DrainTimeout)
	}
	if s.StopGrace < 0 {
		add("stop_grace: must not be negative, got %s", s.StopGrace)
	}
	if s.MaxRestarts < 1 || s.MaxRestarts > 1000 {
		add("max_restarts: must be between 1 and 1000, got %d", s.MaxRestarts)
	}
	if s.RestartWindow < time.Second {
		add("restart_window: must be at least 1s, got %s", s.RestartWindow)
	}
	return errors.Join(errs...)
}

// checkPlaceholders refuses a {name} that is not a placeholder.
func checkPlaceholders(s string) error {
	for {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			return nil
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil // a lone brace is literal
		}
		name := s[i+1 : i+j]
		if !isPlaceholder(name) {
			return fmt.Errorf("{%s} is not a placeholder; use {%s}", name, strings.Join(placeholders, "}, {"))
		}
		s = s[i+j+1:]
	}
}

func isPlaceholder(name string) bool {
	for _, p := range placeholders {
		if p == name {
			return true
		}
	}
	return false
}

// vars are one replica's placeholder values.
type vars struct {
	set, replica, host, stateDir, keyway string
	ordinal, port                        int
}

// expand replaces the placeholders in s.
func (v vars) expand(s string) string {
	if !strings.Contains(s, "{") {
		return s
	}
	return strings.NewReplacer(
		"{set}", v.set, "{replica}", v.replica, "{ordinal}", strconv.Itoa(v.ordinal),
		"{port}", strconv.Itoa(v.port), "{host}", v.host, "{addr}", net.JoinHostPort(v.host, strconv.Itoa(v.port)),
		"{state_dir}", v.stateDir, "{keyway}", v.keyway,
	).Replace(s)
}

// ReplicaName is the name of a run set's replica with this ordinal.
func ReplicaName(set string, ordinal int) string { return set + "-" + strconv.Itoa(ordinal) }

// ordinalOf returns the ordinal of a replica name of set, or -1.
func ordinalOf(set, replica string) int {
	rest, ok := strings.CutPrefix(replica, set+"-")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return -1
	}
	return n
}
