package membership

import (
	"slices"
	"strings"
	"time"

	"keyway/balancer"
)

// A replica (set, replica name) may have several gossip members at once:
// each restart of its agent is a new incarnation with a new node name and
// a later Meta.Boot, and the older ones stay listed, dead or left, until
// membership forgets them, or alive for the seconds gossip takes to find
// a crashed one dead. incarnations is where the rules that pick among
// them live; nothing else compares replicas' boots. (A proxy's processes
// share its fleet ID the same way: the isolation rule's successors and
// the fleet exchange compare their boots.)

// incarnations indexes one member snapshot by replica (set, replica name),
// for the members with role replica that name both. Discovery builds one
// per snapshot it feeds; it is never changed after.
type incarnations map[[2]string]incarnation

// incarnation is what one snapshot says about one replica.
type incarnation struct {
	// listed is the member the replica list is built from (see
	// [ReplicasBySet]): the newest alive incarnation when there is one,
	// else the newest boot; of equal boots the first in snapshot order.
	listed Member
	// newest is the newest alive incarnation, valid when hasAlive: of the
	// alive members, the one with the highest boot; of equal boots the
	// first in snapshot order. An older incarnation that still looks alive
	// (it crashed a moment ago) does not count.
	newest   Member
	hasAlive bool
}

// indexIncarnations builds the index of ms in one pass.
func indexIncarnations(ms []Member) incarnations {
	idx := incarnations{}
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Meta.Set == "" || m.Meta.Replica == "" {
			continue
		}
		k := [2]string{m.Meta.Set, m.Meta.Replica}
		in, seen := idx[k]
		if !seen || m.Meta.Boot > in.listed.Meta.Boot ||
			(m.Meta.Boot == in.listed.Meta.Boot && m.Status == StatusAlive && in.listed.Status != StatusAlive) {
			in.listed = m
		}
		if m.Status == StatusAlive && (!in.hasAlive || m.Meta.Boot > in.newest.Meta.Boot) {
			in.newest, in.hasAlive = m, true
		}
		idx[k] = in
	}
	for k, in := range idx {
		if in.hasAlive {
			// An alive incarnation is listed over a dead one, whatever
			// boot the dead one advertised: a claim that went away never
			// locks the name.
			in.listed = in.newest
			idx[k] = in
		}
	}
	return idx
}

// newestAlive returns the newest alive incarnation of a replica; ok is
// false when no alive member advertises it.
func (idx incarnations) newestAlive(set, replica string) (m Member, ok bool) {
	in := idx[[2]string{set, replica}]
	return in.newest, in.hasAlive
}

// ReplicasBySet turns gossip members into each set's replica list for the
// Router. Of several members claiming one replica name, the newest alive
// one wins, else the newest boot. A dead member stays listed as Down
// (on the ring, out of rotation) until membership forgets it; a member
// that left advertising Remove is dropped at once; one that left without
// it (a restart) stays listed as stopped until forgotten.
func ReplicasBySet(ms []Member) map[string][]balancer.Replica {
	return indexIncarnations(ms).replicasBySet()
}

// replicasBySet is [ReplicasBySet] from the index.
func (idx incarnations) replicasBySet() map[string][]balancer.Replica {
	out := map[string][]balancer.Replica{}
	for k, in := range idx {
		m := in.listed
		r := balancer.Replica{
			Name: m.Meta.Replica, Addr: m.Meta.Addr, State: m.Meta.State,
			Weight: int(m.Meta.Weight), Zone: m.Meta.Zone, Source: "gossip", Boot: m.Meta.Boot,
		}
		switch m.Status {
		case StatusDead:
			r.Down = true
		case StatusLeft:
			if m.Meta.Remove {
				continue
			}
			r.State = balancer.StateStopped
		}
		out[k[0]] = append(out[k[0]], r)
	}
	for set := range out {
		slices.SortFunc(out[set], func(a, b balancer.Replica) int { return strings.Compare(a.Name, b.Name) })
	}
	return out
}

// A replica's name belongs to the member that claimed it first, while it
// is alive: a second alive claim at another address is refused (and
// alarmed), whatever boot it advertises. A compromised host of the set
// holds the set's key, so its claims verify; this rule keeps it from
// taking a live replica's keys. A claim at the holder's address is the
// same replica restarting (its newest boot wins, as before), and once the
// holder is dead or gone the next claim takes the name: a replica that
// crashed and came back at a new address waits for gossip to find the
// old incarnation dead. Two claims this node first saw alive within
// claimAmbiguity of each other (it joined and learnt both at once) are
// both refused until one is gone: which was first is not known here, and
// guessing could route the name to an impostor.

// conflicts returns the node names of the alive claims refused in ms,
// with the holder of each name.
func conflicts(ms []Member) map[string]Member {
	holders := map[[2]string]Member{}
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Status != StatusAlive || m.Meta.Set == "" || m.Meta.Replica == "" {
			continue
		}
		k := [2]string{m.Meta.Set, m.Meta.Replica}
		h, ok := holders[k]
		if !ok || m.Since.Before(h.Since) || m.Since.Equal(h.Since) && m.Node < h.Node {
			holders[k] = m
		}
	}
	var out map[string]Member
	for _, m := range ms {
		if m.Meta.Role != RoleReplica || m.Status != StatusAlive {
			continue
		}
		h := holders[[2]string{m.Meta.Set, m.Meta.Replica}]
		if h.Node != m.Node && h.Meta.Addr != m.Meta.Addr {
			if out == nil {
				out = map[string]Member{}
			}
			out[m.Node] = h
			if m.Since.Sub(h.Since) < claimAmbiguity {
				// Seen together (this node joined, or they came at once):
				// which came first is not known here, and neither is
				// believed until one is gone.
				out[h.Node] = m
			}
		}
	}
	return out
}

// claimAmbiguity is how close two claims to one replica name must have
// been first seen alive for neither to count as the first: a proxy that
// starts learns every member in one exchange.
const claimAmbiguity = time.Second
