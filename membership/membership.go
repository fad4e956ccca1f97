package membership

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/fleetauth"
)

// Status is a member's liveness as this node's gossip sees it.
type Status uint8

const (
	StatusAlive Status = iota // reachable
	StatusDead                // failed without leaving (or unreachable for long enough)
	StatusLeft                // left gracefully
)

func (s Status) String() string {
	switch s {
	case StatusAlive:
		return "alive"
	case StatusDead:
		return "dead"
	}
	return "left"
}

// MarshalText implements encoding.TextMarshaler.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Member is one gossip member as this node knows it. It is a plain value.
type Member struct {
	// Node is the gossip node name: the replica name (a proxy's:
	// proxy-<host name>) plus a boot suffix, one per process. A proxy's
	// identity across its processes is ID().
	Node string `json:"node"`
	// Gossip is the member's gossip address.
	Gossip string `json:"gossip"`
	Meta   Meta   `json:"meta"`
	Status Status `json:"status"`
	// Since is when Status last changed, on this node's clock.
	Since time.Time `json:"since"`
	// Self marks this node's own entry.
	Self bool `json:"self,omitempty"`
	// Refused, when not empty, says why the member's claim to a role is
	// not believed (a keyway_gossip_rejected_total reason): its metadata
	// is unsigned, or signed by a key that is not its role's. Meta.Role is
	// then RoleUnknown.
	Refused string `json:"refused,omitempty"`
	// Legacy marks a member believed without a signature while this node
	// checks them (gossip.signatures: optional): a member of a keyway
	// version before signatures, during a rolling upgrade. Such a proxy
	// does not acknowledge run-time writes.
	Legacy bool `json:"legacy,omitempty"`
}

// ID is the member's stable identity: a proxy's Meta.ID, or the node name
// of a member that advertises none (an agent, or a proxy of a version
// without IDs). Two alive members with one ID are two processes of one
// proxy (during a binary upgrade): they count as one proxy.
func (m Member) ID() string { return cmp.Or(m.Meta.ID, m.Node) }

// Sink receives the full member list after every change (coalesced).
// Calls are serialized; implementations must not block and must not call
// back into the Node.
type Sink interface {
	SetMembers([]Member)
}

// Options are a Node's dependencies. All are optional.
type Options struct {
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	Sink       Sink
	// Credentials, when not nil, are the fleet credentials to sign and
	// verify with instead of Config.CredentialsFile's (the demo and tests
	// make their own).
	Credentials *fleetauth.Credentials
	// FirstJoin lists seeds joined once, first, beside Config.Join and
	// not re-joined later: an upgrade's new process joins its old one,
	// which may be the only other member (a proxy that joins nobody),
	// and which the new process replaces at that address.
	FirstJoin []string
	// OnReject, when not nil, hears of refused messages and claims, at
	// most once per sender and reason per minute (for the audit trail).
	// It is called from memberlist's callbacks or the message worker:
	// it must not block or call the Node.
	OnReject func(Rejection)
	// Env looks up KEYWAY_GOSSIP_KEY; nil means os.LookupEnv.
	Env func(string) (string, bool)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Transport, if non-nil, wraps the gossip transport: the Node binds
	// memberlist's NetTransport on BindAddr:BindPort as memberlist would,
	// and gossips through what Transport returns instead (which must use
	// the NetTransport it was given, and shut it down in its Shutdown).
	// It is a hook for tests that inject network faults
	// (internal/gossipfault) and for special networks (a custom dialer,
	// a proxy); production nodes leave it nil.
	Transport func(*memberlist.NetTransport) memberlist.NodeAwareTransport
}

// Node is this process's gossip member. Construct with New, then Run. It is
// safe for concurrent use and must not be copied.
type Node struct {
	cfg     Config
	opts    Options
	log     *zap.Logger
	base    string                 // the node name's part before the boot suffix
	name    atomic.Pointer[string] // the gossip node name (Name); MoveTo changes it
	keys    [][]byte
	auth    atomic.Pointer[authState] // what it signs and checks with (auth.go)
	metrics *metrics
	now     func() time.Time

	meta   atomic.Pointer[Meta] // the current metadata, served (encoded, signed) by NodeMeta
	metaMu sync.Mutex           // serializes SetMeta
	cur    Meta

	mu      sync.Mutex // guards members and former
	members map[string]*Member
	former  map[string]bool // this process's node names before MoveTo
	dirty   chan struct{}
	inbox   chan inMsg

	ml      atomic.Pointer[memberlist.Memberlist]
	del     atomic.Pointer[mlDelegate] // ml's delegate
	addr    atomic.Pointer[string]     // the advertised gossip address, set before ml
	started chan struct{}
	// joined is closed once the sink has seen the members the first
	// successful join brought (at once without seeds); joining says a
	// join succeeded and the next snapshot closes it.
	joined     chan struct{}
	joining    atomic.Bool
	joinedOnce sync.Once
	moves      chan moveRequest // MoveTo's requests, served by Run

	hmu        sync.Mutex
	handlers   map[string]handlerEntry // by message kind
	lastStamp  atomic.Int64
	replays    replays
	rmu        sync.Mutex
	rlimits    map[rejectKey]*refusal
	claims     map[string]claimVerdict // by node name; guarded by mu
	conflicted map[string]bool         // claims refused as second claims to a live name; emit's
}

// claimVerdict is the last check of a member's metadata, kept while its
// bytes do not change.
type claimVerdict struct {
	raw            []byte
	meta           Meta // decoded, as claimed
	reason, detail string
	legacy         bool // believed unsigned (signatures optional)
}

type moveRequest struct {
	port, advertise int
	done            chan error
}

type inMsg struct {
	from string
	msg  []byte
}

// New validates the configuration (Validate, then CheckKey's key rules)
// and the local metadata. It does not bind or join: Run does.
func New(cfg Config, self Meta, opts Options) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gossip config: %w", err)
	}
	keys, err := cfg.checkKey(opts.Env)
	if err != nil {
		return nil, fmt.Errorf("gossip config: %w", err)
	}
	auth, err := cfg.keyring(self.Role, self.Set, opts.Credentials)
	if err != nil {
		return nil, fmt.Errorf("gossip config: %w", err)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	if self.Boot == 0 {
		self.Boot = now().UnixNano()
	}
	n := &Node{
		cfg:        cfg,
		opts:       opts,
		log:        cmp.Or(opts.Logger, zap.NewNop()),
		keys:       keys,
		now:        now,
		handlers:   map[string]handlerEntry{},
		rlimits:    map[rejectKey]*refusal{},
		claims:     map[string]claimVerdict{},
		conflicted: map[string]bool{},
		members:    map[string]*Member{},
		former:     map[string]bool{},
		moves:      make(chan moveRequest),
		dirty:      make(chan struct{}, 1),
		inbox:      make(chan inMsg, 256),
		started:    make(chan struct{}),
		joined:     make(chan struct{}),
	}
	n.auth.Store(&authState{k: auth, required: cfg.Signatures != SignaturesOptional})
	n.metrics = newMetrics(opts.Registerer, n.HealthScore)
	base := self.Replica
	if base == "" {
		host, _ := os.Hostname()
		base = self.Role.String() + "-" + host
	}
	// A per-boot suffix: a restart (possibly on a new address) must not
	// collide with its own dead entry (memberlist#157).
	n.base = base
	name := nodeName(base, self.Boot)
	n.name.Store(&name)
	if err := n.setMeta(self); err != nil {
		return nil, err
	}
	return n, nil
}

// Name returns the gossip node name.
func (n *Node) Name() string { return *n.name.Load() }

// nodeName is a gossip node name: base and a suffix of t (Unix
// nanoseconds), so that every member a process makes has its own.
func nodeName(base string, t int64) string { return base + "." + strconv.FormatInt(t%1e9, 36) }

// ID returns this node's stable identity: the ID it advertises, or its
// node name when it advertises none (see Member.ID).
func (n *Node) ID() string { return cmp.Or(n.Meta().ID, n.Name()) }

// Meta returns the metadata this node advertises.
func (n *Node) Meta() Meta {
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	return n.cur
}

func (n *Node) setMeta(m Meta) error {
	if _, err := n.signMeta(n.Name(), m); err != nil {
		return err
	}
	n.cur = m
	n.meta.Store(&m)
	return nil
}

// UpdateMeta changes the advertised metadata and gossips it, waiting at
// most timeout for the broadcast to go out (it keeps spreading after).
func (n *Node) UpdateMeta(f func(*Meta), timeout time.Duration) error {
	n.metaMu.Lock()
	m := n.cur
	f(&m)
	err := n.setMeta(m)
	n.metaMu.Unlock()
	if err != nil {
		return err
	}
	n.mu.Lock()
	if self := n.members[n.Name()]; self != nil {
		self.Meta = m
	}
	n.mu.Unlock()
	n.signal()
	if ml := n.ml.Load(); ml != nil {
		if err := ml.UpdateNode(timeout); err != nil {
			return fmt.Errorf("gossip metadata update: %w", err)
		}
	}
	return nil
}

// Members returns a snapshot of every member, self included, sorted by
// node name.
func (n *Node) Members() []Member {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Member, 0, len(n.members))
	for _, k := range slices.Sorted(maps.Keys(n.members)) {
		out = append(out, *n.members[k])
	}
	refuseConflicts(out)
	return out
}

// refuseConflicts takes the role of the refused second claims to a live
// replica name (conflicts) in a snapshot.
func refuseConflicts(ms []Member) {
	cs := conflicts(ms)
	for i := range ms {
		if _, ok := cs[ms[i].Node]; ok && !ms[i].Self {
			ms[i].Meta.Role, ms[i].Refused = RoleUnknown, RejectClaimConflict
		}
	}
}

// HealthScore returns memberlist's awareness score: 0 is healthy, higher
// means this node is slow to answer probes. -1 before Run.
func (n *Node) HealthScore() int {
	if ml := n.ml.Load(); ml != nil {
		return ml.GetHealthScore()
	}
	return -1
}

// Started is closed once the gossip listener is bound.
func (n *Node) Started() <-chan struct{} { return n.started }

// Joined is closed once the node has joined the cluster (one seed at
// least answered; at once without seeds) and the Sink has been handed the
// members the join brought.
func (n *Node) Joined() <-chan struct{} { return n.joined }

// GossipAddr returns the advertised gossip address, or "" before Run.
func (n *Node) GossipAddr() string {
	// Not ml.LocalNode().Address(): UpdateMeta rewrites the local node
	// under memberlist's lock, which LocalNode's readers do not take.
	if a := n.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// ErrNotRunning is returned by calls that need a running Node.
var ErrNotRunning = errors.New("membership: node is not running")

// Send sends a user message to the alive member with this gossip node
// name, as one UDP packet (best effort: a lost packet is lost; keep it
// small). SendReliable uses TCP.
func (n *Node) Send(node string, msg []byte) error {
	ml, addr, err := n.liveMember(node)
	if err != nil {
		return err
	}
	return ml.SendToAddress(memberlist.Address{Addr: addr, Name: node}, encodeEnvelope(n.Name(), n.seal(node, msg)))
}

// PushState exchanges full state (a memberlist push/pull over TCP) with
// the alive members with these node names: they get this node's current
// metadata at once, where a gossiped update reaches a few random members
// only a few times. It returns how many it reached.
func (n *Node) PushState(nodes []string) (int, error) {
	ml := n.ml.Load()
	if ml == nil {
		return 0, ErrNotRunning
	}
	var addrs []string
	for _, node := range nodes {
		if _, addr, err := n.liveMember(node); err == nil && addr != "" {
			addrs = append(addrs, addr)
		}
	}
	if len(addrs) == 0 {
		return 0, nil
	}
	return ml.Join(addrs)
}

// Join joins the members at these gossip addresses (a memberlist join:
// a full state exchange with each), as a seed is joined. It returns how
// many it reached.
func (n *Node) Join(addrs []string) (int, error) {
	ml := n.ml.Load()
	if ml == nil {
		return 0, ErrNotRunning
	}
	return ml.Join(addrs)
}

// liveMember returns the running memberlist and the gossip address of the
// alive member with this node name.
func (n *Node) liveMember(node string) (*memberlist.Memberlist, string, error) {
	ml := n.ml.Load()
	if ml == nil {
		return nil, "", ErrNotRunning
	}
	n.mu.Lock()
	m, ok := n.members[node]
	alive, addr := ok && m.Status == StatusAlive, ""
	if ok {
		addr = m.Gossip
	}
	n.mu.Unlock()
	if !alive {
		return nil, "", fmt.Errorf("membership: no live member %q", node)
	}
	return ml, addr, nil
}

// Run binds, joins, and keeps the member list current until ctx is done;
// then it leaves the cluster gracefully and shuts gossip down.
func (n *Node) Run(ctx context.Context) error {
	c, d := n.memberlistConfig(n.Name(), n.cfg.BindPort)
	n.del.Store(d)
	ml, err := n.create(c)
	if err != nil {
		return err
	}
	// The local node's address is read before ml is published: from then
	// on UpdateMeta may rewrite the local node (memberlist's aliveNode),
	// and reading it here raced that write.
	addr := ml.LocalNode().Address()
	n.addr.Store(&addr)
	n.ml.Store(ml)
	n.mu.Lock()
	n.members[n.Name()] = &Member{Node: n.Name(), Gossip: addr, Meta: n.Meta(), Status: StatusAlive, Since: n.now(), Self: true}
	n.mu.Unlock()
	close(n.started)
	n.log.Info("gossip started", zap.String("node", n.Name()), zap.String("addr", addr),
		zap.String("label", n.cfg.Label), zap.Bool("encrypted", len(n.keys) > 0),
		zap.Bool("signed", n.keyring().CanSign()), zap.Bool("signatures_required", n.Requires()))
	n.warnInsecure()
	if n.Verifies() && !n.Requires() {
		n.log.Warn("gossip.signatures is optional: unsigned messages and claims of members of a version without signatures are believed, by their own metadata; " +
			"set gossip.signatures: required once every member runs this version (docs/membership.md, rolling upgrade)")
	}
	n.signal()

	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	wg.Add(3)
	go func() { defer wg.Done(); n.joinLoop(wctx) }()
	go func() { defer wg.Done(); n.emitLoop(wctx) }()
	go func() { defer wg.Done(); n.messageLoop(wctx) }()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case req := <-n.moves:
			req.done <- n.move(req.port, req.advertise)
		}
	}
	cancel()
	wg.Wait()
	ml = n.ml.Load()

	if n.Meta().Role == RoleProxy {
		// memberlist cannot tell a graceful leave from a death
		// (memberlist#293): a leaving member advertises stopped first, as
		// agents do, so that the others record a leave (an upgrade's old
		// process, a stop), not a death.
		if err := n.UpdateMeta(func(m *Meta) { m.State = balancer.StateStopped }, time.Second); err != nil {
			n.log.Debug("gossip: stopped not advertised before leaving", zap.Error(err))
		}
	}
	if err := ml.Leave(2 * time.Second); err != nil {
		n.log.Warn("gossip leave", zap.Error(err))
	}
	if err := ml.Shutdown(); err != nil {
		n.log.Warn("gossip shutdown", zap.Error(err))
	}
	n.log.Info("gossip stopped", zap.String("node", n.Name()))
	return nil
}

// create binds and starts a memberlist member configured by c (through
// the Transport hook, if any).
func (n *Node) create(c *memberlist.Config) (*memberlist.Memberlist, error) {
	if n.opts.Transport != nil {
		if err := n.netTransport(c); err != nil {
			return nil, err
		}
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		if c.Transport != nil {
			// memberlist shuts down only the transports it made.
			_ = c.Transport.Shutdown()
		}
		return nil, fmt.Errorf("gossip: %w", err)
	}
	return ml, nil
}

// MoveTo makes the running node gossip from port (advertised as
// advertisePort, 0 meaning port): a new gossip member
// (a new node name, the same metadata, ID and boot) binds it, joins the
// cluster through the current one and takes its place; the current one
// advertises stopped and leaves, as at a stop. On error nothing changed.
// An upgrade's new process calls it once the old one, which held the
// configured port, has exited.
func (n *Node) MoveTo(ctx context.Context, port, advertisePort int) error {
	req := moveRequest{port: port, advertise: advertisePort, done: make(chan error, 1)}
	select {
	case n.moves <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-req.done
}

// move is MoveTo, on Run's goroutine.
func (n *Node) move(port, advertise int) error {
	old, oldD := n.ml.Load(), n.del.Load()
	name := nodeName(n.base, n.now().UnixNano())
	c, d := n.memberlistConfig(name, port)
	c.AdvertisePort = cmp.Or(advertise, port)
	ml, err := n.create(c)
	if err != nil {
		return err
	}
	// Through the current member: its push/pull brings the whole cluster.
	if _, err := ml.Join([]string{*n.addr.Load()}); err != nil {
		_ = ml.Shutdown()
		return fmt.Errorf("gossip: joining the cluster from port %d: %w", port, err)
	}
	addr := ml.LocalNode().Address()
	prev := n.Name()
	n.mu.Lock()
	n.former[prev] = true
	delete(n.members, prev)
	n.members[name] = &Member{Node: name, Gossip: addr, Meta: n.Meta(), Status: StatusAlive, Since: n.now(), Self: true}
	n.name.Store(&name)
	n.addr.Store(&addr)
	n.ml.Store(ml)
	n.del.Store(d)
	n.mu.Unlock()
	n.signal()
	// The old member leaves as a stopping one does (Run): stopped first.
	oldD.stopped.Store(true)
	if err := old.UpdateNode(time.Second); err != nil {
		n.log.Debug("gossip: stopped not advertised before leaving", zap.Error(err))
	}
	if err := old.Leave(2 * time.Second); err != nil {
		n.log.Warn("gossip leave", zap.Error(err))
	}
	_ = old.Shutdown()
	n.log.Info("gossip moved", zap.String("from", prev), zap.String("node", name), zap.String("addr", addr))
	return nil
}

// mlDelegate is one memberlist's delegate: the node's, advertising its
// metadata signed for this memberlist's node name; once stopped it
// advertises the node's metadata with state stopped (a member that
// MoveTo replaced, leaving).
type mlDelegate struct {
	*delegate
	name    string
	stopped atomic.Bool
	cache   atomic.Pointer[metaCache]
}

// metaCache is the last encoding NodeMeta served, for the metadata it
// was made from: memberlist asks for it at every push/pull.
type metaCache struct {
	src     *Meta
	auth    *authState
	stopped bool
	b       []byte
}

func (d *mlDelegate) NodeMeta(limit int) []byte {
	n := (*Node)(d.delegate)
	src, stopped, auth := n.meta.Load(), d.stopped.Load(), n.auth.Load()
	c := d.cache.Load()
	if c == nil || c.src != src || c.stopped != stopped || c.auth != auth {
		m := *src
		if stopped {
			m.State = balancer.StateStopped
		}
		b, err := n.signMeta(d.name, m)
		if err != nil {
			// setMeta checked it; never advertise what does not verify.
			n.log.Error("gossip metadata not encoded", zap.Error(err))
			return nil
		}
		c = &metaCache{src: src, auth: auth, stopped: stopped, b: b}
		d.cache.Store(c)
	}
	if len(c.b) > limit {
		// setMeta checked MetaMaxSize; never panic memberlist.
		return nil
	}
	return c.b
}

// memberlistConfig is the configuration of the memberlist member named
// name on port.
func (n *Node) memberlistConfig(name string, port int) (*memberlist.Config, *mlDelegate) {
	c := memberlist.DefaultLANConfig()
	if n.cfg.Profile == "fast" {
		c.ProbeInterval = 500 * time.Millisecond
		c.ProbeTimeout = 200 * time.Millisecond
		c.SuspicionMult = 2
		c.GossipInterval = 100 * time.Millisecond
		c.TCPTimeout = 2 * time.Second
	}
	c.Name = name
	c.BindAddr = n.cfg.BindAddr
	c.BindPort = port
	c.AdvertiseAddr = n.cfg.AdvertiseAddr
	// memberlist advertises AdvertisePort verbatim when an advertise
	// address is set: 0 must mean "the bound port", not port 0. (With
	// BindPort 0 memberlist fills in the chosen port itself.)
	c.AdvertisePort = n.cfg.AdvertisePort
	if c.AdvertisePort == 0 {
		c.AdvertisePort = port
	}
	if c.AdvertiseAddr == "" && n.cfg.BindAddr != "0.0.0.0" && n.cfg.BindAddr != "::" {
		c.AdvertiseAddr = n.cfg.BindAddr
	}
	c.PushPullInterval = n.cfg.PushPullInterval
	c.Label = n.cfg.Label
	// A Left node's name is reclaimable at once; a dead one after this.
	c.DeadNodeReclaimTime = 10 * time.Second
	if len(n.keys) > 0 {
		kr, _ := memberlist.NewKeyring(n.keys, n.keys[0])
		c.Keyring = kr
	}
	d := &mlDelegate{delegate: (*delegate)(n), name: name}
	c.Delegate = d
	c.Events = (*events)(n)
	c.Alive = (*alive)(n)
	c.LogOutput = newLogWriter(n.log.Named("memberlist"), n.metrics.rejected)
	return c, d
}

// firstJoinAttempts bounds the joins of Options.FirstJoin alone.
const firstJoinAttempts = 5

// joinLoop joins the seeds with backoff, then re-joins them periodically.
func (n *Node) joinLoop(ctx context.Context) {
	seeds := append(slices.Clone(n.opts.FirstJoin), n.cfg.Join...)
	if len(seeds) == 0 {
		n.joining.Store(true)
		n.signal()
		return
	}
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		k, err := n.ml.Load().Join(seeds)
		if err == nil || k > 0 || (len(n.cfg.Join) == 0 && attempt >= firstJoinAttempts) {
			// With only first seeds, a few failed attempts end the join:
			// the old process of an upgrade that is gone leaves this one
			// alone, as a proxy that joins nobody is.
			n.log.Info("gossip joined", zap.Strings("seeds", seeds), zap.Int("contacted", k), zap.Error(err))
			// memberlist merged the seeds' state before Join returned: the
			// next snapshot holds it.
			n.joining.Store(true)
			n.signal()
			break
		}
		n.metrics.joinFailures.Inc()
		n.log.Warn("gossip join failed; retrying", zap.Strings("seeds", seeds), zap.Error(err), zap.Duration("in", backoff))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
	if n.cfg.RejoinInterval <= 0 || len(n.cfg.Join) == 0 {
		return
	}
	t := time.NewTicker(n.cfg.RejoinInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := n.ml.Load().Join(n.cfg.Join); err != nil {
				n.log.Debug("gossip rejoin failed", zap.Error(err))
			}
		}
	}
}

// emitLoop hands member snapshots to the sink, coalescing bursts, and
// forgets dead members after ForgetAfter.
func (n *Node) emitLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.dirty:
			// Coalesce: a burst of joins becomes one snapshot.
			t := time.NewTimer(20 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		case <-tick.C:
			if !n.forget() {
				continue
			}
		}
		n.emit()
	}
}

// forget drops dead and left members older than ForgetAfter; it reports
// whether anything changed.
func (n *Node) forget() bool {
	cutoff := n.now().Add(-n.cfg.ForgetAfter)
	changed := false
	n.mu.Lock()
	for k, m := range n.members {
		if m.Status != StatusAlive && m.Since.Before(cutoff) {
			delete(n.members, k)
			delete(n.claims, k)
			changed = true
		}
	}
	n.mu.Unlock()
	return changed
}

func (n *Node) emit() {
	joined := n.joining.Load()
	ms := n.Members()
	n.alarmConflicts(ms)
	n.metrics.observe(ms)
	if n.opts.Sink != nil {
		n.opts.Sink.SetMembers(ms)
	}
	if joined {
		n.joinedOnce.Do(func() { close(n.joined) })
	}
}

func (n *Node) messageLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-n.inbox:
			n.dispatch(m.from, m.msg)
		}
	}
}

func (n *Node) signal() {
	select {
	case n.dirty <- struct{}{}:
	default:
	}
}

// update records an event. It runs inside memberlist callbacks, under
// memberlist's node lock: it must not block or call memberlist.
func (n *Node) update(node *memberlist.Node, leaving bool) {
	if node.Name == n.Name() {
		return
	}
	meta, err := DecodeMeta(node.Meta)
	if err != nil {
		n.metrics.badMeta.Inc()
		return
	}
	addr := net.JoinHostPort(node.Addr.String(), strconv.Itoa(int(node.Port)))
	now := n.now()
	n.mu.Lock()
	if n.former[node.Name] {
		n.mu.Unlock() // this process's member before MoveTo, leaving
		return
	}
	v, seen := n.claims[node.Name]
	if !seen || !bytes.Equal(v.raw, node.Meta) {
		v.raw, v.meta = bytes.Clone(node.Meta), meta
		v.reason, v.detail = n.claimCheck(node.Name, node.Meta, meta)
		v.legacy = v.reason == "" && n.Verifies() && !metaSigned(node.Meta)
		n.claims[node.Name] = v
		if v.reason != "" {
			defer n.refuse(node.Name, "claim", v.reason, v.detail)
		}
	}
	if v.reason != "" {
		// Not believed: listed (it is alive), but with no role.
		meta.Role = RoleUnknown
	}
	m, ok := n.members[node.Name]
	if !ok {
		m = &Member{Node: node.Name}
		n.members[node.Name] = m
	}
	status := StatusAlive
	if leaving {
		// memberlist cannot tell us Left from Dead (memberlist#293): a
		// member that leaves gracefully advertises stopped first.
		status = StatusDead
		if m.Meta.State == balancer.StateStopped || meta.State == balancer.StateStopped {
			status = StatusLeft
		}
	} else {
		m.Meta, m.Refused, m.Legacy = meta, v.reason, v.legacy
	}
	if !ok || m.Status != status {
		m.Since = now
	}
	m.Status, m.Gossip = status, addr
	n.mu.Unlock()
	n.metrics.events.Inc()
	n.signal()
}

// delegate implements memberlist.Delegate.
type delegate Node

func (d *delegate) NotifyMsg(b []byte) {
	n := (*Node)(d)
	from, msg, ok := decodeEnvelope(b)
	if !ok {
		n.metrics.badMsgs.Inc()
		return
	}
	select {
	case n.inbox <- inMsg{from: from, msg: msg}:
	default:
		n.metrics.droppedMsgs.Inc()
	}
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// events implements memberlist.EventDelegate.
type events Node

func (e *events) NotifyJoin(node *memberlist.Node)   { (*Node)(e).update(node, false) }
func (e *events) NotifyUpdate(node *memberlist.Node) { (*Node)(e).update(node, false) }
func (e *events) NotifyLeave(node *memberlist.Node)  { (*Node)(e).update(node, true) }

// alive implements memberlist.AliveDelegate: a peer whose metadata this
// version cannot read never becomes a member.
type alive Node

func (a *alive) NotifyAlive(peer *memberlist.Node) error {
	if peer.Name == (*Node)(a).Name() {
		return nil
	}
	if _, err := DecodeMeta(peer.Meta); err != nil {
		(*Node)(a).metrics.badMeta.Inc()
		return fmt.Errorf("keyway: rejecting %s: %w", peer.Name, err)
	}
	return nil
}

// envelope: 1 byte length of the sender name, the name, the payload.
func encodeEnvelope(from string, msg []byte) []byte {
	b := make([]byte, 0, 1+len(from)+len(msg))
	b = append(b, byte(len(from)))
	b = append(b, from...)
	return append(b, msg...)
}

func decodeEnvelope(b []byte) (from string, msg []byte, ok bool) {
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", nil, false
	}
	return string(b[1 : 1+int(b[0])]), bytes.Clone(b[1+int(b[0]):]), true
}
