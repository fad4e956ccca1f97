package server

import (
	"fmt"

	"keyway/admin"
	"keyway/balancer"
	"keyway/eventlog"
)

var _ admin.Drainer = (*view)(nil)

// Drain drains or undrains a replica for the operator (admin API). A
// replica with an agent is told through gossip (membership.Discovery.Drain
// owns that protocol): its advertised draining state takes it out of
// rotation on every proxy. A static replica has no agent: it is held
// out (balancer.ReasonAdmin) on this proxy only. Undrain also ends this
// proxy's supervision hold or ejection of the replica (health.Checker.Reset)
// and any local admin hold. Every call that succeeds records an
// admin_action audit event.
func (v *view) Drain(set, replica string, drain bool) (string, error) {
	r := v.n.p.Router(set)
	if r == nil {
		return "", fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	var rep *balancer.Member
	for _, m := range r.Table().Members() {
		if m.Name == replica {
			rep = &m
			break
		}
	}
	if rep == nil {
		return "", fmt.Errorf("%w %q", admin.ErrUnknownReplica, replica)
	}
	var scope string
	if rep.Source == "static" {
		scope = admin.ScopeThisProxy
		v.n.p.SetExcluded(set, replica, balancer.ReasonAdmin, drain)
	} else {
		if v.n.disc == nil {
			return "", fmt.Errorf("%w: gossip is off on this proxy", admin.ErrUnreachable)
		}
		if err := v.n.disc.Drain(set, replica, drain); err != nil {
			return "", fmt.Errorf("%w: %v", admin.ErrUnreachable, err)
		}
		scope = admin.ScopeGossip
		if !drain {
			v.n.p.SetExcluded(set, replica, balancer.ReasonAdmin, false)
		}
	}
	action := "undrain"
	if drain {
		action = "drain"
	}
	if !drain {
		v.n.hc.Reset(set, replica)
	}
	if v.n.audit != nil {
		v.n.audit.Record(eventlog.KindAdminAction, set, replica, map[string]any{"action": action, "scope": scope})
	}
	return scope, nil
}
