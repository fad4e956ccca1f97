package server

import (
	"time"

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
		out.Sets = append(out.Sets, set)
	}
	return out
}
