package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"keyway/balancer"
)

// Sink receives exclusion transitions — a replica taken out of rotation
// for a reason, or that reason cleared — never individual probe results
// or requests. The proxy implements it by calling the set's
// [balancer.Router.SetExcluded].
//
// Calls are serialized (never concurrent) and come from the goroutine of
// [Checker.Run], from a caller of [Checker.Reset], or from the caller of
// [Checker.Observe] whose failure made a replica's count reach
// passive.consecutive_failures (the ejection is made before that Observe
// returns); never from inside [Checker.SetTargets] or [Checker.Snapshot],
// so the Sink may take locks that are held around those calls (the
// Router's, when SetTargets is called from a Router hook), but not locks
// held around Observe. It may block briefly; the Checker's own lock is
// not held while it runs. The Checker clears every reason it set once the
// replica is forgotten (see SetTargets).
type Sink interface {
	SetExcluded(set, replica string, reason balancer.Reason, excluded bool)
}

// Target is one ring member to check: the replica set, the replica's ring
// name and the host:port to probe. A plain value.
type Target struct {
	Set, Replica, Addr string
}

// Event is one health transition, for the audit trail and the logs. A
// plain value.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"` // see the Event* constants
	Set     string    `json:"set"`
	Replica string    `json:"replica"`
	// Reason says why: for probe events the last probe's result ("status
	// 500", "timeout", a transport error); for ejected and failed the
	// failure kind that tripped the detector (connect, timeout, reset,
	// 5xx); for readmitted "backoff elapsed" or "reset"; for recovered
	// "cooldown elapsed" or "reset".
	Reason string `json:"reason,omitempty"`
	// Ejections is the number of ejections within the supervision window,
	// this one included (ejected and failed events).
	Ejections int `json:"ejections,omitempty"`
	// Until is when an ejection or a hold ends (ejected and failed events).
	Until time.Time `json:"until,omitzero"`
}

// Event kinds.
const (
	EventProbeDown  = "probe_down" // active probes failed Fall times in a row: out with ReasonProbe
	EventProbeUp    = "probe_up"   // active probes passed Rise times in a row: ReasonProbe cleared
	EventEjected    = "ejected"    // passive ejection: out with ReasonEjected until Event.Until
	EventReadmitted = "readmitted" // ReasonEjected cleared
	EventFailed     = "failed"     // supervision hold: out with ReasonFailed until Event.Until
	EventRecovered  = "recovered"  // ReasonFailed cleared
)

// Options are a Checker's optional dependencies. The zero value works.
type Options struct {
	// Logger receives transitions and probe errors. If nil, logs are
	// discarded. Pass logger.Named("health").
	Logger *zap.Logger
	// Registerer receives the Checker's metrics. If nil, they are not
	// exported. NewChecker fails if they are already registered there.
	Registerer prometheus.Registerer
	// Now is the clock for event times, ejection deadlines and holds. If
	// nil, time.Now. Timers (probe schedule, sweeper tick) always run on
	// the runtime's clock, so with active probing on Now must follow it
	// (tests use testing/synctest, whose fake clock drives both).
	Now func() time.Time
	// OnEvent, if non-nil, receives every transition after the Sink has
	// been told, serialized like Sink calls. It must not block for long
	// and must not call Reset (it may call Snapshot).
	OnEvent func(Event)
	// Client makes the active probes; each probe's context carries
	// Active.Timeout. If nil, the Checker uses its own client with no
	// keep-alive (a fresh connection per probe, so a replica restarted on
	// the same address is never probed on a stale connection), no proxy
	// (HTTP_PROXY must not reroute probes) and no redirects (a 3xx is an
	// answer, judged by expect_status).
	Client *http.Client
	// ProbeTLS, if non-nil, returns the TLS configuration with which to
	// probe a replica of a set, or nil for plain HTTP: the proxy's, for a
	// set whose replicas speak TLS. With one, the probe is an https request
	// on a fresh connection (Client is not used for it). It is called for
	// every probe, from the probes' goroutines.
	ProbeTLS func(set, replica, addr string) *tls.Config
}

// Checker runs the active prober and the passive outlier detector for
// every replica set of a proxy, and tells a [Sink] which replicas to hold
// out of rotation and why. Construct it with [NewChecker], feed it targets
// with [Checker.SetTargets] and request outcomes with [Checker.Observe],
// and call [Checker.Run] once.
//
// A Checker is safe for concurrent use and must not be copied.
type Checker struct {
	_ noCopy

	cfg       Config
	expect    StatusRanges
	countMask uint8 // bit k set: failure kind k counts
	threshold int64 // passive.consecutive_failures
	sink      Sink
	log       *zap.Logger
	now       func() time.Time
	onEvent   func(Event)
	client    *http.Client
	probeTLS  func(set, replica, addr string) *tls.Config
	metrics   *metrics

	// obs is the hot path's view: set → replica → counters. The maps are
	// immutable once published; SetTargets publishes new ones.
	obs atomic.Pointer[observeMap]

	// applyMu serializes deciding and delivering transitions (Run's loop,
	// Reset, an ejection on the threshold in Observe): Sink calls and
	// events reach the Sink in the order they were decided. It is taken before mu, and mu is released before the Sink
	// is called, so a Sink may hold locks around SetTargets calls.
	applyMu sync.Mutex

	mu   sync.Mutex
	sets map[string]*setState
	gone []*replica // removed by SetTargets; forgotten by the next decision
	mark uint64     // generation for sameTargetsLocked

	kick    chan struct{} // SetTargets → Run: targets changed
	running atomic.Bool
}

// setState is one replica set's targets; guarded by Checker.mu.
type setState struct {
	name     string
	replicas map[string]*replica
	ejected  prometheus.Gauge
	capped   prometheus.Counter
}

// replica is the control-plane state of one target, guarded by
// Checker.mu except for its counters (atomics written by Observe).
type replica struct {
	set, name, addr string
	c               *counters
	m               replicaMetrics
	gone            bool            // removed by SetTargets
	mark            uint64          // see sameTargetsLocked
	excl            balancer.Reason // reasons this Checker has told the Sink

	// Active probing.
	v         verdict
	next      time.Time // next probe due
	inFlight  bool
	lastProbe time.Time
	lastDesc  string // "status 200", "timeout", transport error

	// Passive ejection and supervision.
	ejected     bool
	ejectUntil  time.Time
	level       int  // the next ejection lasts BaseEjection << level (capped)
	probation   bool // readmitted, no success seen yet: a success resets level
	history     []time.Time
	ejections   uint64 // every ejection since the target appeared: its keyway_ejections_total series summed
	failed      bool
	failedUntil time.Time
	capped      kind // should be ejected but the share cap holds it in: the kind, else kindNone
	lastKind    kind // last failure kind that tripped the detector
}

type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// NewChecker validates cfg and returns a Checker that reports to sink,
// which must not be nil. It starts no goroutine; call [Checker.Run].
func NewChecker(cfg Config, sink Sink, opts Options) (*Checker, error) {
	if sink == nil {
		return nil, errors.New("health: nil sink")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("health: invalid config: %w", err)
	}
	expect, _ := ParseStatusRanges(cfg.Active.ExpectStatus)
	mask, _ := parseCount(cfg.Passive.Count)
	c := &Checker{
		cfg:       cfg,
		expect:    expect,
		countMask: mask,
		threshold: int64(cfg.Passive.ConsecutiveFailures),
		sink:      sink,
		log:       opts.Logger,
		now:       opts.Now,
		onEvent:   opts.OnEvent,
		client:    opts.Client,
		probeTLS:  opts.ProbeTLS,
		metrics:   newMetrics(),
		sets:      map[string]*setState{},
		kick:      make(chan struct{}, 1),
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.client == nil {
		c.client = newProbeClient()
	}
	if opts.Registerer != nil {
		if err := c.metrics.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("health: register metrics: %w", err)
		}
	}
	c.obs.Store(&observeMap{})
	return c, nil
}

// Config returns the Checker's configuration.
func (c *Checker) Config() Config { return c.cfg }

// SetTargets replaces the targets of one replica set: its ring members
// now (Target.Set is ignored; set names the set). New targets are probed
// after a random delay within one interval and start in rotation; a
// target whose address changed is probed at the new one. Removed targets
// are forgotten: their metrics series are deleted at once, and the
// reasons the Checker set for them are cleared by Run's goroutine (or the
// next Reset), never by this call. A list equal to the current one
// changes nothing and allocates nothing, so the proxy may call this after
// every table rebuild.
//
// It is cheap and never blocks on the Sink or on Run: it may be called
// from a Router hook while the Router's lock is held. Safe for concurrent
// use.
func (c *Checker) SetTargets(set string, ts []Target) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sets[set]
	if s != nil && c.sameTargetsLocked(s.replicas, ts) {
		return
	}
	if s == nil {
		s = &setState{name: set, replicas: map[string]*replica{}}
		s.ejected, s.capped = c.metrics.forSet(set)
		c.sets[set] = s
	}
	now := c.now()
	keep := make(map[string]bool, len(ts))
	for _, t := range ts {
		if t.Replica == "" {
			continue
		}
		keep[t.Replica] = true
		r := s.replicas[t.Replica]
		switch {
		case r == nil:
			r = &replica{
				set: set, name: t.Replica, addr: t.Addr,
				c: &counters{},
				v: newVerdict(c.cfg.Active.Rise, c.cfg.Active.Fall),
			}
			r.m = c.metrics.forReplica(set, t.Replica, c.cfg.Active.Enabled, c.cfg.Passive.Enabled)
			r.next = now.Add(jitter(c.cfg.Active.Interval))
			s.replicas[t.Replica] = r
		case r.addr != t.Addr:
			r.addr = t.Addr
			if !r.inFlight {
				r.next = now.Add(jitter(c.cfg.Active.Interval))
			}
		}
	}
	for name, r := range s.replicas {
		if !keep[name] {
			delete(s.replicas, name)
			r.gone = true
			c.metrics.forget(set, name)
			c.gone = append(c.gone, r)
		}
	}
	c.publishObserveLocked(s)
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// RemoveSet forgets a replica set that left the configuration: its
// replicas stop being checked and every series of the set is deleted.
func (c *Checker) RemoveSet(set string) {
	c.SetTargets(set, nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sets[set] != nil {
		delete(c.sets, set)
		c.metrics.ejected.DeleteLabelValues(set)
		c.metrics.capped.DeleteLabelValues(set)
		m := maps.Clone(*c.obs.Load())
		delete(m, set)
		c.obs.Store(&m)
	}
}

// sameTargetsLocked reports whether ts lists exactly the replicas of cur,
// at the same addresses, each once. O(len(ts)), no allocation: a
// generation mark on each replica catches duplicates. c.mu is held.
func (c *Checker) sameTargetsLocked(cur map[string]*replica, ts []Target) bool {
	c.mark++
	n := 0
	for _, t := range ts {
		if t.Replica == "" {
			continue
		}
		r := cur[t.Replica]
		if r == nil || r.addr != t.Addr || r.mark == c.mark {
			return false
		}
		r.mark = c.mark
		n++
	}
	return n == len(cur)
}

// Reset is the operator's undrain: it clears the replica's supervision
// hold, its ejection, its ejection history and backoff, and its failure
// count, and tells the Sink at once (from the caller's goroutine). The
// active probe verdict is kept: it reflects the replica's answers. A
// replica the Checker does not know is ignored. Safe for concurrent use;
// do not call it from OnEvent or from the Sink.
func (c *Checker) Reset(set, replica string) {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	var st step
	c.mu.Lock()
	now := c.now()
	c.forgetGoneLocked(&st)
	if s := c.sets[set]; s != nil {
		if r := s.replicas[replica]; r != nil {
			c.resetLocked(s, r, now, &st)
		}
	}
	c.mu.Unlock()
	c.apply(&st)
}

// ReplicaHealth is one replica's health as this proxy sees it, for the
// admin API. A plain value; times are zero when not applicable.
type ReplicaHealth struct {
	Set     string `json:"set"`
	Replica string `json:"replica"`
	Addr    string `json:"addr"`
	// Excluded lists the reasons the Checker holds the replica out for
	// ("none", "probe", "ejected+failed", ...).
	Excluded string `json:"excluded"`

	// Probe is the active verdict: "up", "down", or "off" when active
	// probing is disabled.
	Probe string `json:"probe"`
	// ProbePasses and ProbeFailures are the current runs of consecutive
	// probe results (one of them is 0).
	ProbePasses   int       `json:"probe_passes"`
	ProbeFailures int       `json:"probe_failures"`
	LastProbe     time.Time `json:"last_probe,omitzero"`
	// LastProbeResult describes the last probe: "status 200", "timeout",
	// or a transport error.
	LastProbeResult string `json:"last_probe_result,omitempty"`

	// ConsecutiveFailures is the passive count of failed requests in a row.
	ConsecutiveFailures int64 `json:"consecutive_failures"`
	// EjectedUntil is when the current passive ejection ends.
	EjectedUntil time.Time `json:"ejected_until,omitzero"`
	// Ejections is the number of ejections within the supervision window.
	Ejections int `json:"ejections"`
	// EjectionsTotal is every passive ejection of the replica, whatever
	// its reason, since it became a target of this Checker: the sum of its
	// keyway_ejections_total series, which live exactly as long (created
	// when the replica becomes a target, deleted when it is forgotten). A
	// Reset does not lower it.
	EjectionsTotal uint64 `json:"ejections_total"`
	// NextEjection is how long the next ejection would last.
	NextEjection time.Duration `json:"next_ejection_ns"`
	// FailedUntil is when the current supervision hold ends.
	FailedUntil time.Time `json:"failed_until,omitzero"`
	// ShareCapped says the replica should be ejected but the share cap
	// keeps it in rotation.
	ShareCapped bool `json:"share_capped,omitempty"`
	// LastReason is the last failure kind that tripped the passive
	// detector (connect, timeout, reset, 5xx), or "".
	LastReason string `json:"last_reason,omitempty"`
}

// Snapshot returns the health of every target of a set, sorted by
// replica name, or nil for a set without targets. Safe for concurrent use.
func (c *Checker) Snapshot(set string) []ReplicaHealth {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sets[set]
	if s == nil {
		return nil
	}
	now := c.now()
	out := make([]ReplicaHealth, 0, len(s.replicas))
	for _, r := range s.replicas {
		h := ReplicaHealth{
			Set: set, Replica: r.name, Addr: r.addr,
			Excluded:            r.excl.String(),
			Probe:               "off",
			ConsecutiveFailures: r.c.consec.Load(),
			Ejections:           len(c.windowLocked(r, now)),
			EjectionsTotal:      r.ejections,
			NextEjection:        c.ejectionFor(r.level),
			ShareCapped:         r.capped != kindNone,
			LastReason:          r.lastKind.String(),
		}
		if c.cfg.Active.Enabled {
			h.Probe = "down"
			if r.v.up {
				h.Probe = "up"
			}
			h.ProbePasses, h.ProbeFailures = r.v.passes, r.v.failures
			h.LastProbe, h.LastProbeResult = r.lastProbe, r.lastDesc
		}
		if r.ejected {
			h.EjectedUntil = r.ejectUntil
		}
		if r.failed {
			h.FailedUntil = r.failedUntil
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b ReplicaHealth) int { return strings.Compare(a.Replica, b.Replica) })
	return out
}

// ErrRunning is returned by Run when another Run of the same Checker is
// still running.
var ErrRunning = errors.New("health: checker already running")

// Run probes and sweeps until ctx is done, then waits for the probes in
// flight (each bounded by Active.Timeout) and returns nil. It owns every
// goroutine of the Checker: one loop that schedules the probes (at most
// Active.Concurrency in flight, at most one per target, the first one of a
// target jittered), ticks the passive sweeper every Passive.Interval,
// forgets removed targets, and delivers transitions to the Sink; plus one
// short-lived goroutine per probe in flight. Exclusions stay as they are
// when Run returns. Call it once.
func (c *Checker) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)

	var wg sync.WaitGroup
	results := make(chan probeResult, c.cfg.Active.Concurrency) // never more in flight: sends never block
	inflight := 0
	defer wg.Wait()

	var sweepC <-chan time.Time
	if c.cfg.Passive.Enabled {
		t := time.NewTicker(c.cfg.Passive.Interval)
		defer t.Stop()
		sweepC = t.C
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	for {
		c.forgetGone()
		if c.cfg.Active.Enabled {
			wake, launched := c.launchDue(ctx, &wg, results, c.cfg.Active.Concurrency-inflight)
			inflight += launched
			timer.Stop()
			if !wake.IsZero() {
				timer.Reset(max(wake.Sub(c.now()), 0))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case res := <-results:
			inflight--
			c.handleResult(res)
		case <-sweepC:
			c.sweep(c.now())
		case <-timer.C:
		}
	}
}

// step collects what one decision tells the Sink and OnEvent, to deliver
// once Checker.mu is released.
type step struct {
	calls  []sinkCall
	events []Event
}

type sinkCall struct {
	set, replica string
	reason       balancer.Reason
	excluded     bool
}

// exclude records a Sink call for r, unless the Sink already has it.
func (st *step) exclude(r *replica, reason balancer.Reason, excluded bool) {
	if (r.excl&reason != 0) == excluded {
		return
	}
	if excluded {
		r.excl |= reason
	} else {
		r.excl &^= reason
	}
	st.calls = append(st.calls, sinkCall{r.set, r.name, reason, excluded})
}

func (st *step) event(e Event) { st.events = append(st.events, e) }

// apply delivers a step: Sink calls first, so that an event consumer sees
// the routing already changed, then events. c.applyMu is held, c.mu not.
func (c *Checker) apply(st *step) {
	for _, k := range st.calls {
		c.sink.SetExcluded(k.set, k.replica, k.reason, k.excluded)
	}
	for _, e := range st.events {
		c.logEvent(e)
		if c.onEvent != nil {
			c.onEvent(e)
		}
	}
}

func (c *Checker) logEvent(e Event) {
	lvl := zapcore.WarnLevel
	switch e.Kind {
	case EventProbeUp, EventReadmitted, EventRecovered:
		lvl = zapcore.InfoLevel
	}
	ce := c.log.Check(lvl, "replica health changed")
	if ce == nil {
		return
	}
	fields := []zap.Field{zap.String("event", e.Kind), zap.String("set", e.Set), zap.String("replica", e.Replica)}
	if e.Reason != "" {
		fields = append(fields, zap.String("reason", e.Reason))
	}
	if e.Ejections > 0 {
		fields = append(fields, zap.Int("ejections", e.Ejections))
	}
	if !e.Until.IsZero() {
		fields = append(fields, zap.Time("until", e.Until), zap.Duration("for", e.Until.Sub(e.Time)))
	}
	ce.Write(fields...)
}

// forgetGone clears what the Checker set for removed targets.
func (c *Checker) forgetGone() {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	var st step
	c.mu.Lock()
	c.forgetGoneLocked(&st)
	c.mu.Unlock()
	c.apply(&st)
}

// forgetGoneLocked records clearing every reason set for a removed target.
// Every decision calls it first, under the same lock, so that a replica
// removed and added again is cleared before its new self is excluded.
func (c *Checker) forgetGoneLocked(st *step) {
	for _, r := range c.gone {
		for _, reason := range []balancer.Reason{balancer.ReasonProbe, balancer.ReasonEjected, balancer.ReasonFailed} {
			st.exclude(r, reason, false)
		}
	}
	clear(c.gone)
	c.gone = c.gone[:0]
}
