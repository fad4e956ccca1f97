package runstate

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"keyway/membership"
)

// Confirmed writes. Records are last-writer-wins: two proxies that each
// check a version locally and write would both succeed locally, and one
// write would be lost without its caller knowing. So a write (Write)
// answers only once the fleet holds it:
//
//   - If-Match: a write may name the version it was made from (the
//     record's version a read returned, 0 when there was none); when that
//     is no longer this proxy's current version, the write is refused at
//     once (ConflictError, nothing written).
//   - Acknowledgements: the record goes to every other alive proxy asking
//     for an acknowledgement (runtime_records with ack): each answers
//     (runtime_ack) with the record it holds for that key after merging.
//     The write is confirmed when every alive proxy holds it, and lost
//     (ConflictError) as soon as one holds a record that wins over it,
//     or this proxy learns one: of two concurrent writes, the one whose
//     record loses the merge.
//   - A majority: a write is confirmed only when the proxies that hold it
//     are more than half of the proxies the fleet knows (alive, or dead
//     and not yet forgotten; a proxy that left is not counted), so that a
//     proxy on the minority side of a partition confirms nothing.
//   - The bound: what is not confirmed within Options.ConfirmWithin (2 s)
//     is unconfirmed (UnconfirmedError): the record is this proxy's and
//     goes on spreading, and may yet win or lose.
//
// Proxies of a version without acknowledgements (membership.Member.Legacy,
// during a rolling upgrade) are neither asked nor counted.

// runtimeAckKind is the wire kind of an acknowledgement.
const runtimeAckKind = "runtime_ack"

type runtimeAck struct {
	Kind string   `json:"kind"`
	Node string   `json:"node"`
	Acks []ackRec `json:"acks"`
}

// ackRec is what a proxy holds for one key after merging a record sent
// for acknowledgement: its version and origin, and the record itself
// when it is not the one sent (the winner of a conflict).
type ackRec struct {
	Key     string  `json:"key"`
	Version uint64  `json:"version"`
	Origin  string  `json:"origin"`
	Current *Record `json:"current,omitempty"`
}

// ConflictError refuses or loses a write: Current is the record that
// holds (Version 0 when there is none).
type ConflictError struct {
	Current Record
	// IfMatch is the version the write was made from, when it named one.
	IfMatch *uint64
	// Lost is set when the write was made and lost the merge to Current.
	Lost bool
}

func (e *ConflictError) Error() string {
	if e.Lost {
		return fmt.Sprintf("the write lost to a concurrent one: version %d (%s by %s via %s) holds; read the set again and retry if still wanted",
			e.Current.Version, cmpOr(e.Current.Action, "-"), cmpOr(e.Current.By, "-"), cmpOr(e.Current.Via, "-"))
	}
	return fmt.Sprintf("If-Match: version %d is no longer current: version %d (%s by %s via %s) holds; read the set again and retry if still wanted",
		derefOr(e.IfMatch), e.Current.Version, cmpOr(e.Current.Action, "-"), cmpOr(e.Current.By, "-"), cmpOr(e.Current.Via, "-"))
}

// UnconfirmedError is a write this proxy made that the fleet has not
// confirmed within the bound.
type UnconfirmedError struct {
	Record Record
	// Missing are the alive proxies (gossip node names) that did not
	// acknowledge it; Reached and Known count the proxies holding it
	// (this one included) and the proxies the fleet knows.
	Missing        []string
	Reached, Known int
}

func (e *UnconfirmedError) Error() string {
	if len(e.Missing) > 0 {
		return fmt.Sprintf("unconfirmed: version %d is written on this proxy but %s did not acknowledge it within the bound; it goes on spreading and may yet win or lose: read the set to learn",
			e.Record.Version, strings.Join(e.Missing, ", "))
	}
	return fmt.Sprintf("unconfirmed: version %d is written on this proxy, which reaches %d of the %d proxies the fleet knows (no majority: a partition?); it spreads when they are reached and may yet win or lose: read the set to learn",
		e.Record.Version, e.Reached, e.Known)
}

func cmpOr(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func derefOr(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// Peers is what a write needs to know of the fleet: the other alive
// proxies to ask (gossip node names, legacy ones left out), and how many
// proxies (by fleet ID, this one included) are alive and known.
type Peers struct {
	Ask          []string
	Alive, Known int
}

// pending is one write waiting for its confirmation.
type pending struct {
	rec    Record
	need   map[string]bool // nodes yet to acknowledge
	done   chan struct{}
	once   sync.Once
	winner *Record // set when lost
}

func (p *pending) finish() { p.once.Do(func() { close(p.done) }) }

// Write is Update that answers once the fleet holds the record (see the
// top of this file): ifMatch, when not nil, is the version the write was
// made from. It returns the record as stored and nil when confirmed, or a
// *ConflictError (refused before writing, or lost), or an
// *UnconfirmedError (written, not confirmed).
func (r *State) Write(ctx context.Context, kind Kind, set string, ifMatch *uint64, update func(cur Record, ok bool) (Record, error)) (Record, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	key := Key{Kind: kind, Set: set}
	peers := r.peers()
	var p *pending
	rec, err := r.update(key, func(cur Record, ok bool) (Record, error) {
		if ifMatch != nil && cur.Version != *ifMatch {
			return cur, &ConflictError{Current: cur, IfMatch: ifMatch}
		}
		return update(cur, ok)
	}, func(rec Record) {
		// Registered before the record leaves: no answer can beat it.
		p = &pending{rec: rec, need: map[string]bool{}, done: make(chan struct{})}
		for _, node := range peers.Ask {
			p.need[node] = true
		}
		if len(p.need) == 0 {
			p.finish()
		}
		r.mu.Lock()
		r.pending[key] = append(r.pending[key], p)
		r.mu.Unlock()
	})
	if err != nil {
		return Record{}, err
	}
	defer r.unregister(key, p)
	bound := time.NewTimer(r.confirmWithin)
	defer bound.Stop()
	resend := time.NewTicker(r.confirmWithin / 8)
	defer resend.Stop()
	for {
		select {
		case <-p.done:
			r.mu.Lock()
			winner := p.winner
			r.mu.Unlock()
			if winner != nil {
				return rec, &ConflictError{Current: *winner, IfMatch: ifMatch, Lost: true}
			}
			if peers.Alive*2 <= peers.Known {
				return rec, &UnconfirmedError{Record: rec, Reached: peers.Alive, Known: peers.Known}
			}
			return rec, nil
		case <-resend.C:
			r.askAck(p) // a lost datagram, either way
		case <-bound.C:
			r.mu.Lock()
			missing := slices.Sorted(func(yield func(string) bool) {
				for n := range p.need {
					if !yield(n) {
						return
					}
				}
			})
			winner := p.winner
			r.mu.Unlock()
			if winner != nil {
				return rec, &ConflictError{Current: *winner, IfMatch: ifMatch, Lost: true}
			}
			return rec, &UnconfirmedError{Record: rec, Missing: missing, Reached: peers.Alive, Known: peers.Known}
		case <-ctx.Done():
			return rec, &UnconfirmedError{Record: rec, Missing: []string{"(the caller went away)"}, Reached: peers.Alive, Known: peers.Known}
		}
	}
}

// askAck sends the pending record, asking for an acknowledgement, to the
// proxies that have not answered.
func (r *State) askAck(p *pending) {
	r.mu.Lock()
	targets := make([]string, 0, len(p.need))
	for n := range p.need {
		targets = append(targets, n)
	}
	r.mu.Unlock()
	for _, to := range targets {
		r.sendRecords(to, []Record{p.rec}, false, true)
	}
}

func (r *State) unregister(key Key, p *pending) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending[key] = slices.DeleteFunc(r.pending[key], func(q *pending) bool { return q == p })
	if len(r.pending[key]) == 0 {
		delete(r.pending, key)
	}
}

// lostLocked marks the writes pending for rec's key that rec beats as
// lost; r.mu is held.
func (r *State) lostLocked(rec Record) {
	for _, p := range r.pending[rec.Key()] {
		if rec.Newer(p.rec) && p.winner == nil {
			w := rec
			p.winner = &w
			p.finish()
		}
	}
}

// sendAcks answers a records message that asked for acknowledgements:
// what this proxy holds for each key now.
func (r *State) sendAcks(to string, in []Record) {
	r.mu.Lock()
	send, self := r.sendFn, r.selfName()
	ack := runtimeAck{Kind: runtimeAckKind, Node: self}
	for _, rec := range in {
		cur, ok := r.recs[rec.Key()]
		a := ackRec{Key: rec.Key().wire()}
		if ok {
			a.Version, a.Origin = cur.Version, cur.Origin
			if cur.Version != rec.Version || cur.Origin != rec.Origin {
				c := cur
				a.Current = &c
			}
		}
		ack.Acks = append(ack.Acks, a)
	}
	r.mu.Unlock()
	if send == nil {
		return
	}
	msg, err := json.Marshal(ack)
	if err != nil {
		return
	}
	if err := send(to, msg, len(msg) > membership.MaxPacket); err != nil {
		r.log.Debug("run-time acknowledgement not sent", zap.String("proxy", to), zap.Error(err))
	}
}

// handleAck takes another proxy's acknowledgements.
func (r *State) handleAck(m membership.Message) {
	var a runtimeAck
	if json.Unmarshal(m.Body, &a) != nil || m.From == "" {
		return
	}
	var winners []Record
	r.mu.Lock()
	for _, ack := range a.Acks {
		key := parseKey(ack.Key)
		for _, p := range r.pending[key] {
			switch {
			case ack.Version == p.rec.Version && ack.Origin == p.rec.Origin:
				delete(p.need, m.From)
				if len(p.need) == 0 {
					p.finish()
				}
			case ack.Current != nil && ack.Current.Key() == key && ack.Current.Newer(p.rec):
				winners = append(winners, *ack.Current)
			}
		}
	}
	r.mu.Unlock()
	if len(winners) > 0 {
		// The winner is merged here too (it is on its way anyway): the
		// merge marks the pending writes it beats as lost.
		r.merge(m.From, winners)
	}
}

// peers is the fleet as the attached node sees it now.
func (r *State) peers() Peers {
	r.mu.Lock()
	f := r.fleet
	r.mu.Unlock()
	if f == nil {
		return Peers{Alive: 1, Known: 1}
	}
	return f()
}

// fleetPeers reads the fleet from a member snapshot: the other alive
// proxies to ask (by node: the other process of this proxy during an
// upgrade holds the state too), and the proxies alive and known by fleet
// ID, this one (self) included. A proxy that left is not known; a dead one
// is until gossip forgets it. Legacy proxies (a version without
// acknowledgements) are neither asked nor counted.
func fleetPeers(ms []membership.Member, self string) Peers {
	alive, known := map[string]bool{self: true}, map[string]bool{self: true}
	var p Peers
	for _, m := range ms {
		if m.Meta.Role != membership.RoleProxy || m.Legacy {
			continue
		}
		switch m.Status {
		case membership.StatusAlive:
			alive[m.ID()], known[m.ID()] = true, true
			if !m.Self {
				p.Ask = append(p.Ask, m.Node)
			}
		case membership.StatusDead:
			known[m.ID()] = true
		}
	}
	p.Alive, p.Known = len(alive), len(known)
	return p
}
