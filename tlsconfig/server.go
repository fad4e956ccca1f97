package tlsconfig

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ServerOptions are a Server's dependencies. The zero value works: no
// logs, no metrics, no events.
type ServerOptions struct {
	// Listener names the listener ("proxy", "admin") in metrics (label
	// listener), logs and events.
	Listener string
	// Path is the configuration section's YAML path, e.g. "tls" or
	// "admin.tls": errors name their keys under it.
	Path string
	// Logger receives the loads, reloads and refusals. Nil discards them.
	Logger *zap.Logger
	// Registerer receives the listener's TLS metrics, labelled
	// listener=Listener, so that several listeners share one registry.
	// Nil: not exported.
	Registerer prometheus.Registerer
	// OnEvent, if non-nil, is told about every reload that changed what
	// the listener serves and every reload refused (for the audit trail).
	// It is called with the Server's lock held: it must not block nor
	// call back into the Server.
	OnEvent func(Event)

	// now replaces the wall clock when non-nil (tests).
	now func() time.Time
}

// Event is a reload of a listener's TLS files: applied, or refused.
type Event struct {
	// Listener is ServerOptions.Listener.
	Listener string
	// Source is what triggered it: "watch" (the watcher saw the files
	// change) or the source given to Prepare ("SIGHUP", "api").
	Source string
	// Result is "success" or "failure".
	Result string
	// Key, File and Error describe a failure: the first key whose file
	// was refused, that file, and every problem (joined).
	Key, File, Error string
	// Certificates are the certificates served after the event: the new
	// ones, or after a failure the ones that stay.
	Certificates []CertificateInfo
}

// Server serves a listener's TLS: it loads a ServerConfig's files into a
// tls.Config whose certificates, minimum version and client CAs can be
// replaced while connections are open (new handshakes use the new ones,
// open connections are not touched), and watches the files. Build it with
// NewServer; serve its Listener (or tls.NewListener with TLSConfig); run
// Run for the watcher. It is safe for concurrent use and must not be
// copied.
type Server struct {
	name   string
	prefix string // the section's path with a trailing dot
	log    *zap.Logger
	event  func(Event)
	now    func() time.Time
	base   *tls.Config
	cur    atomic.Pointer[generation]
	kick   chan struct{} // capacity 1: the watch interval may have changed

	// mu serializes installs and the watcher's checks, and guards the
	// watcher's memory of failed readings.
	mu       sync.Mutex
	pending  *[32]byte // a failing reading seen once and not reported yet
	reported *[32]byte // the failing reading reported last

	expiry     *prometheus.GaugeVec
	reloads    *prometheus.CounterVec
	handshakes prometheus.Counter
}

// NewServer loads cfg's files. It fails if cfg has no certificates, does
// not validate, or its files do not load (see CheckFiles); the error names
// the keys under opts.Path. An expired certificate is served, with a
// warning. NewServer starts no goroutine.
func NewServer(cfg ServerConfig, opts ServerOptions) (*Server, error) {
	s := &Server{
		name:  opts.Listener,
		log:   cmp.Or(opts.Logger, zap.NewNop()),
		event: opts.OnEvent,
		now:   opts.now,
		kick:  make(chan struct{}, 1),
	}
	if s.now == nil {
		s.now = time.Now
	}
	if opts.Path != "" {
		s.prefix = opts.Path + "."
	}
	g, err := s.load(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.register(opts.Registerer); err != nil {
		return nil, err
	}
	s.base = &tls.Config{GetConfigForClient: s.configForClient}
	s.cur.Store(g)
	s.setExpiry(g)
	s.log.Info("TLS certificates loaded", zap.String("listener", s.name), zap.Array("certificates", infoList(g.infos)),
		zap.String("min_version", cfg.MinVersion), zap.Bool("client_certificates", cfg.ClientCAFile != ""),
		zap.Duration("watch_interval", cfg.WatchInterval))
	for i, info := range g.infos {
		if now := s.now(); !now.Before(info.NotAfter) {
			s.log.Warn("a TLS certificate has expired: clients that verify it will refuse the connection", zap.String("listener", s.name),
				zap.String("key", fmt.Sprintf("%scertificates[%d].cert_file", s.prefix, i)), zap.String("file", info.CertFile),
				zap.Time("not_after", info.NotAfter))
		}
	}
	return s, nil
}

func (s *Server) register(reg prometheus.Registerer) error {
	s.expiry = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "keyway", Subsystem: "tls", Name: "certificate_expiry_timestamp_seconds",
		Help: "When each certificate the listener serves expires (Unix time), by the certificate's name (its first DNS name; the earliest expiry when two certificates share it).",
	}, []string{"name"})
	s.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "keyway", Subsystem: "tls", Name: "reloads_total",
		Help: "Loads of the listener's TLS files after start (a configuration reload, or a change the watcher saw), by result: success (served from then on) or failure (refused; the certificates being served stay).",
	}, []string{"result"})
	s.handshakes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "keyway", Subsystem: "tls", Name: "handshake_errors_total",
		Help: "TLS handshakes that failed on the listener: an unsupported version, a missing or untrusted client certificate, a client that does not speak TLS, a timeout. A client that closes before its hello is not counted.",
	})
	s.reloads.WithLabelValues("success")
	s.reloads.WithLabelValues("failure")
	if reg == nil {
		return nil
	}
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"listener": s.name}, reg)
	for _, c := range []prometheus.Collector{s.expiry, s.reloads, s.handshakes} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register TLS metrics of the %s listener: %w", s.name, err)
		}
	}
	return nil
}

// TLSConfig returns the configuration to serve: every handshake takes
// the generation current at its start. Pass it to tls.NewListener (e.g.
// for net/http, which needs *tls.Conn), or serve Listener instead.
func (s *Server) TLSConfig() *tls.Config { return s.base }

func (s *Server) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	return s.cur.Load().config, nil
}

// Certificates describes the certificates served now, in configuration
// order.
func (s *Server) Certificates() []CertificateInfo {
	return append([]CertificateInfo(nil), s.cur.Load().infos...)
}

// Config returns the configuration served now.
func (s *Server) Config() ServerConfig { return s.cur.Load().cfg }

// load validates cfg and builds a generation from its files.
func (s *Server) load(cfg ServerConfig) (*generation, error) {
	if !cfg.Enabled() {
		return nil, fmt.Errorf("%scertificates: empty: the %s listener serves TLS since its start; turning TLS off takes effect only at start", s.prefix, s.name)
	}
	if err := cfg.Validate(); err != nil {
		return nil, prefixed(s.prefix, err)
	}
	return build(cfg, readFiles(cfg), s.prefix)
}

// Pending is a configuration Prepare loaded, not served yet.
type Pending struct {
	g      *generation
	source string
}

// Prepare reads cfg's files again, whether or not cfg changed, and
// builds what Install would serve, without serving it; source names the
// trigger ("SIGHUP", "api"). Besides NewServer's rules, a certificate
// that has expired is refused in place of one that has not: a reload
// never swaps a valid certificate for an expired one. A refusal is
// counted, logged and reported (OnEvent) here, and changes nothing.
func (s *Server) Prepare(cfg ServerConfig, source string) (*Pending, error) {
	g, err := s.load(cfg)
	if err == nil {
		err = s.checkExpiry(g, s.cur.Load())
	}
	if err != nil {
		s.mu.Lock()
		s.refused(source, err)
		s.mu.Unlock()
		return nil, err
	}
	return &Pending{g: g, source: source}, nil
}

// Install serves what Prepare loaded: new handshakes use it from now on;
// open connections keep theirs.
func (s *Server) Install(p *Pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.install(p.g, p.source)
	select {
	case s.kick <- struct{}{}: // the watch interval may have changed
	default:
	}
}

// Reload is Prepare and, if it succeeds, Install.
func (s *Server) Reload(cfg ServerConfig, source string) error {
	p, err := s.Prepare(cfg, source)
	if err != nil {
		return err
	}
	s.Install(p)
	return nil
}

// install swaps in g; s.mu is held.
func (s *Server) install(g *generation, source string) {
	old := s.cur.Swap(g)
	s.pending, s.reported = nil, nil
	s.reloads.WithLabelValues("success").Inc()
	s.setExpiry(g)
	if old.sum == g.sum && old.cfg.MinVersion == g.cfg.MinVersion {
		s.log.Debug("TLS files read again, unchanged", zap.String("listener", s.name), zap.String("source", source))
		return
	}
	s.log.Info("TLS certificates reloaded: new connections get them", zap.String("listener", s.name), zap.String("source", source),
		zap.Array("certificates", infoList(g.infos)), zap.String("min_version", g.cfg.MinVersion),
		zap.Bool("client_certificates", g.cfg.ClientCAFile != ""))
	if s.event != nil {
		s.event(Event{Listener: s.name, Source: source, Result: "success", Certificates: append([]CertificateInfo(nil), g.infos...)})
	}
}

// refused counts, logs and reports a reload that failed; s.mu is held.
func (s *Server) refused(source string, err error) {
	s.reloads.WithLabelValues("failure").Inc()
	ev := Event{Listener: s.name, Source: source, Result: "failure", Error: err.Error(), Certificates: s.Certificates()}
	var fe *FileError
	if errors.As(err, &fe) {
		ev.Key, ev.File = fe.Key, fe.File
	}
	s.log.Error("TLS reload refused: the certificates being served stay", zap.String("listener", s.name), zap.String("source", source),
		zap.String("key", ev.Key), zap.String("file", ev.File), zap.String("error", ev.Error),
		zap.Array("certificates", infoList(ev.Certificates)))
	if s.event != nil {
		s.event(ev)
	}
}

// checkExpiry refuses a certificate of g that has expired where cur's
// certificate at the same position has not.
func (s *Server) checkExpiry(g, cur *generation) error {
	now := s.now()
	var errs []error
	for i, info := range g.infos {
		if now.Before(info.NotAfter) || i >= len(cur.infos) || !now.Before(cur.infos[i].NotAfter) {
			continue
		}
		errs = append(errs, &FileError{Key: fmt.Sprintf("%scertificates[%d].cert_file", s.prefix, i), File: info.CertFile, Err: fmt.Errorf(
			"%s: the certificate expired at %s; the one being served in its place (valid until %s) stays: renew the certificate",
			info.CertFile, info.NotAfter.UTC().Format(time.RFC3339), cur.infos[i].NotAfter.UTC().Format(time.RFC3339))})
	}
	return errors.Join(errs...)
}

func (s *Server) setExpiry(g *generation) {
	s.expiry.Reset()
	earliest := map[string]time.Time{}
	for _, info := range g.infos {
		n := info.Name()
		if t, ok := earliest[n]; !ok || info.NotAfter.Before(t) {
			earliest[n] = info.NotAfter
		}
	}
	for n, t := range earliest {
		s.expiry.WithLabelValues(n).Set(float64(t.Unix()))
	}
}

// Run watches the files until ctx is done: every watch_interval (of the
// configuration served; 0 pauses watching) it reads them, and when their
// contents changed it loads and serves them, or refuses them as Prepare
// does. A writer that replaces the certificate and the key one after the
// other may be caught between the two: a reading that fails is reported
// only when the next check finds the same files, so such a pair is loaded
// at the next check without a false alarm. A refused reading is not
// reported again until the files change, but it is tried again at every
// check.
func (s *Server) Run(ctx context.Context) error {
	for {
		var tick <-chan time.Time
		var t *time.Timer
		if iv := s.cur.Load().cfg.WatchInterval; iv > 0 {
			t = time.NewTimer(iv)
			tick = t.C
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return nil
		case <-s.kick:
			if t != nil {
				t.Stop()
			}
		case <-tick:
			s.check()
		}
	}
}

// check is one step of the watcher.
func (s *Server) check() {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("panic in the TLS file watcher", zap.String("listener", s.name), zap.Any("panic", v), zap.Stack("stack"))
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.cur.Load()
	fs := readFiles(cur.cfg)
	if fs.sum == cur.sum {
		s.pending = nil
		return
	}
	g, err := build(cur.cfg, fs, s.prefix)
	if err == nil {
		err = s.checkExpiry(g, cur)
	}
	if err == nil {
		s.install(g, "watch")
		return
	}
	sum := fs.sum
	switch {
	case s.reported != nil && *s.reported == sum:
	case s.pending != nil && *s.pending == sum:
		s.refused("watch", err)
		s.pending, s.reported = nil, &sum
	default:
		s.pending = &sum
		s.log.Debug("TLS files changed but do not load; checking again before refusing them", zap.String("listener", s.name), zap.Error(err))
	}
}

// infoList logs certificates as an array of objects.
type infoList []CertificateInfo

func (l infoList) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, info := range l {
		if err := enc.AppendObject(info); err != nil {
			return err
		}
	}
	return nil
}

// MarshalLogObject logs a certificate's file, names, subject, issuer,
// expiry and fingerprint.
func (i CertificateInfo) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("cert_file", i.CertFile)
	enc.AddString("names", strings.Join(i.Names, ","))
	enc.AddString("subject", i.Subject)
	enc.AddString("issuer", i.Issuer)
	enc.AddTime("not_after", i.NotAfter)
	enc.AddString("sha256", i.SHA256)
	return nil
}

// prefixed prepends prefix to every error joined in err.
func prefixed(prefix string, err error) error {
	if err == nil || prefix == "" {
		return err
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, prefixed(prefix, e))
		}
		return errors.Join(out...)
	}
	return fmt.Errorf("%s%w", prefix, err)
}
