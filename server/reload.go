package server

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/admin"
	"keyway/config"
	"keyway/eventlog"
	"keyway/tlsconfig"
)

// reloadable reports whether a configuration key takes effect on a
// reload. Every other key takes effect only at start: a reload that
// changes one is refused whole.
func reloadable(path string) bool {
	return path == "replica_sets" || strings.HasPrefix(path, "replica_sets[") ||
		path == "log.level" || path == "admin.token_file" ||
		path == "admin.allowed_hosts" || strings.HasPrefix(path, "admin.allowed_hosts[") ||
		// TLS files, versions and CAs; turning TLS on or off is refused
		// separately (tlsOnOff).
		strings.HasPrefix(path, "tls.") || strings.HasPrefix(path, "admin.tls.") ||
		// The fleet credentials (a key rotation, a set's new agent key)
		// and whether they are required (the end of a rolling upgrade).
		path == "gossip.credentials_file" || path == "gossip.signatures"
}

// tlsOnOff reports, for each listener whose TLS the new configuration
// turns on or off, why the reload is refused: the listener is opened with
// or without TLS at start.
func tlsOnOff(file string, cur, next config.Config) []string {
	var probs []string
	for _, l := range []struct {
		key       string
		was, will bool
	}{
		{"tls.certificates", cur.TLS.Enabled(), next.TLS.Enabled()},
		{"admin.tls.certificates", cur.Admin.TLS.Enabled(), next.Admin.TLS.Enabled()},
	} {
		if l.was != l.will {
			state := map[bool]string{true: "TLS", false: "plain HTTP"}
			probs = append(probs, fmt.Sprintf("%s: %s: the listener serves %s, the file says %s: turning TLS on or off takes effect only at start; restart keyway to change it",
				file, l.key, state[l.was], state[l.will]))
		}
	}
	return probs
}

// reloadMetrics count reloads.
type reloadMetrics struct {
	total    *prometheus.CounterVec
	lastOK   prometheus.Gauge
	lastTime prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) (*reloadMetrics, error) {
	m := &reloadMetrics{
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
	m.total.WithLabelValues("success")
	m.total.WithLabelValues("failure")
	m.lastOK.Set(1)
	m.lastTime.Set(float64(time.Now().UnixNano()) / 1e9)
	for _, c := range []prometheus.Collector{m.total, m.lastOK, m.lastTime} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Reload re-reads the configuration file (SIGHUP, POST /v1/reload) and
// applies what may change while keyway runs: the replica sets, the log
// level, the admin token and admin.allowed_hosts, the listeners' TLS keys
// (their files are read again even when unchanged; turning TLS on or off
// needs a restart)
// and the fleet credentials (gossip.credentials_file, read again, and
// gossip.signatures). Any other change, or a file that does not
// load, refuses the whole reload: the error is an *admin.ReloadError
// listing every problem. source names the trigger in logs and the audit
// trail. Reloads are serialized. It implements admin.Reloader.
func (n *ProxyNode) Reload(source string) (admin.ReloadResult, error) {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	if n.load == nil {
		return n.reloadFailed(source, []string{"the configuration did not come from a file: nothing to reload"})
	}
	cfg, err := n.load()
	if err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			probs := make([]string, len(ce.Problems))
			for i, p := range ce.Problems {
				probs[i] = p.String()
			}
			return n.reloadFailed(source, probs)
		}
		return n.reloadFailed(source, []string{err.Error()})
	}
	changes := config.Diff(n.cur, cfg)
	var probs []string
	keys := make([]string, 0, len(changes))
	for _, c := range changes {
		keys = append(keys, c.Path)
		if !reloadable(c.Path) {
			probs = append(probs, fmt.Sprintf("%s: %s: running with %s, the file says %s: this key takes effect only at start; restart keyway to change it, or put the running value back",
				n.file, c.Path, c.Old, c.New))
		}
	}
	if n.adm != nil {
		// The same rules as at start (KEYWAY_ADMIN_TOKEN first), checked
		// before anything applies: nothing may fail after the proxy's Reload.
		if err := n.adm.CheckToken(cfg.Admin.TokenFile); err != nil {
			probs = append(probs, fmt.Sprintf("%s: %v", n.file, err))
		}
	}
	probs = append(probs, tlsOnOff(n.file, n.cur, cfg)...)
	if len(probs) > 0 {
		return n.reloadFailed(source, probs)
	}
	// The listeners' TLS files are read again whether or not their keys
	// changed (renewed certificates under the same names): a file that
	// does not load refuses the reload, and the certificates being served
	// stay. Installed once nothing can refuse the reload any more.
	var installs []func()
	for _, l := range []struct {
		srv *tlsconfig.Server
		cfg tlsconfig.ServerConfig
	}{{n.p.TLS(), cfg.TLS}, {n.adminTLS(), cfg.Admin.TLS}} {
		if l.srv == nil {
			continue
		}
		pending, err := l.srv.Prepare(l.cfg, source)
		if err != nil {
			probs = append(probs, fmt.Sprintf("%s: %v", n.file, err))
			continue
		}
		installs = append(installs, func() { l.srv.Install(pending) })
	}
	if n.node != nil {
		// The credentials file is read again whether or not its name
		// changed (a rotation or a new set's key, in place).
		install, err := n.node.PrepareAuth(cfg.Gossip.Config)
		if err != nil {
			probs = append(probs, fmt.Sprintf("%s: gossip.%v", n.file, err))
		} else {
			installs = append(installs, install)
		}
	}
	if len(probs) > 0 {
		return n.reloadFailed(source, probs)
	}
	eff, rtProbs := config.ApplyRuntime(cfg, n.rt.Records())
	n.overlayKube(&eff)
	info, err := n.p.Reload(eff.Config)
	if err != nil {
		var lines []string
		for _, l := range strings.Split(err.Error(), "\n") {
			lines = append(lines, n.file+": "+l)
		}
		return n.reloadFailed(source, lines)
	}
	// From here on nothing can refuse the file.
	for _, install := range installs {
		install()
	}
	if err := n.logs.SetLevel(cfg.Log.Level); err != nil {
		n.rlog.Error("log level not applied", zap.Error(err))
	}
	if n.adm != nil {
		if err := n.adm.ReloadToken(cfg.Admin.TokenFile); err != nil {
			n.rlog.Error("admin token not reloaded; the old one stays", zap.Error(err))
		}
		n.adm.SetAllowedHosts(cfg.Admin.AllowedHosts)
	}
	n.applied(eff, rtProbs, info, 2*time.Second)
	prev := n.cur
	n.cur = cfg
	n.reloads.total.WithLabelValues("success").Inc()
	n.reloads.lastOK.Set(1)
	n.reloads.lastTime.Set(float64(time.Now().UnixNano()) / 1e9)
	falls := config.FallThroughs(prev, cfg)
	for _, w := range falls {
		n.rlog.Warn("configuration reloaded: "+w, zap.String("file", n.file))
	}
	res := admin.ReloadResult{
		Result: "success", File: n.file, Keys: keys, Warnings: falls,
		Added: nonNil(info.Added), Removed: nonNil(info.Removed), Changed: nonNil(info.Changed), RingChanged: nonNil(info.RingChanged),
	}
	n.rlog.Info("configuration reloaded", zap.String("source", source), zap.String("file", n.file),
		zap.Strings("keys", keys), zap.Strings("added", info.Added), zap.Strings("removed", info.Removed),
		zap.Strings("changed", info.Changed), zap.Int("unchanged", info.Unchanged))
	if len(info.RingChanged) > 0 {
		n.rlog.Warn("the hash of a replica set changed: its keys move; every proxy of the set needs the same change",
			zap.Strings("sets", info.RingChanged))
	}
	n.audit.Record(eventlog.KindConfigReload, "", "", map[string]any{
		"result": "success", "source": source, "file": n.file, "keys": keys,
		"added": res.Added, "removed": res.Removed, "changed": res.Changed, "ring_changed": res.RingChanged, "warnings": falls,
	})
	return res, nil
}

// adminTLS is the admin listener's TLS server, or nil.
func (n *ProxyNode) adminTLS() *tlsconfig.Server {
	if n.adm == nil {
		return nil
	}
	return n.adm.TLS()
}

func (n *ProxyNode) reloadFailed(source string, probs []string) (admin.ReloadResult, error) {
	n.reloads.total.WithLabelValues("failure").Inc()
	n.reloads.lastOK.Set(0)
	n.rlog.Error("configuration reload refused; the running configuration stays",
		zap.String("source", source), zap.String("file", n.file), zap.Int("problems", len(probs)))
	for _, p := range probs {
		n.rlog.Error("configuration problem", zap.String("problem", p))
	}
	n.audit.Record(eventlog.KindConfigReload, "", "", map[string]any{
		"result": "failure", "source": source, "file": n.file, "problems": probs,
	})
	return admin.ReloadResult{}, &admin.ReloadError{File: n.file, Problems: probs}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
