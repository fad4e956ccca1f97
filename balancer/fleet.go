package balancer

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// The fleet's shared view of rotation. Every proxy decides rotation from
// the replicas' own lifecycle states (gossip) plus its local evidence
// (health checks, refused connections). Local evidence alone splits the
// fleet: one proxy diverts a replica's keys, the others do not. So each
// proxy publishes its evidence as votes, and every proxy applies the same
// pure rule (FleetVerdict) to the same votes: the fleet diverts the same
// partitions together.

// SharedReasons are the local exclusion reasons a proxy publishes as votes:
// evidence from its data path and its probes. An operator's drain on one
// proxy (ReasonAdmin) is that proxy's business, and ReasonFleet is what
// the votes produce.
const SharedReasons = ReasonProbe | ReasonEjected | ReasonRefused | ReasonFailed

// FleetVote is one proxy's local evidence against one replica.
type FleetVote struct {
	Replica string
	// Reason is the local exclusion's reasons (a subset of SharedReasons).
	Reason Reason
	// Since is when the proxy that holds the vote started it, on the
	// receiver's clock (the sender says how long ago; the receiver
	// subtracts that from the time it received it).
	Since time.Time
}

// FleetSet is one proxy's view of one replica set: the digest of what
// decides its routing, its votes, and its vetoes: replicas others vote
// against that it exchanged with successfully, recently, and had no
// failure with since.
type FleetSet struct {
	Set    string
	Digest string
	Votes  []FleetVote
	Vetoes []string
	// Inflight is the proxy's requests in flight to each replica that has
	// any (absent means none), so that a drain can be watched fleet-wide.
	Inflight map[string]int64
}

// FleetPeer is what one proxy published last: its fleet ID and its sets.
type FleetPeer struct {
	// ID is the proxy's stable fleet ID (its voters are named by it).
	ID   string
	Sets []FleetSet
}

// FleetRules are the parameters of FleetVerdict. Every proxy of a fleet
// must use the same ones to reach the same verdict.
type FleetRules struct {
	// SoloVoteMax bounds how long the fleet follows a vote that no second
	// proxy backs: long enough for gossip to confirm a crash, short enough
	// that one proxy with a broken path cannot keep a healthy replica out
	// of the whole fleet. 0 means no bound.
	SoloVoteMax time.Duration
	// MaxShare is the largest share of a set's ring members the fleet may
	// hold out on votes, in (0, 1]: the replicas with the most voters (then
	// the oldest vote, then the name) come first. At least one may always
	// be held out when there are two ring members or more.
	MaxShare float64
}

// FleetExclusion is a replica the fleet holds out, and why.
type FleetExclusion struct {
	Replica string
	// Voters are the IDs of the proxies whose votes hold it out, sorted
	// (one vote per ID).
	Voters []string
	// Since is when the oldest of those votes started.
	Since time.Time
}

// FleetVerdict applies the fleet's rule to the votes and vetoes of every
// proxy for one set (this proxy's own included, as one of views) and
// returns the replicas the fleet holds out, sorted by name. ring lists the
// set's ring members: votes against others are ignored. A replica is held
// out when
//
//   - at least one proxy votes against it,
//   - no proxy vetoes it (a proxy that just exchanged with it
//     successfully: its path works, so the voter's may be the broken
//     one), and
//   - two proxies or more vote against it, or the single vote is younger
//     than rules.SoloVoteMax,
//
// within the rules.MaxShare cap. The rule is a pure function of its
// arguments: proxies that see the same views reach the same verdict.
func FleetVerdict(set string, ring []string, views []FleetPeer, now time.Time, rules FleetRules) []FleetExclusion {
	type tally struct {
		voters []string
		since  time.Time
		vetoed bool
	}
	byName := map[string]*tally{}
	get := func(name string) *tally {
		if _, on := slices.BinarySearch(ring, name); !on {
			return nil
		}
		t := byName[name]
		if t == nil {
			t = &tally{}
			byName[name] = t
		}
		return t
	}
	for _, v := range views {
		for _, fs := range v.Sets {
			if fs.Set != set {
				continue
			}
			for _, vote := range fs.Votes {
				if vote.Reason&SharedReasons == 0 {
					continue
				}
				if t := get(vote.Replica); t != nil {
					t.voters = append(t.voters, v.ID)
					if t.since.IsZero() || vote.Since.Before(t.since) {
						t.since = vote.Since
					}
				}
			}
			for _, name := range fs.Vetoes {
				if t := get(name); t != nil {
					t.vetoed = true
				}
			}
		}
	}
	var out []FleetExclusion
	for name, t := range byName {
		if len(t.voters) == 0 || t.vetoed {
			continue
		}
		slices.Sort(t.voters)
		t.voters = slices.Compact(t.voters)
		if len(t.voters) == 1 && rules.SoloVoteMax > 0 && now.Sub(t.since) >= rules.SoloVoteMax {
			continue
		}
		out = append(out, FleetExclusion{Replica: name, Voters: t.voters, Since: t.since})
	}
	// The cap: the best-backed exclusions first, deterministically.
	slices.SortFunc(out, func(a, b FleetExclusion) int {
		if c := cmp.Compare(len(b.Voters), len(a.Voters)); c != 0 {
			return c
		}
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return cmp.Compare(a.Replica, b.Replica)
	})
	if limit := fleetCap(len(ring), rules.MaxShare); len(out) > limit {
		out = out[:limit]
	}
	slices.SortFunc(out, func(a, b FleetExclusion) int { return cmp.Compare(a.Replica, b.Replica) })
	return out
}

// fleetCap is how many of n ring members the fleet may hold out.
func fleetCap(n int, share float64) int {
	if share <= 0 || share > 1 {
		share = 1
	}
	c := int(float64(n) * share)
	if c < 1 && n >= 2 {
		c = 1
	}
	return c
}

// Digest identifies what decides a set's routing on this table: the ring
// parameters (the fingerprint), the failover mode, the ring members in slot
// order and the members in rotation. Two proxies with equal digests send every key to
// the same replica; it is made from content only (no generation, no
// version), so proxies compare theirs across restarts and versions. It is
// computed when the table is built.
func (t *Table[B]) Digest() string { return t.digest }

// computeDigest hashes the table's placement inputs: 16 hex digits.
func (t *Table[B]) computeDigest() string {
	h := xxhash.New()
	_, _ = h.WriteString(t.hash.Fingerprint())
	_, _ = h.WriteString(t.failover.String())
	var n [4]byte
	for slot, r := range t.replicas {
		_, _ = h.Write([]byte{0})
		_, _ = h.WriteString(r.Name)
		binary.LittleEndian.PutUint32(n[:], uint32(slot))
		_, _ = h.Write(n[:])
		if t.inRotation[slot] {
			_, _ = h.Write([]byte{1})
		} else {
			_, _ = h.Write([]byte{2})
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// ParseReason is the inverse of Reason.String for the named reasons
// ("ejected+refused"); unknown names are ignored, "none" is 0.
func ParseReason(s string) Reason {
	var r Reason
	for _, part := range strings.Split(s, "+") {
		for _, n := range reasonNames {
			if n.name == part {
				r |= n.r
			}
		}
	}
	return r
}
