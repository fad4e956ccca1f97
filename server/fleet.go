package server

import (
	"fmt"
	"strings"
	"time"

	"keyway/balancer"

	"keyway/admin"
)

var _ admin.FleetSource = (*view)(nil)

// Fleet reports how this proxy's routing compares with the other
// proxies': the proxy's digests and the fleet's holds (proxy.FleetStatus),
// and the peers the fleet exchange hears from (membership.Fleet).
func (v *view) Fleet() admin.FleetStatus {
	now := time.Now()
	out := admin.FleetStatus{Share: v.n.cfg.Fleet.Share, Agree: true, Proxies: []admin.FleetProxy{}, Sets: []admin.FleetSet{}}
	if v.n.node != nil {
		out.Self, out.SelfNode = v.n.node.ID(), v.n.node.Name()
	}
	if v.n.disc != nil {
		out.Isolated, out.IsolatedSince = v.n.disc.Isolated()
		if !out.Isolated {
			out.IsolatedSince = time.Time{}
		}
	}
	if v.n.fleet != nil {
		for _, p := range v.n.fleet.Peers() {
			out.Proxies = append(out.Proxies, admin.FleetProxy{ID: p.ID, Node: p.Node, Nodes: p.Nodes, Admin: p.Admin, Heard: p.Heard})
		}
	}
	for _, fs := range v.n.p.FleetStatus() {
		set := admin.FleetSet{Set: fs.Set, Digest: fs.Digest, Agree: true, Held: []admin.FleetHeld{}, Peers: []admin.FleetPeerDigest{}}
		for _, h := range fs.Held {
			set.Held = append(set.Held, admin.FleetHeld{Replica: h.Replica, Voters: h.Voters, Since: h.Since})
		}
		for _, p := range fs.Peers {
			pd := admin.FleetPeerDigest{ID: p.ID, Digest: p.Digest, Agrees: p.Agrees}
			if !p.Agrees {
				set.Agree, out.Agree = false, false
				if !p.Since.IsZero() {
					pd.DisagreeingSince = p.Since
					pd.DisagreeingSeconds = now.Sub(p.Since).Round(time.Millisecond).Seconds()
				}
			}
			set.Peers = append(set.Peers, pd)
		}
		if !set.Agree {
			set.Why, set.Fix = v.disagreement(fs.Set, set.Held)
		}
		out.Sets = append(out.Sets, set)
	}
	return out
}

// disagreement explains why the other proxies route a set unlike this
// one, from what this proxy knows: the replicas it holds out on its own
// evidence, and the fleet's holds with a single voter.
func (v *view) disagreement(set string, held []admin.FleetHeld) (why, fix string) {
	solo := v.n.cfg.Fleet.SoloVoteMax
	heldBy := map[string][]string{}
	for _, h := range held {
		heldBy[h.Replica] = h.Voters
	}
	var reasons []string
	if r := v.n.p.Router(set); r != nil {
		for _, m := range r.Table().Members() {
			local := m.Excluded &^ balancer.ReasonFleet
			if m.InRotation || local == 0 {
				continue
			}
			voters := heldBy[m.Name]
			switch {
			case len(voters) == 0:
				reasons = append(reasons, fmt.Sprintf("this proxy holds %s out on its own evidence (%s), which the others do not share", m.Name, local))
			case len(voters) == 1 && solo > 0:
				reasons = append(reasons, fmt.Sprintf("only %s has evidence against %s (%s): the fleet follows one proxy's vote for %s (fleet.solo_vote_max), then that proxy keeps it out alone",
					voters[0], m.Name, local, solo))
			}
		}
	}
	if len(reasons) == 0 {
		return "the proxies see different ring members or rotations: a membership change still spreading (it settles within seconds), or a configuration that differs between them",
			"if it lasts, compare keyway status --set " + set + " on each proxy, and keyway route for a key"
	}
	return strings.Join(reasons, "; "),
		"expected while only this proxy sends the replica traffic (the others have no evidence of their own); fix or restart the replica, then keyway repair --set " + set + ", or send traffic through every proxy"
}
