package proxy

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.uber.org/zap"
)

// SetRemover may be implemented by a TableObserver that wants to know when
// a replica set leaves the configuration (Reload). SetRemoved is called
// once, after the set's last table, from the goroutine calling Reload; the
// set publishes no table afterwards.
type SetRemover interface {
	SetRemoved(set string)
}

// ReloadInfo says what a Reload changed. Names are in configuration order.
type ReloadInfo struct {
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// Changed lists kept sets whose configuration changed.
	Changed []string `json:"changed,omitempty"`
	// RingChanged lists the sets whose hash changed: their keys move.
	RingChanged []string `json:"ring_changed,omitempty"`
	// Unchanged counts kept sets whose configuration is the same.
	Unchanged int `json:"unchanged"`
}

// Reload applies a new configuration's replica sets while the proxy runs,
// without closing a connection or failing an in-flight request: requests
// already routed finish with the generation they matched, new ones use
// the new one. A set that stays (same name) keeps its routing state: the
// replicas gossip reported, health exclusions, keep-alive pools (renewed
// only when timeouts.connect, timeouts.idle, timeouts.request,
// max_conns_per_replica or max_response_body_bytes change, or the tls
// section or the contents of its
// files, which every reload reads again: then new requests use new pools
// and the old pools' idle connections close), so its keys stay where they are
// unless its hash changes. A new set starts empty of gossip replicas
// (the caller resyncs discovery); a removed set's requests get 404 from
// then on and its metric series are deleted.
//
// listen and server.* take effect only at start, and max_body_bytes may
// not rise above the largest of all sets at start (the server reads no
// larger body): a cfg changing them is refused whole, with an error per
// key, and nothing changes.
func (p *Proxy) Reload(cfg Config) (ReloadInfo, error) {
	if err := p.CheckReload(cfg); err != nil {
		return ReloadInfo{}, err
	}

	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	old := p.routes.Load()
	rt, fresh, err := p.buildRoutes(cfg.ReplicaSets, cfg.Gone, old)
	if err != nil {
		return ReloadInfo{}, err
	}
	var info ReloadInfo
	for _, name := range rt.names {
		rs := rt.byName[name]
		st := rs.st
		if slices.Contains(fresh, st) {
			info.Added = append(info.Added, name)
			continue
		}
		prev := st.cur.Load()
		// The TLS files were read again: a renewed certificate or CA
		// changes the set even when its keys do not.
		sameTLS := prev.tls.Same(rs.tls)
		if sameTLS && reflect.DeepEqual(prev.cfg, rs.cfg) {
			info.Unchanged++
			continue
		}
		info.Changed = append(info.Changed, name)
		if prev.cfg.Hash != rs.cfg.Hash {
			info.RingChanged = append(info.RingChanged, name)
		}
		renew := prev.cfg.Timeouts.Connect != rs.cfg.Timeouts.Connect || prev.cfg.Timeouts.Idle != rs.cfg.Timeouts.Idle ||
			prev.cfg.Timeouts.Request != rs.cfg.Timeouts.Request || prev.cfg.MaxConnsPerReplica != rs.cfg.MaxConnsPerReplica ||
			prev.cfg.MaxResponseBodyBytes != rs.cfg.MaxResponseBodyBytes || !sameTLS
		reconf := renew || routerConfig(prev.cfg, 0) != routerConfig(rs.cfg, 0)
		if int64(rs.cfg.Replicas) != st.declared.Load() {
			st.declared.Store(int64(rs.cfg.Replicas))
			reconf = true // the observers learn the count from a new table
		}
		st.cur.Store(rs) // new backends are made from the new generation
		if static := staticReplicas(rs.cfg); !slices.Equal(staticReplicas(prev.cfg), static) {
			st.router.SetReplicas("static", static)
		}
		if reconf {
			if err := st.router.Reconfigure(routerConfig(rs.cfg, p.opts.Coalesce), renew); err != nil {
				// Validate checked the same rules: a bug if it happens.
				p.log.Error("replica set reconfiguration refused", zap.String("set", name), zap.Error(err))
			}
		} else {
			st.router.Flush()
		}
	}
	for _, st := range fresh {
		st.cur.Store(rt.byName[st.name])
	}
	p.routes.Store(rt)
	if p.runCtx != nil {
		for _, st := range fresh {
			p.startRouter(st)
		}
	}
	for _, name := range old.names {
		if _, ok := rt.byName[name]; ok {
			continue
		}
		info.Removed = append(info.Removed, name)
		p.removeSet(old.byName[name].st)
	}
	p.warnTLS(cfg.ReplicaSets)
	return info, nil
}

// removeSet retires a set that left the configuration; reloadMu is held
// and the routes without it are published.
func (p *Proxy) removeSet(st *setState) {
	if st.stop != nil {
		st.stop()
	}
	st.feedMu.Lock() // no gossip feed is halfway through the set
	st.removed.Store(true)
	st.router.SetReplicas("static", nil)
	st.router.SetReplicas("gossip", nil)
	st.router.Flush() // releases every backend: idle connections close
	st.mu.Lock()
	st.gossip = nil
	st.mu.Unlock()
	st.feedMu.Unlock()
	p.metrics.forgetSet(st.name)
	for _, o := range p.opts.Tables {
		if r, ok := o.(SetRemover); ok {
			r.SetRemoved(st.name)
		}
	}
	p.log.Info("replica set removed", zap.String("set", st.name))
}

// startOnlyDiffs names each key of a flat start-only section (server)
// whose value differs, as "section.key: running with A, the file says B".
func startOnlyDiffs(path string, running, file reflect.Value) []error {
	var errs []error
	t := running.Type()
	for i := range t.NumField() {
		key, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		a, b := running.Field(i).Interface(), file.Field(i).Interface()
		if a != b {
			errs = append(errs, fmt.Errorf("%s.%s: running with %v, the file says %v: it takes effect only at start; restart keyway to change it",
				path, key, a, b))
		}
	}
	return errs
}

// ErrUnknownSet is returned (wrapped) for a replica set the proxy does not
// serve.
var ErrUnknownSet = errors.New("unknown replica set")

// CheckReload reports whether Reload would apply cfg, without applying
// it: cfg validates, and changes no key that takes effect only at start.
func (p *Proxy) CheckReload(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("proxy config: %w", err)
	}
	var errs []error
	if cfg.Listen != p.cfg.Listen {
		errs = append(errs, fmt.Errorf("listen: running with %q, the file says %q: the listener is opened at start; restart keyway to change it", p.cfg.Listen, cfg.Listen))
	}
	if on := p.tls != nil; on != cfg.TLS.Enabled() {
		errs = append(errs, fmt.Errorf("tls.certificates: the listener %s, the file %s: turning TLS on or off takes effect only at start; restart keyway to change it",
			map[bool]string{true: "serves TLS", false: "speaks plain HTTP"}[on], map[bool]string{true: "has certificates", false: "has none"}[cfg.TLS.Enabled()]))
	}
	errs = append(errs, startOnlyDiffs("server", reflect.ValueOf(p.cfg.Server), reflect.ValueOf(cfg.Server))...)
	return errors.Join(errs...)
}
