package server

import (
	"fmt"

	"keyway/admin"
	"keyway/balancer"
)

func (v *view) Route(set, key string) (admin.RouteExplain, error) {
	r := v.n.p.Router(set)
	if r == nil {
		return admin.RouteExplain{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	t := r.Table()
	// The same hash as a header key (and as a path or query key, which
	// hash their decoded form with it).
	h := balancer.HashString(key)
	ex := admin.RouteExplain{
		Set: set, Key: key, Hash: fmt.Sprintf("%016x", h),
		Partition: t.Partition(h), Failover: t.Failover().String(),
		Fingerprint: t.Fingerprint(), Generation: t.Generation(),
		Candidates: []admin.RouteCandidate{},
	}
	if o := t.Owner(h); o >= 0 {
		ex.Owner = t.Replica(o).Name
	}
	pick, ok := t.Pick(h)
	if ok {
		ex.Pick = t.Replica(pick).Name
	}
	reached := false
	for i, slot := range t.Order(h) {
		rep := t.Replica(slot)
		c := admin.RouteCandidate{Name: rep.Name, Addr: rep.Addr, State: rep.State.String(), InRotation: t.InRotation(slot)}
		switch {
		case ok && slot == pick:
			c.Picked, reached = true, true
		case reached:
			// After the pick: never considered.
		case !c.InRotation:
			c.Skipped = outReason(balancer.Member{Replica: *rep, Slot: slot, Excluded: t.Excluded(slot)})
		case i > 0 && t.Failover() == balancer.FailoverStrict:
			c.Skipped = "failover strict: only the owner may take the key"
		default:
			c.Skipped = "not a candidate"
		}
		ex.Candidates = append(ex.Candidates, c)
	}
	return ex, nil
}
