package server

import (
	"errors"
	"fmt"
	"strings"

	"keyway/admin"
	"keyway/eventlog"
	"keyway/membership"
)

var _ admin.Repairer = (*view)(nil)

// Repair revives a replica set: it lifts this proxy's health holds on the
// set's replicas (passive ejections and supervision holds: a repaired
// replica must be allowed back at once) and, with gossip, tells the set's
// agents to restart replicas that gave up and the other proxies to lift
// their holds too (membership.Discovery.Repair). Audited as an
// admin_action.
func (v *view) Repair(set string) (admin.RepairResult, error) {
	if v.n.p.Router(set) == nil {
		return admin.RepairResult{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	res := admin.RepairResult{Set: set, Reset: v.n.liftHolds(set)}
	if v.n.disc != nil {
		r, err := v.n.disc.Repair(set)
		switch {
		case errors.Is(err, membership.ErrNotAdvertised):
			// Static replicas only: the local reset is the whole repair.
		case err != nil:
			return res, err
		default:
			res.Agents, res.Failed, res.Proxies = r.Agents, r.Failed, r.Proxies
		}
	}
	v.n.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{
		"action": "repair", "agents": res.Agents, "failed": res.Failed, "reset": res.Reset, "scope": admin.ScopeGossip,
	})
	return res, nil
}

// liftHolds ends this proxy's health holds (ejections, supervision
// holds) on every replica of set that has one, and returns their names.
func (n *ProxyNode) liftHolds(set string) []string {
	var reset []string
	for _, h := range n.hc.Snapshot(set) {
		if strings.Contains(h.Excluded, "failed") || strings.Contains(h.Excluded, "ejected") {
			n.hc.Reset(set, h.Replica)
			reset = append(reset, h.Replica)
		}
	}
	return reset
}

// repairedElsewhere is membership's OnRepair: another proxy's admin API
// repaired a set, so this proxy lifts its own holds too.
func (n *ProxyNode) repairedElsewhere(set, by string) {
	if n.p.Router(set) == nil {
		return
	}
	reset := n.liftHolds(set)
	n.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{"action": "repair", "by": by, "reset": reset, "scope": admin.ScopeGossip})
}
