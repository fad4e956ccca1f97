package runstate

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"keyway/membership"
)

// The run-time state of replica sets: what operators change through a
// proxy's admin API while keyway runs (a set created, deleted, stopped,
// started, its declared count changed), replicated to every proxy of the
// gossip cluster so that the fleet serves one catalog.
//
// It is a last-writer-wins map of one record per set. A write takes the
// next version of a Lamport clock (one more than the highest version this
// proxy has seen), and of two records of one set the higher (version,
// origin, time) wins on every proxy, whatever order they arrive in. Proxies
// compare a digest of their records every interval (one small UDP
// message to each other proxy); on a difference they send each other
// their records (TCP when large) and merge. So a proxy that restarts, or
// joins later, learns the state from any other within about one interval,
// and a write reaches every proxy alive then at once. Deleted sets stay as
// tombstones, so that a peer that missed the delete cannot bring the set
// back. With a state directory the records are also written to disk on
// every change (runtime.json, replaced atomically) and read at start: the
// state then survives a restart of every proxy.

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
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// State holds and replicates the run-time state. Build it with
// New, Attach a Node, route messages to HandleMessage, and Run it.
// Safe for concurrent use.
type State struct {
	log      *zap.Logger
	interval time.Duration
	dir      string
	onChange func(changed, all []Record)
	now      func() time.Time

	merged   *prometheus.CounterVec // source: local, peer
	records  prometheus.Gauge
	persistE prometheus.Counter

	applyMu sync.Mutex // one change applied (OnChange, the file) at a time, in order

	mu      sync.Mutex
	self    func() string // the attached Node's name (it changes with MoveTo): where peers reply
	origin  string        // the attached Node's ID: the origin of this proxy's writes
	recs    map[Key]Record
	clock   uint64 // the highest version seen
	synced  bool
	started time.Time
	busy    map[string]bool // peers with a reliable send in flight
	sends   sync.WaitGroup
	sendFn  func(node string, msg []byte, reliable bool) error
	proxies func() []string // the other alive proxies' node names
}

// The wire forms: a digest every interval, the records on a difference.
// Node is the sender's gossip node name as it declares it: proxies of
// older versions reply to it, so it is still written; this version
// replies to the authenticated sender (membership.Message.From) instead.
const (
	runtimeDigestKind  = "runtime_digest"
	runtimeRecordsKind = "runtime_records"
)

type runtimeDigest struct {
	Kind   string `json:"kind"`
	Node   string `json:"node"`
	Digest string `json:"digest"`
}

type runtimeRecords struct {
	Kind    string   `json:"kind"`
	Node    string   `json:"node"`
	Digest  string   `json:"digest"` // the sender's, over all its records
	Reply   bool     `json:"reply,omitempty"`
	Records []Record `json:"records"`
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
		log:      cmp.Or(opts.Logger, zap.NewNop()),
		interval: cmp.Or(opts.Interval, time.Second),
		dir:      opts.Dir,
		onChange: opts.OnChange,
		now:      opts.Now,
		recs:     map[Key]Record{},
		busy:     map[string]bool{},
		merged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyway", Subsystem: "runtime", Name: "changes_total",
			Help: "Run-time replica set changes applied, by source: local (this proxy's admin API) or peer (another proxy).",
		}, []string{"source"}),
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
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{r.merged, r.records, r.persistE} {
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
	for _, rec := range f.Records {
		if rec.Key().wire() == "" {
			continue
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

// Records returns every record, sorted by wire key (a set's record, then
// its restart's, before the next set's: "orders", "restart:orders",
// "users").
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

// Update writes a record's newest state, of one kind of one set: update
// builds it from the current record (ok false when there is none), under the lock that
// orders writes; an error from it refuses the write and is returned as
// is. The record takes the next version, this proxy as origin and the
// time; it is applied (OnChange), written to the state file and sent to
// every other alive proxy. Update returns it as stored.
func (r *State) Update(kind Kind, set string, update func(cur Record, ok bool) (Record, error)) (Record, error) {
	key := Key{Kind: kind, Set: set}
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.mu.Lock()
	cur, ok := r.recs[key]
	rec, err := update(cur, ok)
	if err != nil {
		r.mu.Unlock()
		return Record{}, err
	}
	r.clock++
	rec.Kind, rec.Set, rec.Version, rec.Origin, rec.At = kind, set, r.clock, cmp.Or(r.origin, "local"), r.now()
	r.recs[key] = rec
	r.records.Set(float64(len(r.recs)))
	all := r.sortedLocked()
	r.mu.Unlock()
	r.merged.WithLabelValues("local").Inc()
	r.persist(all)
	if r.onChange != nil {
		r.onChange([]Record{rec}, all)
	}
	r.push([]Record{rec})
	return rec, nil
}

// merge applies records from a peer: each that is newer than this proxy's
// record of its key replaces it. It returns how many did.
func (r *State) merge(from string, in []Record) int {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.mu.Lock()
	var changed []Record
	for _, rec := range in {
		if rec.Key().wire() == "" {
			continue
		}
		r.clock = max(r.clock, rec.Version)
		if old, ok := r.recs[rec.Key()]; ok && !rec.Newer(old) {
			continue
		}
		r.recs[rec.Key()] = rec
		changed = append(changed, rec)
	}
	r.synced = true
	r.records.Set(float64(len(r.recs)))
	all := r.sortedLocked()
	r.mu.Unlock()
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
	tmp, err := os.CreateTemp(filepath.Dir(path), ".runtime-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Synced reports whether this proxy has compared its state with another
// proxy's (and taken theirs), or waited 3 intervals without hearing one:
// until then a proxy that just started may not know the fleet's changes.
func (r *State) Synced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced || (!r.started.IsZero() && r.now().Sub(r.started) >= 3*r.interval)
}

// Digest returns a digest of every record's set, version, origin and
// time: two proxies with equal digests hold the same state.
func (r *State) Digest() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.digestLocked()
}

func (r *State) digestLocked() string {
	if len(r.recs) == 0 {
		return ""
	}
	h := sha256.New()
	for _, rec := range r.sortedLocked() {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%d\x00", rec.Key().wire(), rec.Version, rec.Origin, rec.At.UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// handle takes a message as the node's decoder would hand it over (for
// tests: Attach registers the handlers with the node).
func (r *State) handle(from string, msg []byte) {
	switch membership.MessageKind(msg) {
	case runtimeDigestKind:
		r.handleDigest(membership.Message{From: from, Kind: runtimeDigestKind, Body: msg})
	case runtimeRecordsKind:
		r.handleRecords(membership.Message{From: from, Kind: runtimeRecordsKind, Body: msg})
	}
}

// handleDigest compares another proxy's digest with this one's.
func (r *State) handleDigest(m membership.Message) {
	var d runtimeDigest
	if json.Unmarshal(m.Body, &d) != nil || m.From == "" {
		return
	}
	r.mu.Lock()
	mine := r.digestLocked()
	if mine == d.Digest {
		r.synced = true
	}
	r.mu.Unlock()
	if mine != d.Digest {
		r.sendAll(m.From, true)
	}
}

// handleRecords merges another proxy's records.
func (r *State) handleRecords(m membership.Message) {
	var rr runtimeRecords
	if json.Unmarshal(m.Body, &rr) != nil || m.From == "" {
		return
	}
	r.merge(m.From, rr.Records)
	if rr.Reply && r.Digest() != rr.Digest {
		// The sender lacks something of ours (or holds older records).
		r.sendAll(m.From, false)
	}
}

// Run sends the digest to every other alive proxy every interval until
// ctx is done.
func (r *State) Run(ctx context.Context) error {
	r.mu.Lock()
	r.started = r.now()
	r.mu.Unlock()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	defer r.sends.Wait()
	r.sendDigests()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.sendDigests()
		}
	}
}

func (r *State) sendDigests() {
	r.mu.Lock()
	send, self := r.sendFn, r.selfName()
	d := r.digestLocked()
	targets := r.aliveProxiesLocked()
	r.mu.Unlock()
	if send == nil {
		return
	}
	msg, _ := json.Marshal(runtimeDigest{Kind: runtimeDigestKind, Node: self, Digest: d})
	for _, name := range targets {
		if err := send(name, msg, false); err != nil {
			r.log.Debug("run-time digest not sent", zap.String("proxy", name), zap.Error(err))
		}
	}
}

func (r *State) aliveProxiesLocked() []string {
	if r.proxies == nil {
		return nil
	}
	return r.proxies()
}

// push sends new records to every other alive proxy now.
func (r *State) push(recs []Record) {
	r.mu.Lock()
	targets := r.aliveProxiesLocked()
	r.mu.Unlock()
	for _, name := range targets {
		r.send(name, recs, false)
	}
}

// sendAll sends every record to one proxy.
func (r *State) sendAll(to string, reply bool) {
	r.mu.Lock()
	all := r.sortedLocked()
	r.mu.Unlock()
	r.send(to, all, reply)
}

func (r *State) send(to string, recs []Record, reply bool) {
	r.mu.Lock()
	send, self := r.sendFn, r.selfName()
	d := r.digestLocked()
	r.mu.Unlock()
	if send == nil {
		return
	}
	msg, err := json.Marshal(runtimeRecords{Kind: runtimeRecordsKind, Node: self, Digest: d, Reply: reply, Records: recs})
	if err != nil {
		r.log.Error("run-time records not encoded", zap.Error(err))
		return
	}
	if len(msg) <= membership.MaxPacket {
		if err := send(to, msg, false); err != nil {
			r.log.Debug("run-time records not sent", zap.String("proxy", to), zap.Error(err))
		}
		return
	}
	r.mu.Lock()
	if r.busy[to] {
		r.mu.Unlock()
		return // one is on its way; the next digest repairs what it lacks
	}
	r.busy[to] = true
	r.mu.Unlock()
	r.sends.Go(func() {
		if err := send(to, msg, true); err != nil {
			r.log.Debug("run-time records not sent", zap.String("proxy", to), zap.Error(err))
		}
		r.mu.Lock()
		delete(r.busy, to)
		r.mu.Unlock()
	})
}
