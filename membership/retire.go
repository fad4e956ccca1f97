package membership

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
)

// Retire is the user message that makes a replica leave for good while its
// agent keeps running: the replica's ordinal is beyond its set's count
// (a scale-in of a Kubernetes StatefulSet, by keyway or by anyone else).
// The agent drains the replica as at shutdown (draining, every proxy's
// report that nothing is in flight, drain.quiet, the drain probe), stops
// its supervised process, and advertises stopped with Meta.Remove; proxies
// then drop the replica from the ring at once, and its partitions go to
// their new owners, not to stand-ins. The agent stays stopped until it
// exits (its pod is deleted); a retired replica comes back only as a new
// agent. Proxies send it again, every second, to every alive agent of a
// retiring replica that does not advertise Remove yet.
type Retire struct {
	// Kind is always "retire".
	Kind    string `json:"kind"`
	Set     string `json:"set"`
	Replica string `json:"replica"`
	// Boot names the agent incarnation it is for; another one ignores it.
	Boot int64 `json:"boot,omitempty"`
	// By is the fleet ID of the proxy that sent it.
	By string `json:"by"`
}

// RetireKind is the kind of a Retire message.
const RetireKind = "retire"

// Encode returns the message bytes.
func (r Retire) Encode() []byte {
	r.Kind = RetireKind
	b, _ := json.Marshal(r)
	return b
}

// DecodeRetire parses a message written by Encode.
func DecodeRetire(b []byte) (Retire, error) {
	var r Retire
	if err := json.Unmarshal(b, &r); err != nil {
		return r, err
	}
	if r.Kind != RetireKind || r.Set == "" || r.Replica == "" {
		return r, errors.New("membership: not a retire command")
	}
	return r, nil
}

// retireResend is how often one agent is told again while it does not
// advertise Remove.
const retireResend = time.Second

// RetireFrom says which replicas of a set leave it for good: those named
// Prefix-N with N ≥ From (a StatefulSet's pods beyond its count). The zero
// value retires none.
type RetireFrom struct {
	Prefix string
	From   int
}

// Match reports whether replica is one that retires.
func (r RetireFrom) Match(replica string) bool {
	if r.Prefix == "" || len(replica) <= len(r.Prefix)+1 || replica[:len(r.Prefix)] != r.Prefix || replica[len(r.Prefix)] != '-' {
		return false
	}
	n, err := strconv.Atoi(replica[len(r.Prefix)+1:])
	return err == nil && n >= r.From && strconv.Itoa(n) == replica[len(r.Prefix)+1:]
}

// SetRetiring replaces the retiring replicas of every set (sets left out
// retire none). A replica that drop matches is dropped from its set's
// replica list as soon as it is stopped, failed, dead or gone (not only
// once it left advertising Remove): it is not coming back. The alive
// agents of the replicas named in tell are told to retire (Retire) until
// they advertise Remove.
func (d *Discovery) SetRetiring(drop map[string]RetireFrom, tell map[string][]string) {
	nextDrop := map[string]RetireFrom{}
	for set, r := range drop {
		if r.Prefix != "" {
			nextDrop[set] = r
		}
	}
	nextTell := map[string]map[string]bool{}
	for set, names := range tell {
		for _, n := range names {
			if nextTell[set] == nil {
				nextTell[set] = map[string]bool{}
			}
			nextTell[set][n] = true
		}
	}
	d.mu.Lock()
	changedDrop := !maps.Equal(d.retiring, nextDrop)
	changedTell := !maps.EqualFunc(d.retireTell, nextTell, maps.Equal)
	d.retiring, d.retireTell = nextDrop, nextTell
	d.mu.Unlock()
	if changedDrop {
		d.Resync()
	}
	if changedTell {
		d.tellRetiring()
	}
}

// Retiring reports whether replica of set is dropped once stopped, and
// whether its agent is told to retire (SetRetiring).
func (d *Discovery) Retiring(set, replica string) (drop, tell bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.retiring[set].Match(replica), d.retireTell[set][replica]
}

// dropRetiredLocked removes from bySet the retiring replicas that are
// stopped or down (dead, or left: a left one is listed as stopped).
// d.mu is held.
func (d *Discovery) dropRetiredLocked(bySet map[string][]balancer.Replica) {
	for set, rule := range d.retiring {
		reps, ok := bySet[set]
		if !ok {
			continue
		}
		bySet[set] = slices.DeleteFunc(reps, func(r balancer.Replica) bool {
			return rule.Match(r.Name) && (r.Down || r.State == balancer.StateStopped || r.State == balancer.StateFailed)
		})
	}
}

// tellRetiring sends Retire to every alive agent of a retiring replica
// that does not advertise Remove, at most every retireResend per agent.
func (d *Discovery) tellRetiring() {
	d.mu.Lock()
	send, self, ms := d.send, d.self, d.members
	if send == nil || len(d.retireTell) == 0 {
		d.mu.Unlock()
		return
	}
	now := d.now()
	var to []Member
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Status != StatusAlive || m.Meta.Remove || !d.retireTell[m.Meta.Set][m.Meta.Replica] {
			continue
		}
		if at, ok := d.retireSent[m.Node]; ok && now.Sub(at) < retireResend {
			continue
		}
		d.retireSent[m.Node] = now
		to = append(to, m)
	}
	for node := range d.retireSent {
		if !slices.ContainsFunc(ms, func(m Member) bool { return m.Node == node && m.Status == StatusAlive }) {
			delete(d.retireSent, node)
		}
	}
	d.mu.Unlock()
	for _, m := range to {
		err := send(m.Node, Retire{Set: m.Meta.Set, Replica: m.Meta.Replica, Boot: m.Meta.Boot, By: self}.Encode())
		if err != nil {
			d.log.Debug("retire command not sent", zap.String("node", m.Node), zap.Error(err))
		}
	}
}
