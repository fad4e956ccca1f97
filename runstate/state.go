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
	"strings"
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

// Record is one replica set's run-time state. Fields left empty let
// the configuration file decide; a record with none set (Clear) hands the
// set back to the file.
type Record struct {
	// Set is the record's key: a replica set's name, or for a set's
	// rolling restart RestartKey + the set's name.
	Set string `json:"set"`
	// Version orders writes (a Lamport clock); Origin, the fleet ID of the
	// proxy that wrote it, breaks ties (see Newer).
	Version uint64 `json:"version"`
	Origin  string `json:"origin"`
	// Spec is the definition of a set created at run time: a JSON object
	// with the fields of one replica_sets entry of the configuration file.
	// Empty: the file defines the set.
	Spec json.RawMessage `json:"spec,omitempty"`
	// Deleted hides the set, whatever the file says.
	Deleted bool `json:"deleted,omitempty"`
	// Stopped, when set, overrides the set's stopped key.
	Stopped *bool `json:"stopped,omitempty"`
	// Replicas, when set, overrides the set's declared replica count.
	Replicas *int `json:"replicas,omitempty"`
	// Restart is the progress of a rolling restart (a record keyed
	// RestartKey + set), as the proxy running it writes it after every
	// step: another proxy takes it over from there if that proxy leaves.
	Restart json.RawMessage `json:"restart,omitempty"`
	// Action is the operator command that wrote this version: create,
	// delete, stop, start, scale or clear.
	Action string `json:"action"`
	// By says who issued it (the admin API caller), Via through which
	// proxy (its fleet ID), At when (the writer's clock).
	By  string    `json:"by,omitempty"`
	Via string    `json:"via,omitempty"`
	At  time.Time `json:"at"`
}

// RestartKey prefixes the key of a set's rolling restart record (':' is
// never part of a set name).
const RestartKey = "restart:"

// IsSet reports whether the record is a replica set's (not a restart's).
func (r Record) IsSet() bool { return !strings.HasPrefix(r.Set, RestartKey) }

// Newer reports whether r wins over o (both of one key): the higher
// version, then the higher origin, then the later time. Writes of one
// version and one origin come from the two processes of one proxy during
// a binary upgrade (one ID, one host, so one clock): the later wins.
func (r Record) Newer(o Record) bool {
	if r.Version != o.Version {
		return r.Version > o.Version
	}
	if r.Origin != o.Origin {
		return r.Origin > o.Origin
	}
	return r.At.After(o.At)
}

// Overrides reports whether the record changes anything the file says.
func (r Record) Overrides() bool {
	return len(r.Spec) > 0 || r.Deleted || r.Stopped != nil || r.Replicas != nil
}

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
	recs    map[string]Record
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
		recs:     map[string]Record{},
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
		if rec.Set == "" {
			continue
		}
		if old, ok := r.recs[rec.Set]; !ok || rec.Newer(old) {
			r.recs[rec.Set] = rec
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

// Records returns every record, sorted by set.
func (r *State) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sortedLocked()
}

// Get returns the record of one set.
func (r *State) Get(set string) (Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.recs[set]
	return rec, ok
}

func (r *State) sortedLocked() []Record {
	out := make([]Record, 0, len(r.recs))
	for _, rec := range r.recs {
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Set, b.Set) })
	return out
}

// Update writes a set's newest state: update builds it from the set's
// current record (ok false when there is none), under the lock that
// orders writes; an error from it refuses the write and is returned as
// is. The record takes the next version, this proxy as origin and the
// time; it is applied (OnChange), written to the state file and sent to
// every other alive proxy. Update returns it as stored.
func (r *State) Update(set string, update func(cur Record, ok bool) (Record, error)) (Record, error) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.mu.Lock()
	cur, ok := r.recs[set]
	rec, err := update(cur, ok)
	if err != nil {
		r.mu.Unlock()
		return Record{}, err
	}
	r.clock++
	rec.Set, rec.Version, rec.Origin, rec.At = set, r.clock, cmp.Or(r.origin, "local"), r.now()
	r.recs[set] = rec
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
// record of its set replaces it. It returns how many did.
func (r *State) merge(from string, in []Record) int {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.mu.Lock()
	var changed []Record
	for _, rec := range in {
		if rec.Set == "" {
			continue
		}
		r.clock = max(r.clock, rec.Version)
		if old, ok := r.recs[rec.Set]; ok && !rec.Newer(old) {
			continue
		}
		r.recs[rec.Set] = rec
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
		r.log.Info("run-time change learnt from another proxy", zap.String("from", from), zap.String("set", rec.Set),
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
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%d\x00", rec.Set, rec.Version, rec.Origin, rec.At.UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// HandleMessage takes another proxy's digest or records (a membership
// MessageHandler; other kinds are ignored).
func (r *State) HandleMessage(from string, msg []byte) {
	switch membership.MessageKind(msg) {
	case runtimeDigestKind:
		r.handleDigest(membership.Message{From: from, Body: msg})
	case runtimeRecordsKind:
		r.handleRecords(membership.Message{From: from, Body: msg})
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
