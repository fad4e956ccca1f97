// Package query reads keyway's audit trail back: it filters events by
// set, kind, replica, time and key partition, and works out, from the
// ring and rotation events each run recorded, which replica owned and
// which took a partition at every moment, with the balancer's own code.
// Its sources are the object-storage layout (package eventlog/objstore),
// a directory holding that layout, and the proxies' local files
// (audit.dir); the admin API filters its in-memory events with the same
// code.
package query

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"keyway/balancer"
	"keyway/eventlog"
)

// Filter selects events. The zero Filter (with Partition -1) selects
// every event.
type Filter struct {
	// Sets keeps the events of these sets; empty: every set, and the
	// events of none.
	Sets []string
	// Kinds keeps these kinds; empty: every kind.
	Kinds []string
	// Replica keeps the events that name this replica, and the ring and
	// rotation changes that moved it in or out.
	Replica string
	// Partition, when ≥ 0, keeps what concerns that partition of the one
	// set of Sets: the ring and rotation changes that changed its owner
	// or the replica that took it, the events of the replicas that owned
	// or took it, and the events of the whole set. -1: no partition.
	Partition int
	// Key is like Partition, for the partition the key hashes to in each
	// ring recorded (the partition count is part of the ring's shape).
	Key string
	// Since and Until bound the events' times (zero: no bound); Until is
	// exclusive.
	Since, Until time.Time
}

// NoPartition is Filter.Partition when no partition is asked for.
const NoPartition = -1

// Validate says what is wrong with f, naming the field and the fix.
func (f Filter) Validate() error {
	var errs []error
	keyed := f.Partition >= 0 || f.Key != ""
	if f.Partition < NoPartition {
		errs = append(errs, fmt.Errorf("partition: %d is not a partition: give 0 or more", f.Partition))
	}
	if f.Partition >= 0 && f.Key != "" {
		errs = append(errs, errors.New("partition and key: give one of them (a key names its partition)"))
	}
	if keyed && len(f.Sets) != 1 {
		errs = append(errs, fmt.Errorf("set: a partition or a key is one set's: give exactly one set (got %d)", len(f.Sets)))
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		errs = append(errs, fmt.Errorf("until: %s is not after since (%s)", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339)))
	}
	return errors.Join(errs...)
}

// keyed reports whether f follows a partition.
func (f *Filter) keyed() bool { return f.Partition >= 0 || f.Key != "" }

// Placement says where a followed partition's keys went after an event:
// its ring owner, and the replica that took it (its pick: "" when none
// could). For the ring and rotation changes that moved it, WasOwner and
// WasPick say where they went before.
type Placement struct {
	Partition int    `json:"partition"`
	Owner     string `json:"owner"`
	Pick      string `json:"pick"`
	WasOwner  string `json:"was_owner,omitempty"`
	WasPick   string `json:"was_pick,omitempty"`
	// InForce marks the last ring or rotation change before Since, shown
	// for the placement in force when the window opens.
	InForce bool `json:"in_force,omitempty"`
	// Moved says the change moved the partition's owner or pick.
	Moved bool `json:"moved,omitempty"`
}

// Match is one event a Filter kept, with the stream (a run, or a node's
// files) it came from, and, when the filter follows a partition, the
// placement after it.
type Match struct {
	Event     eventlog.Event
	Stream    string
	Placement *Placement
}

// ring is what one stream last recorded of one set's ring.
type ring struct {
	known       bool
	fingerprint string
	members     []string
	rotation    []string
	failover    balancer.Failover
	part        int // the followed partition in this ring (-1: the key's cannot be worked out)
	owner, pick string
}

// Stream filters the events of one stream (a run of a set, or one node's
// files), which must come in the order they were written: it follows each
// set's ring through them. It also checks the events' sequence numbers
// (the "seq" the object-storage sink writes) and reports gaps. Not safe
// for concurrent use.
type Stream struct {
	f     *Filter
	name  string
	rings map[string]*ring
	// inForce is the last placement event before Since, held back until
	// the stream reaches the window: a run whose events stop before it
	// (it ended, or nothing happened) shows nothing, since its trail
	// cannot say which.
	inForce map[string]*Match
	seq     map[string]int64
	gaps    []string
	// Errors of placement (an unknown fingerprint): reported once each.
	errs map[string]bool
}

// NewStream starts filtering one stream's events; name identifies it in
// matches and gap reports.
func (f *Filter) NewStream(name string) *Stream {
	return &Stream{f: f, name: name, rings: map[string]*ring{}, inForce: map[string]*Match{}, seq: map[string]int64{}, errs: map[string]bool{}}
}

// Gaps lists the missing sequence numbers seen so far, as sentences.
func (s *Stream) Gaps() []string { return s.gaps }

// Problems lists the ring events whose placement could not be worked
// out (a ring of another keyway version), once each.
func (s *Stream) Problems() []string {
	var out []string
	for e := range s.errs {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// Add takes the stream's next event and returns what the filter keeps of
// it: nothing, the event, or (once a partition's window opens) the
// placement in force first and then the event.
func (s *Stream) Add(e eventlog.Event) []Match {
	s.checkSeq(e)
	f := s.f
	if len(f.Sets) > 0 && !slices.Contains(f.Sets, e.Set) {
		return nil
	}
	if !f.Until.IsZero() && !e.Time.Before(f.Until) {
		// Past the window: ring changes still update the state, for a
		// follower that widens nothing; nothing is kept.
		s.place(e)
		return nil
	}
	var pl *Placement
	moved, replicaMoved := false, false
	if isRingEvent(e.Kind) {
		pl, moved, replicaMoved = s.place(e)
	}
	before := !f.Since.IsZero() && e.Time.Before(f.Since)
	if before {
		if f.keyed() && pl != nil {
			s.inForce[e.Set] = &Match{Event: e, Stream: s.name, Placement: withInForce(pl)}
		}
		return nil
	}
	keep := s.keeps(e, pl, moved, replicaMoved)
	var out []Match
	if m := s.inForce[e.Set]; m != nil {
		delete(s.inForce, e.Set)
		out = append(out, *m)
	}
	if !keep {
		return out
	}
	if f.keyed() && pl == nil {
		if r := s.rings[e.Set]; r != nil && r.known {
			pl = &Placement{Partition: r.part, Owner: r.owner, Pick: r.pick}
		}
	}
	return append(out, Match{Event: e, Stream: s.name, Placement: pl})
}

func withInForce(p *Placement) *Placement {
	q := *p
	q.InForce, q.WasOwner, q.WasPick, q.Moved = true, "", "", false
	return &q
}

// keeps decides whether the filter keeps e (in the window). pl is the
// placement after a ring event (nil for others); moved says it moved the
// followed partition, replicaMoved that it moved the followed replica in
// or out of the ring or the rotation.
func (s *Stream) keeps(e eventlog.Event, pl *Placement, moved, replicaMoved bool) bool {
	f := s.f
	if len(f.Kinds) > 0 && !slices.Contains(f.Kinds, e.Kind) {
		return false
	}
	if f.Replica != "" && e.Replica != f.Replica && !replicaMoved && !namesReplica(e, f.Replica) {
		return false
	}
	if !f.keyed() {
		return true
	}
	if pl != nil {
		return moved
	}
	if e.Replica == "" {
		return true // the whole set's: a phase, a run-time change, an admin action
	}
	r := s.rings[e.Set]
	return r != nil && r.known && (e.Replica == r.owner || e.Replica == r.pick)
}

// namesReplica reports whether an event without a replica of its own
// names the replica in a field an operator would look for (an admin
// action's target, a scale-in's pods).
func namesReplica(e eventlog.Event, name string) bool {
	for _, k := range []string{"target", "replica_name", "replicas"} {
		switch v := e.Fields[k].(type) {
		case string:
			if v == name {
				return true
			}
		case []string:
			if slices.Contains(v, name) {
				return true
			}
		case []any:
			if slices.Contains(v, any(name)) {
				return true
			}
		}
	}
	return false
}

func isRingEvent(kind string) bool {
	return kind == eventlog.KindRingRebuild || kind == eventlog.KindRotationChange
}

// place folds a ring or rotation event into the set's ring, and returns
// the followed partition's placement after it (nil when the filter
// follows none, or the event is not one or records no ring), whether it
// moved, and whether the followed replica moved in or out.
func (s *Stream) place(e eventlog.Event) (pl *Placement, moved, replicaMoved bool) {
	if !isRingEvent(e.Kind) {
		return nil, false, false
	}
	fp, _ := e.Fields["fingerprint"].(string)
	members, okM := stringList(e.Fields["members"])
	rotation, okR := stringList(e.Fields["rotation"])
	if fp == "" || !okM || !okR {
		return nil, false, false // a trail of a keyway that did not record rings
	}
	failover := balancer.FailoverNext
	if v, _ := e.Fields["failover"].(string); v == balancer.FailoverStrict.String() {
		failover = balancer.FailoverStrict
	}
	r := s.rings[e.Set]
	if r == nil {
		r = &ring{}
		s.rings[e.Set] = r
	}
	if name := s.f.Replica; name != "" {
		replicaMoved = !r.known || slices.Contains(r.members, name) != slices.Contains(members, name) ||
			slices.Contains(r.rotation, name) != slices.Contains(rotation, name)
		replicaMoved = replicaMoved && (slices.Contains(members, name) || slices.Contains(r.members, name))
	}
	was := *r
	r.known, r.fingerprint, r.members, r.rotation, r.failover = true, fp, members, rotation, failover
	if !s.f.keyed() {
		return nil, false, replicaMoved
	}
	r.part = s.f.Partition
	if s.f.Key != "" {
		cfg, err := balancer.ParseFingerprint(fp)
		if err != nil {
			s.problem(e, err)
			r.part, r.owner, r.pick = -1, "", ""
			return nil, false, replicaMoved
		}
		r.part = int(balancer.HashString(s.f.Key) % uint64(cfg.Partitions))
	}
	p, err := balancer.PlaceRecorded(fp, members, rotation, failover, r.part)
	if err != nil {
		s.problem(e, err)
		r.owner, r.pick = "", ""
		return nil, false, replicaMoved
	}
	r.owner, r.pick = p.Owner, p.Pick
	pl = &Placement{Partition: r.part, Owner: p.Owner, Pick: p.Pick}
	moved = !was.known || was.owner != p.Owner || was.pick != p.Pick || was.part != r.part
	if moved && was.known {
		pl.WasOwner, pl.WasPick = was.owner, was.pick
	}
	pl.Moved = moved
	return pl, moved, replicaMoved
}

func (s *Stream) problem(e eventlog.Event, err error) {
	s.errs[fmt.Sprintf("%s: %s of set %s at %s: %v", s.name, e.Kind, e.Set, e.Time.Format(time.RFC3339Nano), err)] = true
}

// checkSeq notes a gap in the sequence numbers of a set's events.
func (s *Stream) checkSeq(e eventlog.Event) {
	n, ok := e.Fields["seq"].(int64)
	if !ok {
		return
	}
	last, seen := s.seq[e.Set]
	s.seq[e.Set] = n
	switch {
	case !seen && n > 1:
		s.gaps = append(s.gaps, fmt.Sprintf("%s: events 1 to %d of set %q are missing (their segments are gone or were never uploaded)", s.name, n-1, e.Set))
	case seen && n > last+1:
		s.gaps = append(s.gaps, fmt.Sprintf("%s: events %d to %d of set %q are missing (dropped by the sink, or a segment is gone)", s.name, last+1, n-1, e.Set))
	case seen && n <= last:
		s.gaps = append(s.gaps, fmt.Sprintf("%s: event %d of set %q comes again after %d (a segment read twice?)", s.name, n, e.Set, last))
	}
}

// stringList reads a list of strings from an event field: []string from
// memory, []any from a file.
func stringList(v any) ([]string, bool) {
	switch v := v.(type) {
	case []string:
		return v, true
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, ok := x.(string)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	}
	return nil, false
}

// PartitionOf returns the partition key hashes to in a ring of the given
// fingerprint.
func PartitionOf(fingerprint, key string) (int, error) {
	cfg, err := balancer.ParseFingerprint(fingerprint)
	if err != nil {
		return 0, err
	}
	return int(balancer.HashString(key) % uint64(cfg.Partitions)), nil
}

// Seq returns an event's sequence number within its run's set ("seq"),
// 0 when it has none.
func Seq(e eventlog.Event) int64 {
	n, _ := e.Fields["seq"].(int64)
	return n
}
