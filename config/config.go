package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"keyway/admin"
	"keyway/eventlog"
	"keyway/health"
	"keyway/kube"
	"keyway/logging"
	"keyway/membership"
	"keyway/proxy"
)

// Config is keyway's whole configuration file. Each section belongs to a
// component; this type only puts them together. The proxy's keys (listen,
// server, replica_sets) sit at the top level.
//
// A Config is a plain value: copying it copies its slices' headers, not
// their elements, so treat a loaded Config as read-only or copy the slices
// you change. Validate may be called concurrently.
type Config struct {
	proxy.Config `yaml:",inline"`
	// Admin configures the admin listener (/metrics, /healthz, /readyz).
	Admin admin.Config `yaml:"admin"`
	// Log configures application and access logs.
	Log logging.Config `yaml:"log"`
	// Gossip configures replica discovery; off by default (static
	// replicas only).
	Gossip Gossip `yaml:"gossip"`
	// Health configures active probes, passive ejection, supervision and
	// the all-replicas-down policy.
	Health health.Config `yaml:"health"`
	// Audit configures the JSONL audit trail of routing decisions.
	Audit eventlog.Config `yaml:"audit"`
	// Runtime configures the run-time state: the replica set changes
	// operators make through the admin API (create, delete, stop, start,
	// scale), which every proxy of the gossip cluster shares.
	Runtime Runtime `yaml:"runtime"`
	// Kubernetes configures the Kubernetes backend (package kube), used
	// by sets that name a StatefulSet.
	Kubernetes kube.Config `yaml:"kubernetes"`
}

// Runtime is the run-time state's section.
type Runtime struct {
	// StateDir, when set, keeps the run-time state in StateDir/runtime.json
	// so that it survives a restart of every proxy at once (with any proxy
	// still running, a restarted one learns it from the others). Default
	// empty: kept in memory, and by the other proxies.
	StateDir string `yaml:"state_dir"`
}

// Validate checks that a state directory, when set, is a directory or can
// be made one.
func (r Runtime) Validate() error {
	if r.StateDir == "" {
		return nil
	}
	if fi, err := os.Stat(r.StateDir); err == nil && !fi.IsDir() {
		return fmt.Errorf("state_dir: %q is a file, not a directory; name a directory keyway may write runtime.json into", r.StateDir)
	}
	return nil
}

// Gossip is the proxy's gossip section: when enabled, the proxy joins the
// gossip cluster as a member with role proxy and routes to the replicas the
// agents advertise, beside any static ones.
type Gossip struct {
	// Enabled turns gossip discovery on. Default false.
	Enabled           bool `yaml:"enabled"`
	membership.Config `yaml:",inline"`
	// IsolatedNotReady makes /readyz answer not ready while this proxy is
	// cut off from gossip (it keeps routing meanwhile). Default false.
	IsolatedNotReady bool `yaml:"isolated_not_ready"`
}

// Validate checks the gossip keys only when gossip is enabled.
func (g Gossip) Validate() error {
	if !g.Enabled {
		return nil
	}
	return g.Config.Validate()
}

// Default returns the configuration used for every key the file, the
// environment and the flags leave out: each section's DefaultConfig(). It
// has no replica sets, so it does not validate on its own.
func Default() Config {
	return Config{
		Config: proxy.DefaultConfig(),
		Admin:  admin.DefaultConfig(),
		Log:    logging.DefaultConfig(),
		Gossip: Gossip{Config: membership.DefaultConfig()},
		Health: health.DefaultConfig(),
		Audit:  eventlog.DefaultConfig(),

		Kubernetes: kube.DefaultConfig(),
	}
}

// newDefault returns the value a new element of type t starts from when it
// appears in a list: the component's default constructor where there is
// one, the zero value otherwise. yaml.v3 would replace a list with
// zero-valued elements, so a replica set written with only a name would
// get no timeouts; this is why lists are decoded element by element.
func newDefault(t reflect.Type) reflect.Value {
	v := reflect.New(t).Elem()
	switch p := v.Addr().Interface().(type) {
	case *proxy.SetConfig:
		*p = proxy.DefaultSetConfig()
	case *proxy.StaticReplica:
		*p = proxy.DefaultStaticReplica()
	}
	return v
}

// Validate calls every section's Validate and reports all of their
// problems joined (errors.Join). Each error's text starts with the full YAML
// path of the field (e.g. "admin.listen: ...",
// "replica_sets[0].hash.load: ...") followed by ": ".
//
// It shadows the Validate promoted from the embedded proxy.Config, which
// would check the proxy's keys only.
func (c Config) Validate() error {
	var errs []error
	v := reflect.ValueOf(c)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, inline, skip := yamlName(sf)
		if skip {
			continue
		}
		val, ok := v.Field(i).Interface().(interface{ Validate() error })
		if !ok {
			continue
		}
		prefix := name + "."
		if inline {
			prefix = ""
		}
		for _, e := range leafErrors(val.Validate()) {
			errs = append(errs, fmt.Errorf("%s%w", prefix, e))
		}
	}
	if len(c.ReplicaSets) == 0 && !c.Gossip.Enabled {
		// With gossip, sets may come from the fleet's run-time state
		// (created through any proxy's admin API).
		errs = append(errs, errors.New("replica_sets: at least one replica set is required, e.g. [{name: orders, static: [{name: orders-0, addr: \"127.0.0.1:9001\"}]}], or enable gossip and create sets at run time (keyway create)"))
	}
	for i, s := range c.ReplicaSets {
		if s.StatefulSet.Enabled() && !c.Gossip.Enabled {
			errs = append(errs, fmt.Errorf("replica_sets[%d].statefulset: the pods' agents announce the replicas by gossip, which is off: set gossip.enabled: true, or remove the statefulset section", i))
		}
		if !s.Run.Enabled() {
			continue
		}
		if !c.Gossip.Enabled {
			errs = append(errs, fmt.Errorf("replica_sets[%d].run.command: the replicas keyway runs announce themselves by gossip, which is off: set gossip.enabled: true, or remove the run section", i))
		}
		if len(s.Static) > 0 {
			errs = append(errs, fmt.Errorf("replica_sets[%d].static: a set whose replicas keyway runs (run.command) finds them by gossip; remove static, or the run section", i))
		}
	}
	return errors.Join(errs...)
}

// leafErrors flattens errors joined with errors.Join (at any depth) into
// the individual errors. An error that merely wraps several others with a
// message of its own (fmt.Errorf with two %w) stays whole.
func leafErrors(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	kids := j.Unwrap()
	msgs := make([]string, 0, len(kids))
	for _, k := range kids {
		if k != nil {
			msgs = append(msgs, k.Error())
		}
	}
	if strings.Join(msgs, "\n") != err.Error() {
		return []error{err}
	}
	var out []error
	for _, k := range kids {
		out = append(out, leafErrors(k)...)
	}
	return out
}

// Summary describes a valid configuration in one line, for
// "keyway validate", e.g.
//
//	ok: 2 replica sets (orders: 3 replicas declared, 3 static; events: 2 replicas declared, 0 static), listen :8080, admin 127.0.0.1:9901
func Summary(c Config) string {
	var b strings.Builder
	b.WriteString("ok: ")
	n := len(c.ReplicaSets)
	fmt.Fprintf(&b, "%d replica set%s", n, plural(n))
	if n > 0 {
		b.WriteString(" (")
		for i, s := range c.ReplicaSets {
			if i > 0 {
				b.WriteString("; ")
			}
			if s.Run.Enabled() {
				fmt.Fprintf(&b, "%s: %d replica%s run here", s.Name, s.Replicas, plural(s.Replicas))
				continue
			}
			fmt.Fprintf(&b, "%s: %d replica%s declared, %d static", s.Name, s.Replicas, plural(s.Replicas), len(s.Static))
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, ", listen %s%s", c.Listen, tlsSummary(c.TLS.Certificates))
	if c.Admin.Listen == "" {
		b.WriteString(", admin off")
	} else {
		fmt.Fprintf(&b, ", admin %s%s", c.Admin.Listen, tlsSummary(c.Admin.TLS.Certificates))
	}
	if c.Gossip.Enabled {
		fmt.Fprintf(&b, ", gossip %s:%d", c.Gossip.BindAddr, c.Gossip.BindPort)
		if len(c.Gossip.Join) > 0 {
			fmt.Fprintf(&b, " joining %s", strings.Join(c.Gossip.Join, ","))
		}
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Redacted returns a copy of c that is safe to print or log: secrets are
// blanked. There are no secrets yet, so today it is a deep copy (no slice is
// shared with c); the gossip encryption key and the admin token will be
// blanked here when they arrive.
func Redacted(c Config) Config {
	return deepCopy(reflect.ValueOf(c)).Interface().(Config)
}
