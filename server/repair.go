package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"keyway/admin"
	"keyway/balancer"
	"keyway/eventlog"
	"keyway/kube/backend"
	"keyway/membership"
)

var _ admin.Repairer = (*view)(nil)

// Repair revives a replica set: it lifts this proxy's health holds on the
// set's replicas (passive ejections and supervision holds: a repaired
// replica must be allowed back at once) and, with gossip, tells the set's
// agents to restart replicas that gave up and the other proxies to lift
// their holds too (membership.Discovery.Repair). Audited as an
// admin_action.
//
// It refuses at once (*admin.RefusedError), changing nothing, when it
// could do nothing (repairRefusal).
func (v *view) Repair(set string) (admin.RepairResult, error) {
	r := v.n.p.Router(set)
	if r == nil {
		return admin.RepairResult{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	pods := v.n.kubeRepairs(set, r.Table().Members())
	if len(pods) == 0 {
		if err := v.n.repairRefusal(set, r.Table().Members()); err != nil {
			return admin.RepairResult{}, err
		}
	}
	res := admin.RepairResult{Set: set, Reset: v.n.liftHolds(set), Pods: []string{}}
	for _, p := range pods {
		// The StatefulSet makes it again under the same name.
		if err := v.n.kube.DeletePod(context.Background(), set, p.Name, p.UID); err != nil {
			return res, fmt.Errorf("repair of %s: pod %s not deleted: %w", set, p.Name, err)
		}
		res.Pods = append(res.Pods, p.Name)
	}
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
	fields := map[string]any{"action": "repair", "agents": res.Agents, "failed": res.Failed, "reset": res.Reset, "scope": admin.ScopeGossip}
	if len(res.Pods) > 0 {
		fields["pods"] = res.Pods
	}
	v.n.audit.Record(eventlog.KindAdminAction, set, "", fields)
	return res, nil
}

// kubeRepairs returns the pods a repair of a set on a StatefulSet
// deletes: those in CrashLoopBackOff or Failed, and those of failed
// replicas whose agent supervises no process (or is gone). ms are the
// set's members on this proxy.
func (n *ProxyNode) kubeRepairs(set string, ms []balancer.Member) []backend.Pod {
	if n.kube == nil {
		return nil
	}
	if _, ok := n.isKubeSet(set); !ok {
		return nil
	}
	pods, err := n.kube.Pods(set)
	if err != nil {
		return nil
	}
	failed := map[string]bool{}
	metas := n.agentMetas(set)
	for _, m := range ms {
		if meta, ok := metas[m.Name]; m.State == balancer.StateFailed && (!ok || unsupervised(meta)) {
			failed[m.Name] = true
		}
	}
	var out []backend.Pod
	for _, p := range pods {
		if !p.Deleting && (p.Failed() || failed[p.Name]) {
			out = append(out, p)
		}
	}
	return out
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

// repairRefusal returns why a repair of set could do nothing, or nil. A
// repair restarts failed replicas whose agents supervise their process,
// and lifts health holds (this proxy's and, through gossip, the other
// proxies'). With ms the set's members on this proxy, it refuses when
//
//   - no replica is failed and every one is in rotation here: nothing to
//     repair (a hold elsewhere only is not seen: repair through that
//     proxy);
//   - the failed replicas' agents all supervise no process (or none is
//     alive), and every other replica is in rotation here.
func (n *ProxyNode) repairRefusal(set string, ms []balancer.Member) error {
	var failed, stuck, out []string
	var metas map[string]membership.Meta
	if n.node != nil {
		metas = n.agentMetas(set)
	}
	for _, m := range ms {
		switch {
		case m.State == balancer.StateFailed:
			failed = append(failed, m.Name)
			if meta, ok := metas[m.Name]; m.Source != "gossip" || !ok || unsupervised(meta) {
				stuck = append(stuck, m.Name)
			}
		case !m.InRotation:
			out = append(out, m.Name)
		}
	}
	if len(out) > 0 || len(stuck) < len(failed) {
		return nil
	}
	if len(failed) == 0 {
		reason := fmt.Sprintf("nothing to repair: no replica of %s is failed, and all %d are in rotation on this proxy", set, len(ms))
		if len(ms) == 0 {
			reason = fmt.Sprintf("nothing to repair: %s has no replicas on this proxy", set)
		}
		return &admin.RefusedError{Action: "repair", Set: set, Reason: reason,
			Fix: fmt.Sprintf("a repair restarts replicas that gave up (state failed) and lifts health holds; to restart running replicas, use keyway restart --set %s", set)}
	}
	slices.Sort(stuck)
	return &admin.RefusedError{Action: "repair", Set: set, Replicas: stuck,
		Reason: plural(stuck, strings.Join(stuck, ", ")+" failed, and its agent supervises no process (run without -- CMD) or is gone, so keyway cannot restart it",
			strings.Join(stuck, ", ")+" failed, and their agents supervise no process (run without -- CMD) or are gone, so keyway cannot restart them"),
		Fix: plural(stuck, "restart the replica yourself, or run its agent with -- CMD", "restart the replicas yourself, or run the agents with -- CMD")}
}
