package proxy

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/proxy/internal/field"
	"keyway/proxy/internal/wire"
	"keyway/tlsconfig"
)

// Observer receives the outcome of every exchange with a replica that says
// something about the replica (one call per attempt): an answer, or a
// failure to connect, a timeout or a reset. Outcomes that are keyway's own
// (no free pooled connection) or its pooled connections' (a stale one, or
// a reused one the replica closed before answering: kind reused_closed)
// are not reported.
// It is called on the request path, holding no lock, before an answer is
// relayed: it must be cheap and must not retain anything. It must not
// block, with one exception: the call that takes the replica out of
// rotation may do so at once, through the set's Router (SetExcluded), so
// that the next request routes around it; health.Checker does on the
// failure that reaches passive.consecutive_failures. err is nil when the
// replica answered; status is then its status code. A connect failure's err has a ConnectFailure()
// bool method returning true; a timeout's a Timeout() bool method.
type Observer interface {
	Observe(set, replica string, status int, err error, d time.Duration)
}

// TableObserver is told about every routing table a replica set's Router
// publishes: the set, its declared replica count, every member the Router
// knows (ring members or not) and what changed. It is called by the
// Router's single writer with the Router's lock held: it must not block
// and must not call back into the Router (nor SetExcluded, SetReplicas).
type TableObserver interface {
	TableChanged(set string, declared int, members []balancer.Member, info balancer.RebuildInfo)
}

// Options are the proxy's optional dependencies. The zero value works.
type Options struct {
	// Logger receives application logs. If nil, logs are discarded.
	Logger *zap.Logger
	// Listen opens the proxy's listening socket; nil means net.Listen. A
	// process that inherits its sockets (an upgrade's new process, systemd
	// socket activation) passes one that hands them out.
	Listen func(network, addr string) (net.Listener, error)
	// Hold, if non-nil, delays accepting until it is closed (or Run's
	// context ends): the socket listens meanwhile, so clients wait in the
	// kernel's queue rather than being answered by a proxy that does not
	// know its replicas yet.
	Hold <-chan struct{}
	// AcceptWhileDraining, if non-nil, is asked once a stop begins; true
	// means the listening socket outlives this process and no other
	// process accepts on it now (systemd holds it: socket activation, a
	// plain stop). The proxy then keeps accepting through the drain
	// (server.drain_idle, or until no connection is left), answering
	// every request with close, and stops accepting only when it ends:
	// the next process's clients wait in the kernel's queue for the exit
	// and the start only, not for the grace as well. False (and nil)
	// stops accepting at once: another process accepts on the socket (an
	// upgrade), or a new one must be able to bind the address.
	AcceptWhileDraining func() bool
	// AccessLog, if non-nil, receives the access log: one Write per
	// request, of one JSON object and '\n' (docs/logging.md). Write must be
	// safe for concurrent use, must not block on I/O and must not retain
	// the slice; its error is ignored (logging.AccessLog).
	AccessLog io.Writer
	// AccessKey, if non-nil, adds the request's key to access-log lines:
	// it appends the form to log (an HMAC, or the key itself) of the
	// decoded key to dst. Nil leaves the key out. Either way a key path
	// segment shows as {key} in the logged path.
	AccessKey func(dst, key []byte) []byte
	// Registerer receives the proxy's metrics. If nil, they are not
	// exported. New fails if they are already registered there.
	Registerer prometheus.Registerer
	// Observer, if non-nil, is told the outcome of every attempt.
	Observer Observer
	// Tables are told about every published routing table, in order.
	Tables []TableObserver
	// FailOpen routes keys by hash to their ring owner when no replica of
	// the set is in rotation, instead of answering 503 (fail closed, the
	// default). Either way keyway_all_replicas_unhealthy_total counts it.
	FailOpen bool
	// Coalesce is the Router's coalescing window for bursts of replica and
	// health changes. 0 means 50ms.
	Coalesce time.Duration
	// FleetChanged, if non-nil, is told that this proxy's fleet view may
	// have changed (a table was published): the fleet exchange sends it
	// early. It must not block.
	FleetChanged func()
	// FleetEvents, if non-nil, receives the fleet's holds and releases and
	// the disagreements that outlast fleet.disagreement_bound (for the
	// audit trail). It must not block.
	FleetEvents func(FleetEvent)
	// TLSEvents, if non-nil, is told about every reload of the listener's
	// TLS files that changed what it serves or was refused (for the audit
	// trail). It must not block.
	TLSEvents func(tlsconfig.Event)

	// dial, if non-nil, replaces net.DialTimeout for connections to
	// replicas. It is a test hook (in-memory listeners in benchmarks).
	dial dialFunc
	// clock, if non-nil, replaces the wall clock of the refused-connection
	// hold and the traffic sampler. It is a test hook (a fake clock).
	clock clock
	// heap, when set, replaces the memory guard's reading of the live heap.
	heap func() uint64
	// headerAPIForwarding sets every request's forwarding headers through
	// fasthttp's header API, none by the replica transport (forwarded.go).
	// It is a test hook (the two ways compared).
	headerAPIForwarding bool
}

// Proxy is keyway's HTTP front end. Construct it with New, start it with
// Listen (optional) and Run. It is safe for concurrent use.
type Proxy struct {
	cfg     Config // Listen and Server; the replica sets live in routes
	opts    Options
	log     *zap.Logger
	metrics *metrics
	clk     clock // opts.clock or the wall clock
	traffic *trafficSampler
	routes  atomic.Pointer[routes] // the replica sets, swapped whole by Reload
	server  *fasthttp.Server
	tls     *tlsconfig.Server // nil: plain HTTP

	mu    sync.Mutex
	ln    net.Listener
	ready atomic.Bool
	// draining: Run is stopping; every response closes its connection.
	draining atomic.Bool
	started  atomic.Bool
	stopped  atomic.Bool // Run has returned: late timers change nothing

	// reloadMu serializes Reload and the start and end of Run. runCtx is
	// Run's context for the routers of sets added later (nil before Run);
	// routersWG counts every router goroutine.
	reloadMu  sync.Mutex
	runCtx    context.Context
	routersWG sync.WaitGroup

	fleet fleetView // the other proxies' views (fleet.go)

	front      wire.Front // the client side: lingering, parking
	bodyBuffer int        // server.body_buffer_bytes

	// parker holds idle keep-alive connections (wire.Parker); nil when
	// server.park_idle_after is 0 or parking could not start. Set before
	// Serve starts, read by connections after.
	parker *wire.Parker

	// The access log (reply.go): access is nil when it is off.
	mem *memGuard // the memory guard (memguard.go)

	access     io.Writer
	accessKey  func(dst, key []byte) []byte
	accessBufs sync.Pool // *accessLine
}

// routes is one generation of the proxy's replica sets. It is immutable:
// a reload publishes a new one, and a request keeps the generation it
// matched for its whole life.
type routes struct {
	sets    []*replicaSet // in match order: most specific first
	gone    []goneRoute   // deleted sets' routes, in match order (Config.Gone)
	maxBody int           // the largest max_body_bytes of all sets
	byName  map[string]*replicaSet
	names   []string // in configuration order
}

// replicaSet is one configuration generation of a replica set: the
// parameters of its requests, immutable, plus the set's long-lived state
// (router, backends, gossip view, metrics), which a reload keeps. The
// router and counters are copied from the state for the request path.
type replicaSet struct {
	st       *setState
	cfg      SetConfig
	name     string
	host     []byte // lower case, empty matches any
	prefix   []byte
	sources  []keySource
	idem     []byte
	idemIsID bool              // idem is X-Request-Id
	routeHdr []byte            // route_context.header; nil when off
	tls      *tlsconfig.Client // tls, loaded; nil when off
	maxBody  int
	timeout  time.Duration
	attempts int
	router   *balancer.Router[*Backend]
	retries  prometheus.Counter
	allDown  prometheus.Counter // requests that found no replica of the set in rotation
	local    [localReasons]prometheus.Counter
	counts   *setCounters // requests_total{replica="none"}
	noKeyMsg string       // the answer to a keyless request with fallback reject
	limits   limits       // the set's limits, resolved (shed.go)
}

// setState is what a replica set keeps across reloads.
type setState struct {
	name     string
	router   *balancer.Router[*Backend]
	cur      atomic.Pointer[replicaSet] // the newest generation
	declared atomic.Int64               // the declared replica count in effect
	retries  prometheus.Counter
	allDown  prometheus.Counter
	local    [localReasons]prometheus.Counter
	counts   *setCounters       // the set's traffic counters
	stop     context.CancelFunc // ends the router's Run; nil until started
	removed  atomic.Bool        // the set left the configuration

	// feedMu serializes gossip feeds with the set's removal (lock order:
	// feedMu, then refusedMu, the Router's lock, mu).
	feedMu sync.Mutex
	mu     sync.Mutex // guards live and gossip
	live   map[string]*Backend
	gossip []balancer.Replica // the last gossip list, sorted by name
	// The fleet (fleet.go): when each shared exclusion started, and what
	// the fleet's verdict holds out. Guarded by mu.
	voteSince map[string]time.Time
	fleetOut  map[string]balancer.FleetExclusion

	ring atomic.Pointer[ringID] // the newest table's ring identifier (route context)

	// inflight counts the set's requests in flight on this proxy while
	// limits.max_inflight bounds it (it is not counted otherwise).
	inflight atomic.Int64
}

type keySource struct {
	kind    keyKind
	name    []byte // header or query parameter name
	header  string // the header name, for RequestHeader.PeekAll
	segment int    // 1-based path segment
	dupMsg  string // the answer to a request that names the key twice
}

type keyKind uint8

const (
	keyHeader keyKind = iota
	keyPathSegment
	keyQuery
)

// New validates cfg and builds the proxy and its routers. It does not
// listen or start goroutines.
func New(cfg Config, opts Options) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	if opts.Coalesce == 0 {
		opts.Coalesce = 50 * time.Millisecond
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		cfg:        cfg,
		opts:       opts,
		log:        cmp.Or(opts.Logger, zap.NewNop()),
		access:     opts.AccessLog,
		accessKey:  opts.AccessKey,
		metrics:    m,
		clk:        opts.clock,
		front:      wire.Front{Full: maxConnsAnswer},
		bodyBuffer: int(cfg.Server.BodyBufferBytes),
		mem:        newMemGuard(cfg.Server),
	}
	if opts.heap != nil {
		p.mem.read = opts.heap
	}
	if p.clk == nil {
		p.clk = wallClock{}
	}
	p.traffic = newTrafficSampler(m.counters, p.clk.Now)
	if cfg.TLS.Enabled() {
		p.tls, err = tlsconfig.NewServer(cfg.TLS, tlsconfig.ServerOptions{
			Listener: "proxy", Path: "tls", Logger: p.log.Named("tls"), Registerer: opts.Registerer, OnEvent: opts.TLSEvents,
		})
		if err != nil {
			return nil, err
		}
	}
	rt, _, err := p.buildRoutes(cfg.ReplicaSets, cfg.Gone, nil)
	if err != nil {
		return nil, err
	}
	p.routes.Store(rt)
	p.warnTLS(cfg.ReplicaSets)
	p.cfg.ReplicaSets = nil // the routes hold them from now on
	p.server = &fasthttp.Server{
		Handler:        p.handle,
		ErrorHandler:   p.handleParseError,
		HeaderReceived: p.headerReceived,
		ConnState:      wire.ConnState,
		Name:           "",
		Concurrency:    cfg.Server.MaxConns,
		ReadBufferSize: int(cfg.Server.MaxHeaderBytes),
		// 4 KiB, not fasthttp's usual 16: a response larger than that is
		// written in several chunks, and every idle keep-alive connection
		// holds 12 KiB less (the read buffer is max_header_bytes).
		WriteBufferSize: 4 << 10,
		// Off by default: it frees idle connections' buffers but costs a
		// one-byte allocation per reused connection inside fasthttp.
		ReduceMemoryUsage: cfg.Server.ReduceMemory,
		ReadTimeout:       cfg.Server.ReadTimeout,
		WriteTimeout:      cfg.Server.WriteTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		// Bodies are streamed: before the handler runs fasthttp reads
		// at most MaxRequestBodySize bytes of one (its limit bounds only
		// that, with StreamRequestBody), whatever its Content-Length
		// says; readBody reads on (wire.Body), and bounds the body by its
		// set's max_body_bytes.
		MaxRequestBodySize:           wire.ChunkSize,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		NoDefaultDate:                true,
		SecureErrorLogMessage:        true,
		CloseOnShutdown:              true,
		Logger:                       fasthttpLogger{p.log.Named("fasthttp").Sugar()},
	}
	if pc := (wire.ParkConfig{After: cfg.Server.ParkIdleAfter, Idle: cfg.Server.IdleTimeout, MaxConns: cfg.Server.MaxConns}); pc.On() {
		log := p.log.Named("park")
		p.parker = wire.NewParker(pc, p.server, &memReclaim{log: log}, log)
		if err := registerParkStats(opts.Registerer, p.parker.Stats()); err != nil {
			return nil, err
		}
		p.server.MaxIdleWorkerDuration = wire.ParkWorkerIdle
	}
	return p, nil
}

// buildRoutes makes the routes of scs. A set named in old keeps its
// state (router, backends, gossip view); other sets get new state, whose
// routers are not running yet. It changes nothing of old's sets: the
// caller applies each generation (see Reload).
func (p *Proxy) buildRoutes(scs []SetConfig, gone []GoneRoute, old *routes) (*routes, []*setState, error) {
	rt := &routes{byName: map[string]*replicaSet{}}
	for _, g := range gone {
		rt.gone = append(rt.gone, goneRoute{host: []byte(strings.ToLower(g.Match.Host)), prefix: []byte(g.Match.PathPrefix),
			msg: "replica set " + strconv.Quote(g.Set) + " was deleted at run time: its requests are not delivered, nor sent to another set; " +
				"create the set again, or clear its record (keyway runtime clear --set " + g.Set + ") to let another set take them"})
	}
	slices.SortStableFunc(rt.gone, func(a, b goneRoute) int {
		if c := cmp.Compare(len(b.host), len(a.host)); c != 0 {
			return c
		}
		return cmp.Compare(len(b.prefix), len(a.prefix))
	})
	var fresh []*setState
	for _, sc := range scs {
		// The TLS files are read for every generation: a reload picks up
		// renewed certificates (Reload renews the pools when they change).
		var up *tlsconfig.Client
		if sc.TLS.Enabled {
			var err error
			if up, err = sc.TLS.Load(); err != nil {
				return nil, nil, prefixed("replica set "+sc.Name+": tls.", err)
			}
		}
		var st *setState
		if old != nil {
			if prev := old.byName[sc.Name]; prev != nil {
				st = prev.st
			}
		}
		if st == nil {
			var err error
			if st, err = p.newSetState(sc, up); err != nil {
				return nil, nil, err
			}
			fresh = append(fresh, st)
		}
		rs := newGeneration(st, sc, up)
		rt.sets = append(rt.sets, rs)
		rt.byName[rs.name] = rs
		rt.names = append(rt.names, rs.name)
		rt.maxBody = max(rt.maxBody, rs.maxBody)
	}
	slices.SortStableFunc(rt.sets, func(a, b *replicaSet) int {
		if c := cmp.Compare(len(b.host), len(a.host)); c != 0 {
			return c
		}
		return cmp.Compare(len(b.prefix), len(a.prefix))
	})
	return rt, fresh, nil
}

// newGeneration makes a replica set's request parameters from sc and its
// loaded TLS settings (nil: plain HTTP).
func newGeneration(st *setState, sc SetConfig, up *tlsconfig.Client) *replicaSet {
	rs := &replicaSet{
		st:       st,
		cfg:      sc,
		tls:      up,
		name:     sc.Name,
		host:     []byte(strings.ToLower(sc.Match.Host)),
		prefix:   []byte(sc.Match.PathPrefix),
		maxBody:  int(sc.MaxBodyBytes),
		timeout:  sc.Timeouts.Request,
		attempts: sc.Retries.Attempts,
		router:   st.router,
		retries:  st.retries,
		allDown:  st.allDown,
		local:    st.local,
		counts:   st.counts,
		limits:   newLimits(sc),
	}
	if h := sc.Retries.IdempotencyHeader; h != "" {
		rs.idem = []byte(h)
		rs.idemIsID = field.EqualFold(rs.idem, hdrRequestID)
	}
	if h := sc.RouteContext.Header; h != "" {
		rs.routeHdr = []byte(h)
	}
	var descr []string
	for _, k := range sc.Key {
		switch {
		case k.Header != "":
			rs.sources = append(rs.sources, keySource{kind: keyHeader, name: []byte(k.Header), header: k.Header,
				dupMsg: "the request has the key header " + k.Header + " more than once; send it once: keyway routes by one key, and a replica could read another"})
		case k.PathSegment > 0:
			rs.sources = append(rs.sources, keySource{kind: keyPathSegment, segment: k.PathSegment})
		default:
			rs.sources = append(rs.sources, keySource{kind: keyQuery, name: []byte(k.Query),
				dupMsg: "the request has the key query parameter " + k.Query + " more than once; send it once: keyway routes by one key, and a replica could read another"})
		}
		descr = append(descr, k.String())
	}
	rs.noKeyMsg = "the request has no key; tried " + strings.Join(descr, ", ") // "header X-Key, path segment 2"
	return rs
}

func routerConfig(sc SetConfig, coalesce time.Duration) balancer.RouterConfig {
	return balancer.RouterConfig{
		Set:        sc.Name,
		Hash:       sc.Hash,
		Failover:   sc.Failover,
		Candidates: max(sc.Retries.Attempts, 1),
		Coalesce:   coalesce,
	}
}

func staticReplicas(sc SetConfig) []balancer.Replica {
	static := make([]balancer.Replica, 0, len(sc.Static))
	for _, s := range sc.Static {
		static = append(static, balancer.Replica{Name: s.Name, Addr: s.Addr, State: balancer.StateReady, Weight: s.Weight, Zone: s.Zone, Source: "static"})
	}
	return static
}

// newSetState makes a set's long-lived state and its router, fed with
// the set's static replicas. The router's goroutine is not started.
func (p *Proxy) newSetState(sc SetConfig, up *tlsconfig.Client) (*setState, error) {
	st := &setState{
		name:    sc.Name,
		retries: p.metrics.retries.WithLabelValues(sc.Name),
		allDown: p.metrics.allDown.WithLabelValues(sc.Name, allDownPolicy(p.opts.FailOpen)),
		counts:  p.metrics.counters.addSet(sc.Name),
		live:    map[string]*Backend{},
	}
	st.declared.Store(int64(sc.Replicas))
	for r := localReason(0); r < localReasons; r++ {
		st.local[r] = p.metrics.rejected.WithLabelValues(sc.Name, r.String())
	}
	st.cur.Store(newGeneration(st, sc, up))
	router, err := balancer.NewRouter(routerConfig(sc, p.opts.Coalesce), balancer.Hooks[*Backend]{
		NewBackend: func(r balancer.Replica) *Backend { return p.newBackend(st, r) },
		Release:    func(r balancer.Replica, b *Backend) { p.releaseBackend(st, r, b) },
		Rebuilt:    func(info balancer.RebuildInfo) { p.rebuilt(st, info) },
	})
	if err != nil {
		p.metrics.forgetSet(sc.Name)
		return nil, fmt.Errorf("replica set %s: %w", sc.Name, err)
	}
	st.router = router
	router.SetReplicas("static", staticReplicas(sc))
	router.Flush()
	st.cur.Store(newGeneration(st, sc, up)) // now with the router
	return st, nil
}

func (p *Proxy) newBackend(st *setState, r balancer.Replica) *Backend {
	gen := st.cur.Load()
	cfg := gen.cfg
	b := &Backend{name: r.Name, addr: r.Addr}
	var tlsCfg *tls.Config
	if gen.tls != nil {
		tlsCfg = gen.tls.Config(r.Name, r.Addr)
		b.tlsName = tlsCfg.ServerName
	}
	b.hc = newHostClient(r, &cfg, p.opts.dial, &b.pool, tlsCfg)
	p.metrics.bind(b, st.name)
	st.mu.Lock()
	st.live[r.Name] = b
	st.mu.Unlock()
	return b
}

func (p *Proxy) releaseBackend(st *setState, r balancer.Replica, b *Backend) {
	b.released.Store(true)
	b.hc.CloseIdleConnections()
	st.mu.Lock()
	gone := st.live[r.Name] == b
	if gone {
		delete(st.live, r.Name)
	}
	st.mu.Unlock()
	if gone {
		p.metrics.unbind(st.name, r.Name)
	}
}

func (p *Proxy) rebuilt(st *setState, info balancer.RebuildInfo) {
	if st.removed.Load() {
		return // the set's last table, emptied by Reload: nobody routes with it
	}
	// The Router has published the new table before calling this hook:
	// make its ring identifier before requests need it, and note the
	// votes the fleet exchange publishes.
	st.ringID(st.router.Table())
	p.noteVotes(st, st.router.Table())
	if len(p.opts.Tables) > 0 {
		ms := st.router.Table().Members()
		declared := int(st.declared.Load())
		for _, o := range p.opts.Tables {
			o.TableChanged(st.name, declared, ms, info)
		}
	}
	p.metrics.rebuilds.WithLabelValues(info.Set, fmt.Sprint(info.RingBuilt)).Inc()
	p.metrics.rotation.WithLabelValues(info.Set).Set(float64(info.InRotation))
	p.metrics.ringSize.WithLabelValues(info.Set).Set(float64(info.RingSize))
	p.metrics.rebuildSe.WithLabelValues(info.Set).Observe(info.Duration.Seconds())
	if info.RingBuilt {
		p.metrics.moved.WithLabelValues(info.Set).Add(float64(info.Moved))
		p.log.Info("ring rebuilt",
			zap.String("set", info.Set), zap.Uint64("generation", info.Generation), zap.String("cause", info.Cause),
			zap.Int("ring_size", info.RingSize), zap.Int("in_rotation", info.InRotation),
			zap.Strings("joined", info.Joined), zap.Strings("left", info.Left),
			zap.Int("moved_partitions", info.Moved), zap.Int("diverted_partitions", info.Diverted),
			zap.Duration("took", info.Duration))
		return
	}
	p.log.Info("rotation changed",
		zap.String("set", info.Set), zap.Uint64("generation", info.Generation), zap.String("cause", info.Cause),
		zap.Int("in_rotation", info.InRotation), zap.Int("ring_size", info.RingSize),
		zap.Int("diverted_partitions", info.Diverted))
}

// Router returns the Router of a replica set, or nil. Membership and health
// checkers feed it; the admin API reads its tables.
func (p *Proxy) Router(set string) *balancer.Router[*Backend] {
	if rs := p.routes.Load().byName[set]; rs != nil {
		return rs.router
	}
	return nil
}

// Sets returns the configured replica set names in configuration order.
func (p *Proxy) Sets() []string { return slices.Clone(p.routes.Load().names) }

// SetConfigs returns the replica sets' configuration in effect, in
// configuration order.
func (p *Proxy) SetConfigs() []SetConfig {
	rt := p.routes.Load()
	out := make([]SetConfig, 0, len(rt.names))
	for _, name := range rt.names {
		rs := rt.byName[name]
		sc := rs.cfg
		sc.Replicas = int(rs.st.declared.Load())
		out = append(out, sc)
	}
	return out
}

// Listen opens the proxy's listener (cfg.Listen) if it is not open yet.
// Calling it before Run lets callers learn the bound address (port 0).
func (p *Proxy) Listen() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return nil
	}
	listen := p.opts.Listen
	if listen == nil {
		listen = net.Listen
	}
	ln, err := listen("tcp", p.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", p.cfg.Listen, err)
	}
	p.ln = ln
	return nil
}

// Addr returns the listener's address, or nil before Listen.
func (p *Proxy) Addr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return nil
	}
	return p.ln.Addr()
}

// TLS returns the listener's TLS server (its certificates, reload and
// watcher), or nil when the proxy speaks plain HTTP.
func (p *Proxy) TLS() *tlsconfig.Server { return p.tls }

// Ready reports whether the proxy is serving and not shutting down.
func (p *Proxy) Ready() bool { return p.ready.Load() }

// Run serves until ctx is done, then shuts down gracefully: it stops
// accepting, lets in-flight requests finish within the shutdown timeout,
// and closes idle keep-alive connections. Meanwhile it runs the sets'
// Routers and reads the traffic counters every second (for Traffic's
// rates). It returns nil after a clean shutdown, and only after every
// goroutine it started has exited.
func (p *Proxy) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("proxy: Run called twice")
	}
	if err := p.Listen(); err != nil {
		return err
	}
	if p.parker != nil {
		if err := p.parker.Start(); err != nil {
			p.log.Warn("idle connections will not be parked", zap.Error(err))
			p.parker = nil
		} else {
			p.front.Parker = p.parker
			defer p.parker.Wait()
			defer p.parker.Stop()
		}
	}
	p.reloadMu.Lock()
	p.runCtx = ctx
	for _, rs := range p.routes.Load().sets {
		p.startRouter(rs.st)
	}
	p.reloadMu.Unlock()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	sampler.Go(func() { p.runTraffic(sampleCtx) })
	sampler.Go(func() { p.runMemGuard(sampleCtx) })
	if p.tls != nil {
		sampler.Go(func() { _ = p.tls.Run(sampleCtx) }) // the certificate files' watcher
	}
	defer func() {
		stopSampling()
		sampler.Wait()
		p.stopped.Store(true)
		p.reloadMu.Lock()
		for _, rs := range p.routes.Load().sets {
			rs.st.stop()
		}
		p.runCtx = nil
		p.reloadMu.Unlock()
		p.routersWG.Wait()
	}()

	// fasthttp's Shutdown only sees listeners Serve has registered, which
	// it does just before its first Accept: a Shutdown before that would
	// return at once and leave Serve running. Wait for the first Accept.
	ln := p.front.Listen(p.ln, p.tls == nil)
	var serve net.Listener = ln
	if p.tls != nil {
		// TLS over the lingering TCP connections: a lingering close
		// drains the raw connection after TLS's close_notify. Request
		// heads are followed above TLS.
		serve = wire.TLSListener(p.tls.Listener(ln))
	}
	if p.opts.Hold != nil {
		select {
		case <-p.opts.Hold:
		case <-ctx.Done():
		}
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- p.server.Serve(serve) }()
	select {
	case <-ln.Accepting():
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	}
	p.ready.Store(true)
	p.log.Info("proxy listening", zap.Stringer("addr", p.ln.Addr()), zap.Bool("tls", p.tls != nil), zap.Strings("sets", p.Sets()))

	select {
	case err := <-serveErr:
		p.ready.Store(false)
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	p.ready.Store(false)
	keep := p.opts.AcceptWhileDraining != nil && p.opts.AcceptWhileDraining() && p.cfg.Server.DrainIdle > 0
	p.log.Info("proxy shutting down", zap.Duration("drain_idle", p.cfg.Server.DrainIdle), zap.Duration("timeout", p.cfg.Server.ShutdownTimeout),
		zap.Bool("accepting_while_draining", keep))
	sctx, cancel := context.WithTimeout(context.Background(), p.cfg.Server.ShutdownTimeout)
	defer cancel()
	left := p.drain(sctx, ln, keep)
	if p.parker != nil {
		// Parked connections are idle: closed now, as fasthttp closes its
		// idle ones; from here a connection that would park closes.
		p.parker.Stop()
	}
	// Serve returns once its listener is closed; then fasthttp's shutdown
	// closes the idle connections and waits for requests in flight (it
	// checks every 100ms: with none left it returns at once).
	// The grace is over and nothing is accepted any more. A connection
	// accepted at its very end whose first request has not arrived yet is
	// given a moment for it (its client dialed to send one): closing it
	// would fail a request the next process would have served.
	for i := 0; i < pendingPolls && p.front.FreshWaiting() > 0; i++ {
		time.Sleep(drainPoll / 5)
	}
	// Connections no request is arriving on close now (fasthttp's
	// shutdown would keep one that never carried a request until 5
	// seconds after it opened).
	waiting := p.front.CloseWaiting()
	// A request that arrived at the last moment on a connection just
	// left open is read before fasthttp's shutdown would close the
	// connection as idle (it drops what arrives on a connection it
	// closes).
	for i := 0; i < pendingPolls && p.front.PendingInput() > 0; i++ {
		time.Sleep(drainPoll / 5)
	}
	_ = ln.Close()
	<-serveErr
	err := p.server.ShutdownWithContext(sctx)
	p.log.Info("proxy drained", zap.Int("open_after_grace", left), zap.Int("closed_waiting", waiting))
	p.front.StopLingering()
	for _, rs := range p.routes.Load().sets {
		t := rs.router.Table()
		for i := 0; i < t.Len(); i++ {
			t.Backend(i).hc.CloseIdleConnections()
		}
	}
	if err != nil {
		p.log.Warn("shutdown deadline passed with requests in flight", zap.Error(err))
		return fmt.Errorf("shutdown: %w", err)
	}
	p.log.Info("proxy stopped")
	return nil
}

// FlushRouters applies every set's pending replica changes now rather
// than after the routers' coalescing window.
func (p *Proxy) FlushRouters() {
	for _, rs := range p.routes.Load().sets {
		rs.router.Flush()
	}
}

// drainPoll is how often a draining proxy counts its connections: the
// stop ends at most this long after the last one closed.
const drainPoll = 5 * time.Millisecond

// pendingPolls bounds the wait for requests that arrived at the end of the
// grace to be read (drainPoll/5 apart): 100ms.
const pendingPolls = 100

// drain is the first part of a graceful stop. The listener closes (in an
// upgrade the new process holds its own copy of the socket, and keeps
// accepting on it) unless keep (Options.AcceptWhileDraining) keeps it
// accepting until the drain ends; every response from now on closes its
// connection; idle keep-alive connections, parked ones included, stay
// open for
// server.drain_idle, so that a request the client sends on one meanwhile
// is answered (with Connection: close) rather than meeting a connection
// closed under it: closing an idle connection races the client's next
// request, which the client cannot tell from a lost one. drain returns
// once no connection is left or the grace has passed, with the number of
// connections still open then (the caller's shutdown closes the idle ones
// and waits for requests in flight), and the listener closed. ctx
// (server.shutdown_timeout) ends the grace too.
//
// The connections counted are the ones the front end accepted and has not
// closed (wire.Front.Open), not fasthttp's: a parked connection the parker
// has just woken is in neither fasthttp's count nor the parker's until its
// resumer serves it, and must not be taken for gone.
func (p *Proxy) drain(ctx context.Context, ln *wire.Listener, keep bool) int {
	p.draining.Store(true)
	if !keep {
		ln.StopAccepting()
	}
	defer ln.StopAccepting()
	if p.cfg.Server.DrainIdle <= 0 {
		return p.front.Open()
	}
	deadline := time.NewTimer(p.cfg.Server.DrainIdle)
	defer deadline.Stop()
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	for {
		n := p.front.Open()
		if n == 0 {
			// Kept accepting too: a connection that comes now waits in
			// the socket's queue for the next process.
			return 0
		}
		select {
		case <-deadline.C:
			return n
		case <-ctx.Done(): // shutdown_timeout bounds the whole stop
			return n
		case <-tick.C:
		}
	}
}

// startRouter runs a set's router until its stop or Run's end; reloadMu
// is held and runCtx is set.
func (p *Proxy) startRouter(st *setState) {
	ctx, stop := context.WithCancel(p.runCtx)
	st.stop = stop
	p.routersWG.Go(func() { _ = st.router.Run(ctx) })
}

func allDownPolicy(failOpen bool) string {
	if failOpen {
		return "fail_open"
	}
	return "fail_closed"
}

// fasthttpLogger routes fasthttp's own messages to zap at warn level.
type fasthttpLogger struct{ s *zap.SugaredLogger }

func (l fasthttpLogger) Printf(format string, args ...any) { l.s.Warnf(format, args...) }
