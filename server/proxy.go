package server

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/eventlog"
	"keyway/eventlog/objstore"
	"keyway/health"
	"keyway/internal/buildinfo"
	"keyway/kube/backend"
	"keyway/logging"
	"keyway/membership"
	"keyway/proxy"
	"keyway/runner"
	"keyway/runstate"
)

// Options are what a node needs besides its configuration. The zero value
// works: logs are discarded, and the configuration cannot be reloaded.
type Options struct {
	// Stdout receives the access log (unless log.access.path names a
	// file) and Stderr the application logs. Nil means io.Discard.
	Stdout, Stderr io.Writer
	// File names the configuration file in reload messages.
	File string
	// Load reads the configuration again for Reload (with the same flags
	// and environment as at start). Nil makes Reload refuse: the
	// configuration did not come from a file.
	Load func() (config.Config, error)
	// Version is logged at start.
	Version string
	// Executable is the keyway program the local runner starts agents
	// with (a set's run section); "" means this process's own.
	Executable string
	// GossipFirstJoin lists gossip addresses joined once, first (an
	// upgrade's new process joins its old one): membership.Options.
	GossipFirstJoin []string
	// StopJobsOnExit makes the runner stop the jobs it runs when the node
	// stops (the demo); by default they outlive it, for the next process
	// to adopt.
	StopJobsOnExit bool
	// JobsStateDir is the state directory of the jobs of sets whose run
	// section names none (the demo's private directory); "" means the
	// runner's default.
	JobsStateDir string
	// GossipTransport, if non-nil, wraps the node's gossip transport
	// (membership.Options.Transport): a hook for tests that cut a node's
	// gossip in-process (internal/gossipfault) and for special networks.
	// Nil in production.
	GossipTransport func(*memberlist.NetTransport) memberlist.NodeAwareTransport
	// Listen opens the proxy's and the admin API's listening sockets, name
	// "proxy" or "admin"; nil means net.Listen. keyway proxy passes one
	// that hands out the sockets it inherited (an upgrade, systemd socket
	// activation).
	Listen func(name, network, addr string) (net.Listener, error)
	// HoldAccepts makes the proxy accept connections only once it is
	// ready to route them (HandedOver): for sockets that were listening
	// before this process started (an upgrade's new process, systemd
	// socket activation), whose clients wait in the kernel's queue
	// meanwhile instead of meeting a proxy that does not know its
	// replicas yet.
	HoldAccepts bool
	// AcceptWhileDraining is proxy.Options.AcceptWhileDraining: asked
	// once a stop begins, true keeps the proxy accepting through its
	// drain grace (the socket outlives the process, and no other process
	// accepts on it now). Nil: stop accepting at once.
	AcceptWhileDraining func() bool
}

// ProxyNode is one keyway proxy process: the proxy, its health checks and
// phases, the admin API, gossip discovery and the audit trail, wired in
// one place. Build it with NewProxy, run it once with Run; Reload applies a
// changed configuration file while it runs. Safe for concurrent use.
type ProxyNode struct {
	auditSink *objstore.Sink // nil without audit.sink
	cfg       config.Config
	logs      *logging.Loggers
	log       *zap.Logger

	// The components, in the order NewProxy builds them. Run starts them
	// in this order and stops them in reverse.
	reg    *prometheus.Registry
	audit  *eventlog.Log
	hc     *health.Checker
	phases *health.PhaseTracker
	p      *proxy.Proxy
	rt     *runstate.State       // the fleet's run-time state (sets.go)
	node   *membership.Node      // nil when gossip is off
	disc   *membership.Discovery // nil when gossip is off
	fleet  *membership.Fleet     // nil when gossip is off
	view   *view
	adm    *admin.Server       // nil when admin.listen is empty
	runner *runner.Runner      // nil when gossip is off
	kube   *backend.Controller // nil unless a set names a StatefulSet (kube.go)

	// hold delays the proxy's accepting until the node is ready to route
	// (Options.HoldAccepts); nil: accept at once.
	hold     chan struct{}
	holdOnce sync.Once

	// Rolling restarts (restart.go), and Run's context for them.
	restarts restarts
	runMu    sync.Mutex
	runCtx   context.Context // nil unless Run is running

	// Reload's state (reload.go).
	file     string
	load     func() (config.Config, error) // nil: no reload
	rlog     *zap.Logger
	reloads  *reloadMetrics
	reloadMu sync.Mutex    // serializes reloads and run-time changes; guards cur, eff and rtProbs
	cur      config.Config // the configuration file applied last
	eff      config.Config // what the proxy runs: cur with the run-time state applied
	rtProbs  []config.RuntimeProblem
}

// NewProxy builds a proxy node from cfg. It opens the proxy's and the
// admin API's listeners, so that a taken port fails here and the bound
// addresses (port 0) are known before Run, but it starts no goroutine and
// joins no gossip. On error it closes what it opened.
func NewProxy(cfg config.Config, opts Options) (_ *ProxyNode, err error) {
	logs, err := logging.New(cfg.Log, orDiscard(opts.Stderr), orDiscard(opts.Stdout))
	if err != nil {
		return nil, err
	}
	n := &ProxyNode{
		cfg: cfg, cur: cfg, logs: logs, log: logs.App, file: opts.File, load: opts.Load,
		// A refused file is the operator's mistake, not keyway's: no stack traces.
		rlog: logs.App.Named("reload").WithOptions(zap.AddStacktrace(zapcore.FatalLevel)),
	}
	defer func() {
		if err != nil {
			n.close()
		}
	}()

	// 1. Metrics and the audit trail: every other component reports to them.
	n.reg = prometheus.NewRegistry()
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	n.reg.MustRegister(buildinfo.Collector()) // keyway_build_info{version,commit,go_version}
	if n.reloads, err = newReloadMetrics(n.reg); err != nil {
		return nil, err
	}
	if err := logs.Register(n.reg); err != nil {
		return nil, err
	}
	auditOpts := eventlog.Options{Logger: n.log.Named("audit"), Registerer: n.reg}
	if cfg.Audit.Sink != "" {
		if n.auditSink, err = newAuditSink(cfg, n.log.Named("audit.sink"), n.reg); err != nil {
			return nil, err
		}
		if n.auditSink != nil {
			auditOpts.Sink = n.auditSink
		}
	}
	n.audit, err = eventlog.New(cfg.Audit, auditNode(cfg), auditOpts)
	if err != nil {
		return nil, err
	}
	// The fleet's run-time state (sets created, deleted, stopped or scaled
	// through the admin API) lies over the file: read it (from
	// runtime.state_dir, if any) before the proxy is built from both.
	n.rt, err = runstate.New(runstate.Options{
		Logger: n.log.Named("runtime"), Registerer: n.reg, Interval: cfg.Fleet.Interval, Dir: cfg.Runtime.StateDir,
		OnChange: n.runtimeChanged,
	})
	if err != nil {
		return nil, err
	}
	n.eff, n.rtProbs = config.ApplyRuntime(cfg, n.rt.Records())
	for _, p := range n.rtProbs {
		n.log.Error("a set created at run time cannot be served by this proxy; it is left out here", zap.String("set", p.Set),
			zap.Uint64("version", p.Version), zap.String("problem", p.Problem))
	}

	// 2. Health and phases. The checker excludes replicas on the proxy
	// built next, which in turn reports every request's outcome to the
	// checker: the checker's sink is bound to the proxy right after it
	// exists, before anything runs (step 3).
	excl := &exclusions{}
	n.hc, err = health.NewChecker(cfg.Health, excl, health.Options{Logger: n.log.Named("health"), Registerer: n.reg, OnEvent: auditHealth(n.audit),
		// Probes start with Run, after the proxy exists: they reach a set's
		// replicas over TLS as its requests do.
		ProbeTLS: func(set, replica, addr string) *tls.Config { return n.p.ReplicaTLS(set, replica, addr) }})
	if err != nil {
		return nil, err
	}
	n.phases, err = health.NewPhaseTracker(n.reg, auditPhase(n.audit, n.log.Named("phase")))
	if err != nil {
		return nil, err
	}

	// 3. The proxy: routing tables feed the health targets, the phases and
	// the audit trail.
	popts := proxy.Options{
		Logger:       n.log.Named("proxy"),
		Registerer:   n.reg,
		Tables:       []proxy.TableObserver{healthTargets{n.hc}, phaseObserver{n.phases}, tableAudit{n.audit}},
		FailOpen:     cfg.Health.FailOpen(),
		FleetChanged: func() { n.pokeFleet() },
		FleetEvents:  auditFleet(n.audit),
		TLSEvents:    auditTLS(n.audit),
		Listen:       listenAs(opts.Listen, "proxy"),

		AcceptWhileDraining: opts.AcceptWhileDraining,
	}
	if opts.HoldAccepts {
		n.hold = make(chan struct{})
		popts.Hold = n.hold
	}
	if cfg.Health.Passive.Enabled {
		popts.Observer = n.hc
	}
	if logs.Access != nil { // not a nil *AccessLog in the interface
		popts.AccessLog, popts.AccessKey = logs.Access, logs.Access.KeyAppender()
	}
	n.p, err = proxy.New(n.eff.Config, popts)
	if err != nil {
		return nil, err
	}
	excl.p = n.p
	if err := n.p.Listen(); err != nil {
		return nil, err
	}

	// 4. The admin API and what it shows: the view, drains, reload, scale.
	n.view = newView(n)
	adminAddr := ""
	if cfg.Admin.Listen != "" {
		aopts := admin.Options{
			Gatherer: n.reg, Ready: readiness{n}, Logger: n.log.Named("admin"),
			Sets: n.view, Members: n.view, Events: n.view, Config: n.view, Drainer: n.view, Fleet: n.view,
			SetAdmin: setAdmin{n}, Repairer: n.view, Planner: n.view, Restarter: n.view, Jobs: n.view,
			Registerer: n.reg, TLSEvents: auditTLS(n.audit), Listen: listenAs(opts.Listen, "admin"),
		}
		if opts.Load != nil {
			aopts.Reloader = n
		}
		n.adm, err = admin.New(cfg.Admin, aopts)
		if err != nil {
			return nil, err
		}
		if err := n.adm.Listen(); err != nil {
			return nil, err
		}
		adminAddr = n.adm.Addr().String()
	}

	// 5. Gossip: the node advertises this proxy (its fleet ID, admin
	// address and ring fingerprints); discovery feeds the proxy's routers with the
	// replicas agents advertise; the fleet exchange shares this proxy's
	// view with the other proxies and applies theirs.
	if cfg.Gossip.Enabled {
		// The proxy's fleet ID: fleet.id, or <host name>:<bound proxy
		// port>, which a process inheriting the listener shares.
		host, _ := os.Hostname()
		var id string
		if id, err = cfg.Fleet.ProxyID(host, n.p.Addr()); err != nil {
			return nil, err
		}
		n.disc = membership.NewDiscovery(n.p, membership.DiscoveryOptions{Logger: n.log.Named("discovery"), Registerer: n.reg, OnEvent: auditMember(n.audit), OnRepair: n.repairedElsewhere})
		n.fleet = membership.NewFleet(n.p, membership.FleetOptions{Logger: n.log.Named("fleet"), Registerer: n.reg, Interval: cfg.Fleet.Interval, Hold: n.hold})
		procs := processAudit{l: n.audit, members: func() []membership.Member { return n.node.Members() }, log: n.log.Named("audit")}
		n.node, err = membership.New(cfg.Gossip.Config, membership.Meta{
			Role:        membership.RoleProxy,
			ID:          id,
			Addr:        adminAddr,
			Fingerprint: membership.FingerprintMeta(n.p.Fingerprints()),
		}, membership.Options{Logger: n.log.Named("gossip"), Registerer: n.reg, Sink: n.disc,
			OnReject: auditRefused(n.audit), Transport: opts.GossipTransport, FirstJoin: opts.GossipFirstJoin})
		if err != nil {
			return nil, err
		}
		n.disc.Attach(n.node)
		n.fleet.Attach(n.node)
		n.rt.Attach(n.node)
		n.node.Handle(membership.ProcessEventKind, membership.RoleReplica, procs.handle)

		// 6. The local runner: the replicas of sets with a run section,
		// one agent each, started once this proxy knows the fleet's
		// run-time state.
		if n.runner, err = n.newRunner(cfg, opts); err != nil {
			return nil, err
		}
		// 7. The Kubernetes backend, for sets on StatefulSets.
		if needsKube(cfg) {
			if n.kube, err = n.newKube(cfg, id); err != nil {
				return nil, err
			}
			n.applyKube(n.eff)
		}
	}
	n.applyStops(n.eff)
	n.applyRunner(n.eff)
	n.log.Info("keyway starting", zap.String("version", opts.Version), zap.String("config", config.Summary(cfg)))
	return n, nil
}

// Run runs the node until ctx is done, then stops it in stages:
//
//  1. The proxy stops accepting and lets its in-flight requests finish
//     (server.shutdown_timeout); the admin API stops with it.
//  2. Meanwhile gossip keeps this proxy alive to the agents (a draining
//     replica waits for this proxy's drain reports), and health checks
//     keep ending ejections. They stop once the proxy has.
//  3. The audit trail stops last, so that their final events (a graceful
//     leave, a last rebuild) are written.
//
// The first component to fail stops them all; Run returns its error.
func (n *ProxyNode) Run(ctx context.Context) error {
	defer n.logs.Close()

	auditCtx, stopAudit := context.WithCancel(context.Background())
	auditDone := make(chan error, 1)
	go func() { auditDone <- n.audit.Run(auditCtx) }()
	// The object-storage sink stops after the trail, with its last
	// events: it uploads them within audit.segment_age... or its final
	// timeout.
	sinkCtx, stopSink := context.WithCancel(context.Background())
	sinkDone := make(chan struct{})
	go func() {
		defer close(sinkDone)
		if n.auditSink != nil {
			n.auditSink.Run(sinkCtx)
		}
	}()
	defer func() { stopAudit(); <-auditDone; stopSink(); <-sinkDone }()

	g, front := errgroup.WithContext(ctx)
	back, stopBack := context.WithCancel(context.WithoutCancel(front))
	defer stopBack()
	n.setRunContext(front)
	defer func() {
		n.setRunContext(nil)
		n.restarts.wg.Wait() // they end with front
	}()
	g.Go(func() error { return n.hc.Run(back) })
	if n.node != nil {
		g.Go(func() error { return n.node.Run(back) })
		g.Go(func() error { return n.disc.Run(back) })
		g.Go(func() error { return n.fleet.Run(back) })
		g.Go(func() error { return n.rt.Run(back) })
		n.restarts.wg.Go(func() { n.watchRestarts(front) })
		g.Go(func() error { return n.runner.Run(back) })
		if n.kube != nil {
			// Front: a stopping proxy gives the Lease up at once.
			g.Go(func() error { return n.kube.Run(front) })
		}
	}
	g.Go(func() error {
		err := n.p.Run(front)
		stopBack()
		return err
	})
	if n.adm != nil {
		g.Go(func() error { return n.adm.Run(front) })
	}
	if n.hold != nil {
		g.Go(func() error { n.releaseHold(front); return nil })
	}
	err := g.Wait()
	if err != nil {
		// No stack trace: the error says what failed (a taken port, say), and
		// the stack of Run's caller says nothing more.
		n.log.WithOptions(zap.AddStacktrace(zapcore.FatalLevel)).Error("keyway stopped with an error", zap.Error(err))
	}
	return err
}

// holdMax bounds how long a node holding its accepts (Options.HoldAccepts)
// waits to be ready: then it serves what it knows (its static replicas;
// requests for a set it knows no replica of get 503 with Retry-After).
const holdMax = 30 * time.Second

// releaseHold lets the proxy accept once the node can route as the fleet
// does: gossip has joined and the routers hold the replicas it brought,
// and the run-time state has been compared with another proxy's (see
// Runtime.Synced); at most holdMax.
func (n *ProxyNode) releaseHold(ctx context.Context) {
	defer n.holdOnce.Do(func() { close(n.hold) })
	if n.node == nil {
		return
	}
	deadline := time.NewTimer(holdMax)
	defer deadline.Stop()
	select {
	case <-n.node.Joined():
	case <-ctx.Done():
		return
	case <-deadline.C:
		n.log.Warn("not joined to gossip yet; accepting anyway", zap.Duration("after", holdMax))
		return
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !n.rt.Synced() {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			n.log.Warn("run-time state not compared with another proxy yet; accepting anyway", zap.Duration("after", holdMax))
			return
		case <-tick.C:
		}
	}
	n.p.FlushRouters()
}

// HandedOver reports whether the node accepts connections and, when it
// holds its accepts (Options.HoldAccepts), whether it has stopped
// holding: an upgrade's new process tells the old one to stop then.
func (n *ProxyNode) HandedOver() bool {
	if n.hold != nil {
		select {
		case <-n.hold:
		default:
			return false
		}
	}
	return n.p.Ready()
}

// ReopenLogs reopens the access log file, so that after a rotation
// (logrotate's create mode renamed it) new lines go to a new file of the
// configured name; keyway proxy calls it on SIGUSR1. Lines buffered
// before go to the old file. Without an access log file it does nothing.
// On an error the old file stays in use (logged and counted).
func (n *ProxyNode) ReopenLogs() error { return n.logs.ReopenAccessLog() }

// ProxyAddr is the proxy listener's bound address.
func (n *ProxyNode) ProxyAddr() string { return n.p.Addr().String() }

// AdminAddr is the admin listener's bound address, or "" without one.
func (n *ProxyNode) AdminAddr() string {
	if n.adm == nil {
		return ""
	}
	return n.adm.Addr().String()
}

// GossipStarted is closed once the gossip node is bound (Run started it);
// nil when gossip is off.
func (n *ProxyNode) GossipStarted() <-chan struct{} {
	if n.node == nil {
		return nil
	}
	return n.node.Started()
}

// MoveGossip moves the running gossip member to port (advertised as
// advertisePort, 0 meaning port): see membership.Node.MoveTo. Without
// gossip it does nothing.
func (n *ProxyNode) MoveGossip(ctx context.Context, port, advertisePort int) error {
	if n.node == nil {
		return nil
	}
	return n.node.MoveTo(ctx, port, advertisePort)
}

// GossipAddr is the gossip node's bound address once GossipStarted is
// closed, else "".
func (n *ProxyNode) GossipAddr() string {
	if n.node == nil {
		return ""
	}
	return n.node.GossipAddr()
}

// pokeFleet asks the fleet exchange to send this proxy's view now (its
// routing changed). Called by the proxy from its Router's writer: it never
// blocks.
func (n *ProxyNode) pokeFleet() {
	if n.fleet != nil {
		n.fleet.Poke()
	}
}

// Logger is the node's application logger.
func (n *ProxyNode) Logger() *zap.Logger { return n.log }

// Close releases what NewProxy opened, for a node that will not Run.
func (n *ProxyNode) Close() { n.close() }

// close releases what NewProxy opened when it fails half-way.
func (n *ProxyNode) close() {
	if n.p != nil {
		_ = n.p.Close()
	}
	if n.adm != nil {
		_ = n.adm.Close()
	}
	n.logs.Close()
}

// listenAs is listen for the listener name, or nil (net.Listen).
func listenAs(listen func(name, network, addr string) (net.Listener, error), name string) func(network, addr string) (net.Listener, error) {
	if listen == nil {
		return nil
	}
	return func(network, addr string) (net.Listener, error) { return listen(name, network, addr) }
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// readiness is /readyz: the proxy's, and with gossip.isolated_not_ready
// not ready either while this proxy is cut off from gossip (a load
// balancer in front then prefers the proxies that still hear the fleet).
// n.disc is set before anything runs.
type readiness struct{ n *ProxyNode }

func (r readiness) Ready() bool {
	if !r.n.p.Ready() {
		return false
	}
	if r.n.node != nil && !r.n.rt.Synced() {
		// A proxy that has just started may not know the fleet's run-time
		// changes yet (a stopped or deleted set it would still serve).
		return false
	}
	if r.n.disc != nil && r.n.cfg.Gossip.IsolatedNotReady {
		if isolated, _ := r.n.disc.Isolated(); isolated {
			return false
		}
	}
	return true
}

// exclusions is the health checker's sink: the reasons the checker holds a
// replica out of rotation go to the proxy's routers. p is set by NewProxy
// right after the proxy is built, before any goroutine runs.
type exclusions struct{ p *proxy.Proxy }

func (e *exclusions) SetExcluded(set, replica string, reason balancer.Reason, excluded bool) {
	if e.p != nil {
		e.p.SetExcluded(set, replica, reason, excluded)
	}
}
