package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/membership"
)

// metaTimeout bounds how long advertising stopped waits for its gossip
// broadcast to go out before the agent leaves; the change keeps spreading
// after it.
const metaTimeout = 2 * time.Second

// Options are an Agent's dependencies. All are optional.
type Options struct {
	// Logger receives the agent's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the agent's metrics. Nil means a private
	// registry, served on /metrics.
	Registerer prometheus.Registerer
	// Gatherer is what /metrics serves. Nil means Registerer when it is
	// also a Gatherer (a *prometheus.Registry is), else the private
	// registry; New fails if neither applies and the listener is enabled.
	Gatherer prometheus.Gatherer
	// Now is the clock used for the boot time and drain durations; nil
	// means time.Now.
	Now func() time.Time
	// Hostname gives the replica name when replica.name is empty; nil
	// means os.Hostname.
	Hostname func() (string, error)
}

// Agent is the sidecar runtime beside one replica: a gossip member with
// role replica that probes the replica's readiness and advertises its
// lifecycle state, and drains it on shutdown; it also stops and starts it
// when proxies stop and start its replica set. Given a Supervisor it also
// runs the replica's process (Config.Command).
//
// server.NewAgent wires it: New builds the runtime, Supervise hands it the
// supervisor (with a command), and Attach the gossip member whose Sink
// and MessageHandler it is; then call Run once. Its methods are safe for
// concurrent use; it must not be copied.
type Agent struct {
	cfg      Config
	log      *zap.Logger
	now      func() time.Time
	replica  string
	node     *membership.Node // set by Attach
	prober   *prober
	book     *reportBook
	metrics  *metrics
	gatherer prometheus.Gatherer
	members  memberSignal
	srv      *http.Server

	state atomic.Uint32 // the advertised balancer.State
	ran   atomic.Bool

	// Operator drains (command.go): the message worker stores the wanted
	// hold and signals; the run loop applies it to held.
	holdWanted atomic.Bool
	holdSignal chan struct{} // capacity 1
	// Retirement (retire.go): the message worker stores the wish and
	// signals; the run loop drains the replica for good.
	retireWanted atomic.Bool
	retireSignal chan struct{} // capacity 1
	retired      bool          // the replica left for good; Run's goroutine
	held         bool          // Run's goroutine

	// Set stops (setstop.go): the message worker keeps the newest
	// command's version and stores the wanted mode, then signals; the run
	// loop carries it out.
	setMu      sync.Mutex    // guards setVersion; orders the stores of setWanted
	setVersion uint64        // the highest SetStop version accepted
	setWanted  atomic.Bool   // the newest command stops the set
	setSignal  chan struct{} // capacity 1
	setApplied bool          // a set stop is under way or done; Run's goroutine
	setRun     *setStopRun   // the set stop under way, or nil; Run's goroutine

	leaving bool // the shutdown drain has begun; Run's goroutine
	// The flags last put in the gossip metadata; Run's goroutine.
	advHeld, advRemove, advSetStopped bool

	lc   lifecycle   // owned by Run's goroutine
	last probeResult // the latest probe, for transition logs; Run's goroutine

	// Supervision (supervise.go, child.go); sup is nil without a command.
	sup      *Supervisor
	stopSup  context.CancelFunc // Run's goroutine
	childMu  sync.Mutex         // guards childQ
	childQ   []event            // lifecycle events from the supervisor, for the run loop
	childSig chan struct{}      // capacity 1: childQ is not empty
	childSeq uint64             // the last ProcessEvent.Seq; the supervisor's goroutine

	reportMu sync.Mutex // guards reports
	reports  reportLog  // process events, and which proxy processes have them

	mu sync.Mutex // guards ln
	ln net.Listener
}

// memberSignal wakes the run loop when the member list changes (SetMembers).
type memberSignal chan struct{}

// New validates cfg and builds the agent's runtime: its metrics, the
// readiness prober, the drain report book and the HTTP server. It does not
// listen, bind or probe: Run does. The gossip member (Attach) and, with a
// command, the supervisor (Supervise) are built by the caller.
func New(cfg Config, opts Options) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	expect, _ := parseStatusRanges(cfg.Probe.ExpectStatus) // Validate checked it
	name := cfg.Replica.Name
	if name == "" {
		hostname := opts.Hostname
		if hostname == nil {
			hostname = os.Hostname
		}
		h, err := hostname()
		if err != nil {
			return nil, fmt.Errorf("agent: replica.name is empty and the host name is unknown: %w", err)
		}
		if !validReplicaName(h) {
			return nil, fmt.Errorf("agent: replica.name is empty and the host name %q is not a valid replica name; set replica.name", h)
		}
		name = h
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}

	reg, gath := opts.Registerer, opts.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg = r
		if gath == nil {
			gath = r
		}
	}
	if gath == nil {
		if g, ok := reg.(prometheus.Gatherer); ok {
			gath = g
		} else if cfg.Listen != "" {
			return nil, errors.New("agent: Options.Gatherer is required when Options.Registerer is not a prometheus.Gatherer")
		}
	}
	m := newMetrics()
	if err := m.register(reg); err != nil {
		return nil, fmt.Errorf("agent metrics: %w", err)
	}
	m.info.WithLabelValues(cfg.Replica.Set, name).Set(1)

	boot := now().UnixNano()
	a := &Agent{
		cfg:      cfg,
		log:      log,
		now:      now,
		replica:  name,
		metrics:  m,
		gatherer: gath,
		members:  make(memberSignal, 1),
		prober:   newProber(cfg.Replica.Addr, cfg.Probe.Path, cfg.Probe.Timeout, expect),
		book:     newReportBook(cfg.Replica.Set, name, boot, m),
		lc:       lifecycle{State: balancer.StateStarting},

		holdSignal:   make(chan struct{}, 1),
		retireSignal: make(chan struct{}, 1),
		setSignal:    make(chan struct{}, 1),
		childSig:     make(chan struct{}, 1),
	}
	a.state.Store(uint32(balancer.StateStarting))
	if cfg.Listen != "" {
		a.srv = a.newHTTPServer(gath)
	}
	return a, nil
}

// Supervise makes the agent run the replica's process with s: Run starts
// s, turns its reports into lifecycle events, and stops it once the
// replica has drained. Call it at most once, before Run.
func (a *Agent) Supervise(s *Supervisor) {
	s.emit = a.onChild
	a.sup = s
}

// Attach gives the agent its gossip member, built with Meta as its
// metadata and the agent as its Sink and MessageHandler (HandleMessage).
// Run runs it: the member must stay in the cluster while the replica
// drains. Call it once, before Run.
func (a *Agent) Attach(n *membership.Node) {
	a.node = n
	for _, kind := range []string{membership.RepairKind, membership.RestartReplicaKind, membership.SetStopKind,
		membership.AdminDrainKind, membership.DrainReportKind, membership.RetireKind} {
		n.Handle(kind, membership.RoleProxy, func(m membership.Message) { a.handle(m.Kind, m.From, m.Body) })
	}
}

// SetMembers implements membership.Sink without blocking: it only wakes
// the run loop (and a drain waiting for reports).
func (a *Agent) SetMembers([]membership.Member) {
	select {
	case a.members <- struct{}{}:
	default:
	}
}

var _ membership.Sink = (*Agent)(nil)

// State returns the lifecycle state the agent advertises now.
func (a *Agent) State() balancer.State { return balancer.State(a.state.Load()) }

// Name returns the agent's gossip node name (the replica name plus a boot
// suffix): proxies send drain reports to it. Only after Attach.
func (a *Agent) Name() string { return a.node.Name() }

// Meta returns the metadata the agent advertises; before Attach, the
// metadata its gossip member starts with: role replica, the replica's
// set, name, address, weight, zone and boot time, state starting, and
// whether it supervises the replica's process (Supervise was called).
func (a *Agent) Meta() membership.Meta {
	if a.node != nil {
		return a.node.Meta()
	}
	return membership.Meta{
		Role:    membership.RoleReplica,
		Set:     a.cfg.Replica.Set,
		Replica: a.replica,
		Addr:    a.cfg.Replica.Addr,
		State:   balancer.StateStarting,
		Weight:  uint16(a.cfg.Replica.Weight),
		Zone:    a.cfg.Replica.Zone,
		Boot:    a.book.boot,
		// Proxies refuse a rolling restart or a repair that could not
		// restart this replica, instead of waiting for a process start.
		Supervised:       a.sup != nil,
		SupervisionKnown: true,
	}
}

// GossipAddr returns the advertised gossip address, or "" before Run
// has bound it. Only after Attach.
func (a *Agent) GossipAddr() string { return a.node.GossipAddr() }

// Started is closed once Run has bound the gossip port. Only after Attach.
func (a *Agent) Started() <-chan struct{} { return a.node.Started() }

// Listen opens the agent's HTTP listener, if one is configured and not yet
// open. Run calls it; call it earlier to learn the address (port 0).
func (a *Agent) Listen() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv == nil || a.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("agent listen %s: %w", a.cfg.Listen, err)
	}
	a.ln = ln
	return nil
}

// Addr returns the HTTP listener's address, or nil when it is disabled or
// not open yet.
func (a *Agent) Addr() net.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln == nil {
		return nil
	}
	return a.ln.Addr()
}

// Run joins the gossip cluster as starting, starts the replica's process
// when there is a command (and supervises it: supervise.go), probes the
// replica and advertises its state until ctx is done; then it drains: it
// advertises draining, waits until every live proxy reports that it sends
// nothing more to the replica (or drain.timeout passes), waits
// drain.quiet, stops the process (SIGTERM, SIGKILL after
// supervise.stop_grace), advertises stopped, leaves the cluster and
// returns. Meanwhile proxies may stop and start the replica's set
// (setstop.go): the agent then drains and stops the replica, or starts it
// again, and keeps running. It returns nil after a graceful
// exit, and an error when the listener or gossip cannot start or the HTTP
// server fails (after draining). Run may be called once.
func (a *Agent) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return errors.New("agent: Run called twice")
	}
	if a.node == nil {
		return errors.New("agent: no gossip member attached (Attach)")
	}
	if err := a.Listen(); err != nil {
		return err
	}
	// Gossip outlives ctx: the node must stay in the cluster while draining.
	nodeCtx, stopNode := context.WithCancel(context.WithoutCancel(ctx))
	defer stopNode()
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- a.node.Run(nodeCtx) }()
	select {
	case <-a.node.Started():
	case err := <-nodeDone:
		a.closeListener()
		return err
	}

	httpDone := make(chan error, 1)
	ln := a.listener()
	if ln != nil {
		go func() { httpDone <- a.srv.Serve(ln) }()
	}
	httpAddr := ""
	if ln != nil {
		httpAddr = ln.Addr().String()
	}
	fields := []zap.Field{
		zap.String("set", a.cfg.Replica.Set), zap.String("replica", a.replica), zap.String("addr", a.cfg.Replica.Addr),
		zap.String("node", a.node.Name()), zap.String("gossip", a.node.GossipAddr()),
		zap.String("probe", a.prober.url), zap.String("http", httpAddr), zap.Stringer("state", a.State()),
	}
	if a.sup != nil {
		fields = append(fields, zap.Strings("command", a.sup.argv))
	}
	a.log.Info("agent started", fields...)
	a.startSupervisor(ctx)

	probeCtx, stopProbe := context.WithCancel(ctx)
	results := make(chan probeResult)
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		probeLoop(probeCtx, a.cfg.Probe.Interval, a.safeProbe, results)
	}()

	var runErr error
	nodeUp, httpUp := true, ln != nil
loop:
	for {
		setReports, setTimeout, setDone := a.setStopWaits()
		select {
		case <-ctx.Done():
			break loop
		case r := <-results:
			a.onProbe(r)
		case <-a.holdSignal:
			a.onHold()
		case <-a.retireSignal:
			a.retire()
		case <-a.setSignal:
			a.onSetCommand()
		case <-setReports:
			a.checkSetDrained()
		case <-setTimeout:
			a.setDrainTimedOut()
		case <-setDone:
			a.onSetStopDone()
		case <-a.childSig:
			a.onChildEvents()
		case <-a.members:
			if a.sup != nil {
				a.sendReports(nil) // the first proxies may have appeared
			}
			a.checkSetDrained() // a proxy may have gone
		case err := <-httpDone:
			httpUp = false
			runErr = fmt.Errorf("agent http: %w", err)
			a.log.Error("agent http server failed; draining", zap.Error(err))
			break loop
		case err := <-nodeDone:
			nodeUp = false
			runErr = fmt.Errorf("agent gossip stopped: %w", err)
			a.log.Error("agent gossip stopped unexpectedly", zap.Error(err))
			break loop
		}
	}
	stopProbe()
	<-probed
	a.endSetStop()

	if nodeUp {
		a.drain()
		stopNode()
		<-nodeDone
	} else {
		a.stopChild() // drain stops it otherwise
	}
	if httpUp {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = a.srv.Shutdown(sctx)
		cancel()
		<-httpDone
	}
	a.log.Info("agent stopped", zap.String("replica", a.replica), zap.Bool("removed", a.removing()))
	return runErr
}

func (a *Agent) listener() net.Listener {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ln
}

func (a *Agent) closeListener() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln != nil {
		_ = a.ln.Close()
	}
}

// onProbe feeds one probe result to the state machine.
func (a *Agent) onProbe(r probeResult) {
	a.last = r
	if a.retired {
		return // stopped for good, whatever the probes say
	}
	ev := evProbeFail
	if r.ok {
		ev = evProbePass
		a.metrics.probes.WithLabelValues("pass").Inc()
	} else {
		a.metrics.probes.WithLabelValues("fail").Inc()
	}
	if ce := a.log.Check(zap.DebugLevel, "probe"); ce != nil {
		ce.Write(zap.Bool("ok", r.ok), zap.String("result", r.detail()), zap.Duration("took", r.took))
	}
	a.apply(ev)
}

// apply steps the state machine and advertises a changed state: gossip
// metadata, /readyz, the state metric and one log line per transition. It
// also advertises changed flags (Held, SetStopped, Remove) with the state,
// in one metadata update, or alone when the state stays.
func (a *Agent) apply(ev event, fields ...zap.Field) {
	prev := a.lc
	next, _ := step(prev, ev, a.cfg.Probe.Rise, a.cfg.Probe.Fall)
	a.lc = next
	from := a.State()
	s := next.State
	if a.held && (s == balancer.StateStarting || s == balancer.StateReady || s == balancer.StateRecovering) {
		// An operator drain holds the replica out whatever its probes say.
		s = balancer.StateDraining
	}
	// Remove only when leaving for good: a set stop's stopped replica
	// stays in the cluster and keeps its partitions.
	remove := a.removing() && a.leaving && s == balancer.StateStopped
	held, setStopped := a.held, a.setApplied
	if s == from && held == a.advHeld && remove == a.advRemove && setStopped == a.advSetStopped {
		return
	}
	if s != from {
		a.logTransition(prev, ev, from, s, remove, fields)
	}
	// Only the shutdown's stopped waits for its broadcast to go out: the
	// leave that follows must not overtake it (peers would see a crash,
	// and miss Remove). The other changes keep spreading in the background
	// while the run loop goes on probing, or collecting drain reports.
	wait, check := time.Millisecond, zap.DebugLevel
	if s == balancer.StateStopped && a.leaving {
		wait, check = metaTimeout, zap.WarnLevel
	}
	a.advHeld, a.advRemove, a.advSetStopped = held, remove, setStopped
	err := a.node.UpdateMeta(func(m *membership.Meta) {
		m.State = s
		m.Remove = remove
		m.Held = held
		m.SetStopped = setStopped
	}, wait)
	if err != nil {
		// The change is set locally and keeps spreading; only the wait ended.
		a.log.Log(check, "state broadcast not confirmed", zap.Stringer("state", s), zap.Duration("waited", wait), zap.Error(err))
	}
}

// logTransition records an advertised state change from from to s: the
// state, the metrics and the log line.
func (a *Agent) logTransition(prev lifecycle, ev event, from, s balancer.State, remove bool, fields []zap.Field) {
	a.state.Store(uint32(s))
	a.metrics.setState(s)
	a.metrics.transitions.Inc()
	fields = append(fields, zap.Stringer("from", from), zap.Stringer("to", s), zap.Stringer("event", ev),
		zap.String("set", a.cfg.Replica.Set), zap.String("replica", a.replica))
	if ev == evProbePass || ev == evProbeFail {
		n := prev.Passes + 1
		if ev == evProbeFail {
			n = prev.Fails + 1
		}
		fields = append(fields, zap.Int("consecutive", n), zap.String("probe", a.last.detail()))
	}
	if remove {
		fields = append(fields, zap.Bool("remove", true))
	}
	lvl := zap.InfoLevel
	if s == balancer.StateRecovering {
		lvl = zap.WarnLevel
	}
	a.log.Log(lvl, "replica state changed", fields...)
}

// drain runs the shutdown sequence; see Run. A replica that a set stop
// has already stopped is not drained again (nothing can be in flight to
// it, and its process is stopped): it only advertises stopped with Remove
// when drain.remove is set.
func (a *Agent) drain() {
	start := a.now()
	a.leaving = true
	if a.sup != nil {
		a.sup.quiesce() // no restart from here on: the replica is going away
	}
	if a.lc.State == balancer.StateStopped {
		a.log.Info("replica already stopped (its set is stopped); nothing to drain")
		a.apply(evDrain) // the shutdown takes the stopped replica over
	} else {
		a.drainReplica(start)
	}
	// Drained: only now may the replica's process go.
	a.stopChild()
	select {
	case <-a.holdSignal: // the last command before stopped carries its flag
		a.onHold()
	default:
	}
	a.apply(evStop, zap.Duration("drain_took", a.now().Sub(start)))
	if a.removing() {
		a.awaitStoppedSeen()
	}
}

// drainReplica advertises draining, waits until every live proxy reports
// nothing in flight to the replica (or drain.timeout), then drain.quiet,
// then the drain probe.
func (a *Agent) drainReplica(start time.Time) {
	// drain.timeout counts from here (SIGTERM); the draining state spreads
	// by gossip in the background (apply waits only for stopped).
	timeout := time.NewTimer(a.cfg.Drain.Timeout)
	defer timeout.Stop()
	a.book.begin()
	a.apply(evDrain)
	for {
		members := a.node.Members()
		latest := a.book.snapshot()
		pending := pendingProxies(members, latest)
		if len(pending) == 0 {
			a.log.Info("replica drained", zap.Duration("took", a.now().Sub(start)),
				zap.Int("proxies", liveProxies(members)), zap.Int("reports", len(latest)))
			break
		}
		select {
		case <-a.book.changed:
			continue
		case <-a.members:
			continue
		case <-a.holdSignal:
			// An operator drain or undrain while shutting down changes
			// no state here, but its Held flag must reach the proxies
			// (they remember it for the next incarnation).
			a.onHold()
			continue
		case <-timeout.C:
		}
		// Timed out: re-read what the proxies last said, for the log.
		latest = a.book.snapshot()
		pending = pendingProxies(a.node.Members(), latest)
		a.log.Warn("drain timed out; proxies may still be sending", zap.Duration("timeout", a.cfg.Drain.Timeout),
			zap.Strings("pending", describePending(pending, latest)))
		break
	}

	if q := a.cfg.Drain.Quiet; q > 0 {
		a.log.Info("drain quiet period", zap.Duration("quiet", q))
		t := time.NewTimer(q)
		<-t.C
	}
	a.waitDrainProbe(context.Background())
}

// awaitStoppedSeen waits, at most metaTimeout, until every live proxy has
// reported that it sees this replica stopped. Leaving for good (remove)
// relies on proxies seeing stopped+remove before the leave: one that
// missed it would take the leave for a crash and keep the replica's
// partitions for gossip.forget_after. A restart needs no such wait (a
// crash and a restart look the same to the ring).
func (a *Agent) awaitStoppedSeen() {
	start := a.now()
	deadline := time.NewTimer(metaTimeout)
	defer deadline.Stop()
	// Gossip carries the stopped state to a few random members a few
	// times: when many replicas leave at once (a scale-in), a proxy may
	// miss it. A push/pull with each proxy still pending hands it over.
	push := time.NewTicker(metaTimeout / 5)
	defer push.Stop()
	for {
		pending := pendingStopped(a.node.Members(), a.book.snapshot())
		if len(pending) == 0 {
			a.log.Info("every proxy sees the replica stopped", zap.Duration("took", a.now().Sub(start)))
			return
		}
		select {
		case <-push.C:
			if _, err := a.node.PushState(pending); err != nil {
				a.log.Debug("state push to the pending proxies failed", zap.Strings("pending", pending), zap.Error(err))
			}
		case <-a.book.changed:
		case <-a.members:
		case <-deadline.C:
			a.log.Warn("leaving before every proxy confirmed the stopped state; those may keep the replica's partitions until gossip.forget_after",
				zap.Strings("pending", pending), zap.Duration("waited", metaTimeout))
			return
		}
	}
}

// liveProxies counts alive proxy members.
func liveProxies(ms []membership.Member) int {
	n := 0
	for _, m := range ms {
		if m.Meta.Role == membership.RoleProxy && m.Status == membership.StatusAlive {
			n++
		}
	}
	return n
}

// safeProbe runs one probe; a panic inside it counts as a failed probe and
// is logged with its stack instead of killing the probe loop.
func (a *Agent) safeProbe(ctx context.Context) (r probeResult) {
	defer func() {
		if v := recover(); v != nil {
			a.log.Error("probe panicked", zap.Any("panic", v), zap.ByteString("stack", debug.Stack()))
			r = probeResult{err: fmt.Errorf("probe panicked: %v", v)}
		}
	}()
	return a.prober.probe(ctx)
}
