package runstate

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"keyway/internal/atomicfile"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/membership"
)

// Options are a State's dependencies; all optional.
type Options struct {
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	// Interval is how often the digest goes to every other proxy. 0 means 1s.
	Interval time.Duration
	// Dir, when not empty, keeps the records in Dir/runtime.json.
	Dir string
	// OnChange is called with the records that changed (locally written or
	// merged from a peer) and then every record, after each change, one
	// call at a time. It may block briefly (it applies the change); it
	// must not call Update.
	OnChange func(changed, all []Record)
	// Now is the wall clock: versions take their physical part from it,
	// and a peer's record too far ahead of it is refused (see MaxAhead).
	// nil means time.Now.
	Now func() time.Time
	// ConfirmWithin bounds how long Write waits for the fleet to
	// acknowledge a record (confirm.go). 0 means 2s.
	ConfirmWithin time.Duration
}

// State holds and replicates the run-time state. Build it with New,
// Attach a Node (which registers its message handlers), and Run it. Safe
// for concurrent use.
type State struct {
	log      *zap.Logger
	interval time.Duration
	dir      string
	onChange func(changed, all []Record)
	now      func() time.Time
	// confirmWithin bounds a Write's wait for acknowledgements.
	confirmWithin time.Duration

	merged   *prometheus.CounterVec // source: local, peer
	refused  *prometheus.CounterVec // reason: future
	records  prometheus.Gauge
	persistE prometheus.Counter

	applyMu sync.Mutex // one change applied (OnChange, the file) at a time, in order

	mu     sync.Mutex
	self   func() string // the attached Node's name (it changes with MoveTo): where peers reply
	origin string        // the attached Node's ID: the origin of this proxy's writes
	recs   map[Key]Record
	clock  uint64 // the highest version seen (written, merged or loaded)
	// refusals notes, per origin and sender, the last refusal logged and
	// how many were not logged since (at most one line a minute each).
	refusals map[string]refusalNote
	synced   bool
	started  time.Time
	busy     map[string]bool // peers with a reliable send in flight
	sends    sync.WaitGroup
	sendFn   func(node string, msg []byte, reliable bool) error
	proxies  func() []string // the other alive proxies' node names
	fleet    func() Peers    // what a write asks and counts (confirm.go)
	pending  map[Key][]*pending
}

// runtimeFile is Dir/runtime.json.
type runtimeFile struct {
	Format  int      `json:"format"`
	Records []Record `json:"records"`
}

const runtimeFileName = "runtime.json"

// New returns a State, with the records of opts.Dir when it holds
// some. A state file that cannot be read or parsed is an error naming it:
// starting without the state it holds could bring back deleted sets.
func New(opts Options) (*State, error) {
	r := &State{
		log:           cmp.Or(opts.Logger, zap.NewNop()),
		interval:      cmp.Or(opts.Interval, time.Second),
		dir:           opts.Dir,
		onChange:      opts.OnChange,
		now:           opts.Now,
		pending:       map[Key][]*pending{},
		confirmWithin: cmp.Or(opts.ConfirmWithin, 2*time.Second),
		recs:          map[Key]Record{},
		busy:          map[string]bool{},
		refusals:      map[string]refusalNote{},
		merged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "runtime", Name: "changes_total",
			Help: "Run-time replica set changes applied, by source: local (this proxy's admin API) or peer (another proxy).",
		}, []string{"source"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "runtime", Name: "refused_total",
			Help: "Run-time records from other proxies refused, by reason: future (its version is more than a minute ahead of this proxy's clock: the writer's clock is ahead, or the record is forged).",
		}, []string{"reason"}),
		records: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "keyway", Subsystem: "runtime", Name: "records",
			Help: "Replica sets with a run-time record (tombstones of deleted sets included).",
		}),
		persistE: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "runtime", Name: "persist_errors_total",
			Help: "Failed writes of the run-time state to the state directory (the state stays in memory and replicated).",
		}),
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.merged.WithLabelValues("local")
	r.merged.WithLabelValues("peer")
	r.refused.WithLabelValues(refusedFuture)
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{r.merged, r.refused, r.records, r.persistE} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	if r.dir != "" {
		if err := r.load(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *State) load() error {
	path := filepath.Join(r.dir, runtimeFileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("runtime.state_dir: reading %s: %w", path, err)
	}
	var f runtimeFile
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("runtime.state_dir: %s is not a keyway run-time state file: %w; move it away to start without it (run-time changes it held are then lost unless another proxy still has them)", path, err)
	}
	if f.Format != 1 {
		return fmt.Errorf("runtime.state_dir: %s has format %d; this keyway reads format 1", path, f.Format)
	}
	now := r.now()
	for _, rec := range f.Records {
		if rec.Key().wire() == "" {
			continue
		}
		// The file is this proxy's own: trusted, also ahead of the
		// clock (it was ahead, then stepped back). Said, though.
		if ms := aheadMS(rec.Version, now); tooFarAhead(rec.Version, now) {
			r.log.Error("the run-time state file holds a record ahead of this proxy's clock; it is kept, and writes after it take versions above it",
				zap.String("file", path), zap.String("set", rec.Set), zap.Stringer("kind", rec.Kind), zap.Uint64("version", rec.Version),
				zap.String("origin", rec.Origin), zap.String("ahead", describeAhead(ms)))
		}
		if old, ok := r.recs[rec.Key()]; !ok || rec.Newer(old) {
			r.recs[rec.Key()] = rec
		}
		r.clock = max(r.clock, rec.Version)
	}
	r.records.Set(float64(len(r.recs)))
	r.log.Info("run-time state loaded", zap.String("file", path), zap.Int("records", len(r.recs)))
	return nil
}

// Attach sets the gossip node the state goes through; its ID becomes the
// origin of this proxy's writes. The state goes to every other alive
// proxy by node name, the other process of this proxy (a binary upgrade)
// included: both must hold the same state.
func (r *State) Attach(n *membership.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.self, r.origin = n.Name, n.ID()
	r.sendFn = func(node string, msg []byte, reliable bool) error {
		if reliable {
			return n.SendReliable(node, msg)
		}
		return n.Send(node, msg)
	}
	n.Handle(runtimeDigestKind, membership.RoleProxy, r.handleDigest)
	n.Handle(runtimeRecordsKind, membership.RoleProxy, r.handleRecords)
	n.Handle(runtimeAckKind, membership.RoleProxy, r.handleAck)
	r.fleet = func() Peers { return fleetPeers(n.Members(), n.ID()) }
	r.proxies = func() []string {
		var out []string
		for _, m := range n.Members() {
			if m.Meta.Role == membership.RoleProxy && m.Status == membership.StatusAlive && !m.Self {
				out = append(out, m.Node)
			}
		}
		return out
	}
}

// selfName is the attached Node's name ("" before Attach); r.mu is held.
func (r *State) selfName() string {
	if r.self == nil {
		return ""
	}
	return r.self()
}

// Records returns every record, sorted by wire key ("orders",
// "restart:orders", "restart:users", "users"), as older versions sort.
func (r *State) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sortedLocked()
}

// Get returns the record of one kind of one set.
func (r *State) Get(kind Kind, set string) (Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.recs[Key{Kind: kind, Set: set}]
	return rec, ok
}

func (r *State) sortedLocked() []Record {
	out := make([]Record, 0, len(r.recs))
	for _, rec := range r.recs {
		out = append(out, rec)
	}
	// By wire key, as older versions sort: the digest covers the records
	// in this order, and must be equal on proxies of both versions.
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Key().wire(), b.Key().wire()) })
	return out
}

// Update writes the newest state of one record (a kind, a set): update
// builds it from the current record (ok false when there is none), under
// the lock that orders writes; an error from it refuses the write and is
// returned as is. The record takes the next version (above every version
// seen, see MaxAhead), this proxy as origin and the time; it is applied
// (OnChange), written to the state file and sent to every other alive
// proxy. Update returns it as stored.
func (r *State) Update(kind Kind, set string, update func(cur Record, ok bool) (Record, error)) (Record, error) {
	return r.update(Key{Kind: kind, Set: set}, update, nil)
}

// update is Update; stored, when not nil, is called with the record once
// it is stored and before it leaves (Write registers its wait there), and
// the record then asks its receivers for an acknowledgement.
func (r *State) update(key Key, update func(cur Record, ok bool) (Record, error), stored func(Record)) (Record, error) {
	kind, set := key.Kind, key.Set
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.mu.Lock()
	cur, ok := r.recs[key]
	rec, err := update(cur, ok)
	if err != nil {
		r.mu.Unlock()
		return Record{}, err
	}
	now := r.now()
	v, ok := nextVersion(now, r.clock)
	if !ok {
		r.mu.Unlock()
		return Record{}, fmt.Errorf("run-time state: no version is above %d, the highest seen (the state file holds a forged record); move runtime.state_dir's %s away and restart this proxy", r.clock, runtimeFileName)
	}
	r.clock = v
	rec.Kind, rec.Set, rec.Version, rec.Origin, rec.At = kind, set, v, cmp.Or(r.origin, "local"), now
	r.recs[key] = rec
	r.records.Set(float64(len(r.recs)))
	all := r.sortedLocked()
	r.mu.Unlock()
	r.merged.WithLabelValues("local").Inc()
	r.persist(all)
	if r.onChange != nil {
		r.onChange([]Record{rec}, all)
	}
	if stored != nil {
		stored(rec)
	}
	r.push([]Record{rec}, stored != nil)
	return rec, nil
}

// merge applies records from a peer (from, its gossip node): each that
// is newer than this proxy's record of its key replaces it, unless it is
// too far ahead of this proxy's clock (see MaxAhead): that one is refused,
// counted and logged. It returns how many replaced a record.
func (r *State) merge(from string, in []Record) int {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.mu.Lock()
	now := r.now()
	var changed, refused []Record
	for _, rec := range in {
		if rec.Key().wire() == "" {
			continue
		}
		if tooFarAhead(rec.Version, now) {
			refused = append(refused, rec)
			continue
		}
		r.clock = max(r.clock, rec.Version)
		if old, ok := r.recs[rec.Key()]; ok && !rec.Newer(old) {
			continue
		}
		r.recs[rec.Key()] = rec
		r.lostLocked(rec)
		changed = append(changed, rec)
	}
	r.synced = true
	r.records.Set(float64(len(r.recs)))
	all := r.sortedLocked()
	r.mu.Unlock()
	r.refuse(from, refused, now)
	if len(changed) == 0 {
		return 0
	}
	r.merged.WithLabelValues("peer").Add(float64(len(changed)))
	for _, rec := range changed {
		r.log.Info("run-time change learnt from another proxy", zap.String("from", from), zap.String("set", rec.Set), zap.Stringer("kind", rec.Kind),
			zap.String("action", rec.Action), zap.Uint64("version", rec.Version), zap.String("by", rec.By), zap.String("via", rec.Via))
	}
	r.persist(all)
	if r.onChange != nil {
		r.onChange(changed, all)
	}
	return len(changed)
}

// refusedFuture is the reason of a record refused for a version too far
// ahead (keyway_runtime_refused_total's label).
const refusedFuture = "future"

// maxRefusalNotes bounds the refusal notes kept before the old ones go.
const maxRefusalNotes = 256

// refusalNote is what refuse remembers of one origin's refusals through
// one sender.
type refusalNote struct {
	logged     time.Time
	suppressed int
}

// refuse counts the records of a peer refused at now, and logs them: at
// most one line a minute per origin and sender, saying how many were
// refused meanwhile.
func (r *State) refuse(from string, recs []Record, now time.Time) {
	if len(recs) == 0 {
		return
	}
	r.refused.WithLabelValues(refusedFuture).Add(float64(len(recs)))
	r.mu.Lock()
	if len(r.refusals) >= maxRefusalNotes {
		// Origins are whatever the records say: forget the quiet ones.
		maps.DeleteFunc(r.refusals, func(_ string, n refusalNote) bool { return now.Sub(n.logged) >= time.Minute })
	}
	r.mu.Unlock()
	for _, rec := range recs {
		key := rec.Origin + "\x00" + from
		r.mu.Lock()
		note := r.refusals[key]
		log := note.logged.IsZero() || now.Sub(note.logged) >= time.Minute
		if log {
			r.refusals[key] = refusalNote{logged: now}
		} else {
			note.suppressed++
			r.refusals[key] = note
		}
		r.mu.Unlock()
		if !log {
			continue
		}
		r.log.Error("run-time record refused: its version is more than "+MaxAhead.String()+" ahead of this proxy's clock; "+
			"the clock of the proxy that wrote it is ahead, or the record is forged",
			zap.String("origin", rec.Origin), zap.String("from", from), zap.String("set", rec.Set), zap.Stringer("kind", rec.Kind),
			zap.Uint64("version", rec.Version), zap.String("ahead", describeAhead(aheadMS(rec.Version, now))),
			zap.String("action", rec.Action), zap.String("by", rec.By), zap.Int("refused_since_last_logged", note.suppressed))
	}
}

// persist writes the state file (write, sync, rename). A failure is
// logged and counted: the state stays in memory and on the other proxies.
func (r *State) persist(all []Record) {
	if r.dir == "" {
		return
	}
	if err := writeFileAtomic(filepath.Join(r.dir, runtimeFileName), runtimeFile{Format: 1, Records: all}); err != nil {
		r.persistE.Inc()
		r.log.Error("run-time state not written to the state directory; it stays in memory and on the other proxies", zap.Error(err))
	}
}

func writeFileAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, append(b, '\n'))
}
