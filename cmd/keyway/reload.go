package main

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"keyway/admin"
	"keyway/config"
	"keyway/eventlog"
	"keyway/logging"
	"keyway/membership"
	"keyway/proxy"
)

// reloadable reports whether a configuration key takes effect on a
// reload. Every other key takes effect only at start: a reload that
// changes one is refused whole.
func reloadable(path string) bool {
	return path == "replica_sets" || strings.HasPrefix(path, "replica_sets[") ||
		path == "log.level" || path == "admin.token_file"
}

// reloader re-reads the configuration file (SIGHUP, POST /v1/reload) and
// applies what may change while keyway runs: the replica sets, the log
// level and the admin token. It implements admin.Reloader.
type reloader struct {
	file string
	load func() (config.Config, error)
	p    *proxy.Proxy
	logs *logging.Loggers
	log  *zap.Logger

	// Set after construction, before the first reload can happen.
	adm       *admin.Server
	node      *membership.Node
	disc      *membership.Discovery
	audit     *eventlog.Log
	onApplied func(config.Config)

	total    *prometheus.CounterVec
	lastOK   prometheus.Gauge
	lastTime prometheus.Gauge

	mu  sync.Mutex // serializes reloads; guards cur
	cur config.Config
}

func newReloader(file string, load func() (config.Config, error), cur config.Config, p *proxy.Proxy, logs *logging.Loggers, reg prometheus.Registerer) *reloader {
	r := &reloader{
		file: file, load: load, cur: cur, p: p, logs: logs,
		// A refused file is the operator's mistake, not keyway's: no stack traces.
		log: logs.App.Named("reload").WithOptions(zap.AddStacktrace(zapcore.FatalLevel)),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "config", Name: "reloads_total",
			Help: "Configuration reloads (SIGHUP or POST /v1/reload), by result: success (applied) or failure (refused; the running configuration stays).",
		}, []string{"result"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "config", Name: "last_reload_successful",
			Help: "1 if the last configuration reload was applied (or none was tried), 0 if it was refused.",
		}),
		lastTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "config", Name: "last_reload_success_timestamp_seconds",
			Help: "When the running configuration was applied: the start, or the last successful reload (Unix time).",
		}),
	}
	r.total.WithLabelValues("success")
	r.total.WithLabelValues("failure")
	r.lastOK.Set(1)
	r.lastTime.Set(float64(time.Now().UnixNano()) / 1e9)
	reg.MustRegister(r.total, r.lastOK, r.lastTime)
	return r
}

// Reload implements admin.Reloader.
func (r *reloader) Reload(source string) (admin.ReloadResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg, err := r.load()
	if err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			probs := make([]string, len(ce.Problems))
			for i, p := range ce.Problems {
				probs[i] = p.String()
			}
			return r.fail(source, probs)
		}
		return r.fail(source, []string{err.Error()})
	}
	changes := config.Diff(r.cur, cfg)
	var probs []string
	keys := make([]string, 0, len(changes))
	for _, c := range changes {
		keys = append(keys, c.Path)
		if !reloadable(c.Path) {
			probs = append(probs, fmt.Sprintf("%s: %s: running with %s, the file says %s: this key takes effect only at start; restart keyway to change it, or put the running value back",
				r.file, c.Path, c.Old, c.New))
		}
	}
	if r.adm != nil {
		// The same rules as at start (KEYWAY_ADMIN_TOKEN first), checked
		// before anything applies: nothing may fail after the proxy's Reload.
		if err := r.adm.CheckToken(cfg.Admin.TokenFile); err != nil {
			probs = append(probs, fmt.Sprintf("%s: %v", r.file, err))
		}
	}
	if len(probs) > 0 {
		return r.fail(source, probs)
	}
	info, err := r.p.Reload(cfg.Config)
	if err != nil {
		var lines []string
		for _, l := range strings.Split(err.Error(), "\n") {
			lines = append(lines, r.file+": "+l)
		}
		return r.fail(source, lines)
	}
	// From here on nothing can refuse the file.
	if err := r.logs.SetLevel(cfg.Log.Level); err != nil {
		r.log.Error("log level not applied", zap.Error(err))
	}
	if r.adm != nil {
		if err := r.adm.ReloadToken(cfg.Admin.TokenFile); err != nil {
			r.log.Error("admin token not reloaded; the old one stays", zap.Error(err))
		}
	}
	if r.disc != nil && (len(info.Added) > 0 || len(info.Removed) > 0) {
		r.disc.Resync()
	}
	if r.node != nil {
		fp := membership.FingerprintMeta(r.p.Fingerprints())
		if r.node.Meta().Fingerprint != fp {
			if err := r.node.UpdateMeta(func(m *membership.Meta) { m.Fingerprint = fp }, 2*time.Second); err != nil {
				r.log.Warn("gossip metadata not updated with the new ring fingerprints", zap.Error(err))
			}
		}
	}
	r.cur = cfg
	if r.onApplied != nil {
		r.onApplied(cfg)
	}
	r.total.WithLabelValues("success").Inc()
	r.lastOK.Set(1)
	r.lastTime.Set(float64(time.Now().UnixNano()) / 1e9)
	res := admin.ReloadResult{
		Result: "success", File: r.file, Keys: keys,
		Added: nonNil(info.Added), Removed: nonNil(info.Removed), Changed: nonNil(info.Changed), RingChanged: nonNil(info.RingChanged),
	}
	r.log.Info("configuration reloaded", zap.String("source", source), zap.String("file", r.file),
		zap.Strings("keys", keys), zap.Strings("added", info.Added), zap.Strings("removed", info.Removed),
		zap.Strings("changed", info.Changed), zap.Int("unchanged", info.Unchanged))
	if len(info.RingChanged) > 0 {
		r.log.Warn("the hash of a replica set changed: its keys move; every proxy of the set needs the same change",
			zap.Strings("sets", info.RingChanged))
	}
	if r.audit != nil {
		r.audit.Record(eventlog.KindConfigReload, "", "", map[string]any{
			"result": "success", "source": source, "file": r.file, "keys": keys,
			"added": res.Added, "removed": res.Removed, "changed": res.Changed, "ring_changed": res.RingChanged,
		})
	}
	return res, nil
}

func (r *reloader) fail(source string, probs []string) (admin.ReloadResult, error) {
	r.total.WithLabelValues("failure").Inc()
	r.lastOK.Set(0)
	r.log.Error("configuration reload refused; the running configuration stays",
		zap.String("source", source), zap.String("file", r.file), zap.Int("problems", len(probs)))
	for _, p := range probs {
		r.log.Error("configuration problem", zap.String("problem", p))
	}
	if r.audit != nil {
		r.audit.Record(eventlog.KindConfigReload, "", "", map[string]any{
			"result": "failure", "source": source, "file": r.file, "problems": probs,
		})
	}
	return admin.ReloadResult{}, &admin.ReloadError{File: r.file, Problems: probs}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// scaler changes declared counts for PATCH /v1/replica_sets/{set}.
type scaler struct {
	p     *proxy.Proxy
	audit *eventlog.Log
}

func (s scaler) SetDeclared(set string, n int) (int, error) {
	prev, err := s.p.SetDeclared(set, n)
	if errors.Is(err, proxy.ErrUnknownSet) {
		return 0, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	if err != nil {
		return prev, err
	}
	s.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{"action": "scale", "replicas": n, "previous": prev, "scope": admin.ScopeThisProxy})
	return prev, nil
}
