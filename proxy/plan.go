package proxy

import (
	"fmt"

	"keyway/balancer"
)

// Plan says what adding and removing ring members of a replica set would
// do to its partitions, starting from the set's current routing table (its
// ring members and hash config) and placing the proposed members with the
// Router's own ring construction (balancer.Table.Plan). It changes
// nothing. The plan is about the ring: who is in rotation right now is not
// part of it, and a replica that is known but not on the ring yet (never
// ready) may be named in add.
//
// The error wraps ErrUnknownSet for a set the proxy does not serve, or is a
// *balancer.PlanError (wrapping balancer.ErrBadPlan) for a change that
// cannot be planned. Safe for concurrent use; it builds one ring off the
// request path and changes no counter.
func (p *Proxy) Plan(set string, add, remove []string) (balancer.Plan, error) {
	rs := p.routes.Load().byName[set]
	if rs == nil {
		return balancer.Plan{}, fmt.Errorf("%w %q", ErrUnknownSet, set)
	}
	return rs.router.Table().Plan(add, remove)
}
