// Package admin serves keyway's admin listener: the JSON API under /v1/
// (read: replica sets, routes, plans, gossip members, audit events, config;
// mutating, with the bearer token: drain, undrain, reload, create, change,
// stop, start and delete sets, repair, restart; see
// docs/admin.md), Prometheus metrics at /metrics, liveness at
// /healthz, readiness at /readyz and Go profiles at /debug/pprof/ (open on
// a loopback listener, behind the bearer token on any other: admin.debug).
// It uses net/http on its own listener (loopback by default), so scrapes
// never compete with proxied traffic and are never routed or exposed on the
// ingress port. Every other path answers a JSON error. Every answer carries
// X-Keyway-Admin (AdminHeader), and a request whose Host does not name the
// listener is refused (host.go); the Client probes for the header before it
// sends anything else (probe.go).
package admin

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"keyway/tlsconfig"
)

// Readiness reports whether the process should receive traffic, and if not,
// why. The proxy satisfies it.
type Readiness interface {
	Ready() bool
}

// Options are the admin server's dependencies. Gatherer is required.
type Options struct {
	Gatherer prometheus.Gatherer
	// Listen opens the admin listening socket; nil means net.Listen. A
	// process that inherits its sockets (an upgrade's new process, systemd
	// socket activation) passes one that hands them out.
	Listen func(network, addr string) (net.Listener, error)
	// Ready, if nil, makes /readyz always ready.
	Ready  Readiness
	Logger *zap.Logger

	// The read API under /v1/ (see api.go). A nil source makes its
	// endpoints answer 501 with a JSON error.
	Sets    SetView
	Members MemberLister
	Events  EventSource
	Config  ConfigSource
	Fleet   FleetSource
	Planner Planner

	// Drainer serves the mutating drain and undrain endpoints (drain.go);
	// nil makes them answer 501.
	Drainer Drainer
	// Reloader serves POST /v1/reload (operate.go); nil makes it answer
	// 501.
	Reloader Reloader
	// SetAdmin serves the run-time changes of replica sets (sets.go):
	// create, change, stop, start, delete; nil makes them answer 501.
	SetAdmin SetAdmin
	// Repairer serves POST /v1/replica_sets/{set}/repair (repair.go); nil
	// makes it answer 501.
	Repairer Repairer
	// Restarter serves /v1/replica_sets/{set}/restart (restart.go); nil
	// makes it answer 501.
	Restarter Restarter
	// Jobs lists the jobs of sets whose replicas keyway runs; nil
	// answers 503.
	Jobs Jobber
	// Env looks up KEYWAY_ADMIN_TOKEN; nil means os.LookupEnv.
	Env func(string) (string, bool)
	// Registerer receives the listener's TLS metrics (with admin.tls).
	// Nil: not exported.
	Registerer prometheus.Registerer
	// TLSEvents, if non-nil, is told about every reload of the
	// listener's TLS files that changed what it serves or was refused.
	// It must not block.
	TLSEvents func(tlsconfig.Event)
}

// Server is the admin HTTP server. It is safe for concurrent use.
type Server struct {
	cfg   Config
	opts  Options
	log   *zap.Logger
	srv   *http.Server
	tls   *tlsconfig.Server      // nil: plain HTTP
	token atomic.Pointer[string] // the bearer token of the mutating endpoints; "" refuses them
	hosts atomic.Pointer[hostPolicy]
	// hostname is the machine's name (host.go), read once.
	hostname string

	mu sync.Mutex
	ln net.Listener
}

// New builds the server. It does not listen.
func New(cfg Config, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("admin config: %w", err)
	}
	if opts.Gatherer == nil {
		return nil, errors.New("admin: a metrics gatherer is required")
	}
	token, err := checkToken(cfg, opts.Env)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, opts: opts, log: cmp.Or(opts.Logger, zap.NewNop()), hostname: machineName()}
	s.token.Store(&token)
	s.SetAllowedHosts(cfg.AllowedHosts)
	if cfg.Listen != "" && cfg.TLS.Enabled() {
		s.tls, err = tlsconfig.NewServer(cfg.TLS, tlsconfig.ServerOptions{
			Listener: "admin", Path: "admin.tls", Logger: s.log.Named("tls"), Registerer: opts.Registerer, OnEvent: opts.TLSEvents,
		})
		if err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{
		ErrorLog:      zap.NewStdLog(s.log),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if opts.Ready != nil && !opts.Ready.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	s.routeMutating(mux)
	s.routeOperate(mux)
	s.routeSets(mux)
	s.routeRepair(mux)
	s.routeJobs(mux)
	s.routeRestart(mux)
	s.routePlan(mux)
	s.routeAPI(mux)
	s.routeUI(mux)
	mux.HandleFunc("GET /debug/pprof/", s.debugOnly(pprof.Index))
	mux.HandleFunc("GET /debug/pprof/cmdline", s.debugOnly(pprof.Cmdline))
	mux.HandleFunc("GET /debug/pprof/profile", s.debugOnly(pprof.Profile))
	mux.HandleFunc("GET /debug/pprof/symbol", s.debugOnly(pprof.Symbol))
	mux.HandleFunc("GET /debug/pprof/trace", s.debugOnly(pprof.Trace))
	s.routeRest(mux)
	s.srv = &http.Server{
		Handler:           s.guard(mux),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          zap.NewStdLog(s.log),
	}
	return s, nil
}

// CheckToken applies New's token rules to cfg without building a server:
// the token file must be readable and not empty, and a listener off
// loopback needs a token. lookup finds KEYWAY_ADMIN_TOKEN; nil means
// os.LookupEnv. keyway validate uses it.
func CheckToken(cfg Config, lookup func(string) (string, bool)) error {
	_, err := checkToken(cfg, lookup)
	return err
}

func checkToken(cfg Config, lookup func(string) (string, bool)) (string, error) {
	token, err := loadToken(cfg, lookup)
	if err != nil {
		return "", fmt.Errorf("admin config: %w", err)
	}
	if cfg.Listen != "" && token == "" && !loopback(cfg.Listen) {
		return "", fmt.Errorf("admin.listen %q is not a loopback address and no admin token is configured: "+
			"set admin.token_file (or %s) so the mutating endpoints need a token, or listen on loopback (e.g. \"127.0.0.1:9901\")", cfg.Listen, TokenEnv)
	}
	if cfg.Listen != "" && token == "" && cfg.Debug == DebugToken {
		return "", fmt.Errorf("admin.debug %q needs the admin token and none is configured: "+
			"set admin.token_file (or %s), or set admin.debug to auto", cfg.Debug, TokenEnv)
	}
	return token, nil
}

// ReloadToken reads the admin token again (KEYWAY_ADMIN_TOKEN, else
// tokenFile), for a configuration reload: a rotated token file takes
// effect without a restart. On an error, or an empty token on a listener
// off loopback, the old token stays.
func (s *Server) ReloadToken(tokenFile string) error {
	token, err := s.tokenFor(tokenFile)
	if err != nil {
		return err
	}
	s.token.Store(&token)
	return nil
}

// CheckToken reports the error ReloadToken would return, changing nothing.
func (s *Server) CheckToken(tokenFile string) error {
	_, err := s.tokenFor(tokenFile)
	return err
}

// tokenFor reads the token by the rules of New, with tokenFile as
// admin.token_file.
func (s *Server) tokenFor(tokenFile string) (string, error) {
	c := s.cfg
	c.TokenFile = tokenFile
	token, err := loadToken(c, s.opts.Env)
	if err != nil {
		return "", fmt.Errorf("admin.%w", err)
	}
	if token == "" && !loopback(c.Listen) {
		return "", fmt.Errorf("admin.token_file: no token, and admin.listen %q is not a loopback address: the mutating endpoints would be open to the network", c.Listen)
	}
	if token == "" && c.Debug == DebugToken {
		return "", fmt.Errorf("admin.token_file: no token, and admin.debug is %q: /debug/pprof/ and /v1/config would answer nobody", c.Debug)
	}
	return token, nil
}

// Listen opens the listener if it is not open yet.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	listen := s.opts.Listen
	if listen == nil {
		listen = net.Listen
	}
	ln, err := listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("admin listen %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	return nil
}

// TLS returns the listener's TLS server (its certificates, reload and
// watcher), or nil when it speaks plain HTTP.
func (s *Server) TLS() *tlsconfig.Server { return s.tls }

// Addr returns the bound address, or nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Run serves until ctx is done, then shuts down within 5 seconds.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	ln := s.ln
	var watcher sync.WaitGroup
	if s.tls != nil {
		// tls.NewListener, not s.tls.Listener: net/http fills
		// Request.TLS only for a *tls.Conn. It logs failed handshakes
		// itself (ErrorLog).
		ln = tls.NewListener(s.ln, s.tls.TLSConfig())
		wctx, stop := context.WithCancel(ctx)
		defer func() { stop(); watcher.Wait() }()
		watcher.Go(func() { _ = s.tls.Run(wctx) })
	}
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(ln) }()
	s.log.Info("admin listening", zap.Stringer("addr", s.ln.Addr()), zap.Bool("tls", s.tls != nil))
	select {
	case err := <-errc:
		return fmt.Errorf("admin serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	<-errc
	return err
}
