package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/eventlog"
	"keyway/kube"
	"keyway/kube/backend"
	"keyway/membership"
	"keyway/proxy"
)

// The Kubernetes backend (package kube/backend): a set that names a
// StatefulSet takes its declared count from the StatefulSet's
// spec.replicas, scales by writing it (a scale-in retires the leaving
// ordinals first, driven by the proxy holding the Lease), and has the
// pods as its jobs.

// needsKube reports whether the file has a set on a StatefulSet, or
// configures a kubeconfig (sets on StatefulSets may then be created at
// run time).
func needsKube(cfg config.Config) bool {
	if cfg.Kubernetes.Kubeconfig != "" {
		return true
	}
	for _, sc := range cfg.ReplicaSets {
		if sc.StatefulSet.Enabled() {
			return true
		}
	}
	return false
}

// newKube builds the node's Kubernetes backend; id is this proxy's fleet
// ID, its identity in the Lease.
func (n *ProxyNode) newKube(cfg config.Config, id string) (*backend.Controller, error) {
	return backend.New(backend.Options{
		Config: cfg.Kubernetes, Identity: id, Logger: n.log.Named("kubernetes"),
		OnChange: func() { go n.applyRuntime() },
		OnPods:   func() { go n.updateRetiring() },
		Replicas: n.gossipReplicas,
		Event: func(set string, fields map[string]any) {
			n.audit.Record(eventlog.KindStatefulSet, set, toString(fields["pod"]), fields)
		},
	})
}

// gossipReplicas is what gossip says of a set's replicas: for each name,
// whether an agent is alive, and whether the newest alive one retired.
func (n *ProxyNode) gossipReplicas(set string) map[string]backend.Replica {
	out := map[string]backend.Replica{}
	for _, m := range n.node.Members() {
		if m.Meta.Role != membership.RoleReplica || m.Meta.Set != set || m.Status != membership.StatusAlive {
			continue
		}
		cur, ok := out[m.Meta.Replica]
		if ok && cur.Boot > m.Meta.Boot {
			continue
		}
		out[m.Meta.Replica] = backend.Replica{Alive: true, Boot: m.Meta.Boot,
			Retired: m.Meta.State == balancer.StateStopped && m.Meta.Remove}
	}
	return out
}

// kubeSets names the sets on StatefulSets in eff.
func kubeSets(eff config.Config) map[string]kube.Ref {
	out := map[string]kube.Ref{}
	for _, sc := range eff.ReplicaSets {
		if sc.StatefulSet.Enabled() {
			out[sc.Name] = sc.StatefulSet
		}
	}
	return out
}

// overlayKube sets the declared count of every set on a StatefulSet whose
// state is known: the count a scale-in goes down to, else spec.replicas.
func (n *ProxyNode) overlayKube(eff *config.Config) {
	if n.kube == nil {
		return
	}
	for i, sc := range eff.ReplicaSets {
		if !sc.StatefulSet.Enabled() {
			continue
		}
		if st, ok := n.kube.State(sc.Name); ok && st.Found {
			eff.ReplicaSets[i].Replicas = max(st.Target, 1)
		}
	}
}

// applyKube tells the backend which sets to follow, and discovery which
// replicas retire. n.reloadMu is held.
func (n *ProxyNode) applyKube(eff config.Config) {
	if n.kube == nil {
		return
	}
	n.kube.Watch(kubeSets(eff))
	n.retiringLocked(eff)
}

// updateRetiring recomputes the retiring replicas (a pod changed).
func (n *ProxyNode) updateRetiring() {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	n.retiringLocked(n.eff)
}

// retiringLocked tells discovery, for each set on a StatefulSet, which
// replicas leave it for good: ordinals at or above the count are dropped
// once they stop; those a keyway scale-in is removing, and those whose
// pods are being deleted beyond the count (kubectl scale, an HPA), are
// told to retire, so that they drain as removals. n.reloadMu is held.
func (n *ProxyNode) retiringLocked(eff config.Config) {
	if n.kube == nil || n.disc == nil {
		return
	}
	drop := map[string]membership.RetireFrom{}
	tell := map[string][]string{}
	for set := range kubeSets(eff) {
		st, ok := n.kube.State(set)
		if !ok || !st.Found {
			continue
		}
		drop[set] = membership.RetireFrom{Prefix: st.Ref.Name, From: st.Target}
		for i := st.Target; i < st.Replicas; i++ {
			tell[set] = append(tell[set], st.Ref.Name+"-"+strconv.Itoa(i))
		}
		pods, err := n.kube.Pods(set)
		if err != nil {
			continue
		}
		for _, p := range pods {
			if p.Ordinal >= st.Replicas && p.Deleting {
				tell[set] = append(tell[set], p.Name)
			}
		}
	}
	n.disc.SetRetiring(drop, tell)
}

// kubeScale writes a set's count to its StatefulSet.
func (n *ProxyNode) kubeScale(ctx context.Context, set string, replicas int, ifMatch uint64) (prev int, err error) {
	if n.kube == nil {
		return 0, fmt.Errorf("set %s names a StatefulSet, but this proxy has no Kubernetes client (set kubernetes.kubeconfig, or run it in a pod)", set)
	}
	rv := ""
	if ifMatch != 0 {
		rv = strconv.FormatUint(ifMatch, 10)
	}
	prev, err = n.kube.Scale(ctx, set, replicas, rv)
	var c *backend.ConflictError
	if errors.As(err, &c) {
		cur := admin.RuntimeRecord{Set: set, Replicas: &c.Replicas}
		if v, perr := strconv.ParseUint(c.ResourceVersion, 10, 64); perr == nil {
			cur.Version = v
		}
		return prev, &admin.ConflictError{Message: c.Error(), Current: cur}
	}
	return prev, err
}

// isKubeSet returns the StatefulSet a set names, if any.
func (n *ProxyNode) isKubeSet(set string) (kube.Ref, bool) {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	for _, sc := range n.eff.ReplicaSets {
		if sc.Name == set && sc.StatefulSet.Enabled() {
			return sc.StatefulSet, true
		}
	}
	return kube.Ref{}, false
}

// kubeJobs lists a set's pods as its jobs.
func (n *ProxyNode) kubeJobs(set string, out *admin.JobsStatus) {
	st, _ := n.kube.State(set)
	holder, me := n.kube.Leader()
	out.Kubernetes = &admin.KubeStatus{StatefulSet: st.Ref.String(), Found: st.Found, Replicas: st.Replicas, Target: st.Target,
		Ready: st.Ready, ResourceVersion: st.ResourceVersion, ManagedByKeyway: st.ManagedByKeyway, Acting: holder, ActingHere: me}
	out.Wanted = st.Target
	pods, err := n.kube.Pods(set)
	if err != nil {
		out.Error = err.Error()
		return
	}
	members := map[string]balancer.Member{}
	if r := n.p.Router(set); r != nil {
		for _, m := range r.Table().Members() {
			members[m.Name] = m
		}
	}
	reps := n.gossipReplicas(set)
	now := time.Now()
	for _, p := range pods {
		j := admin.Job{Replica: p.Name, Ordinal: p.Ordinal, Pod: p.Name, PodPhase: p.Phase, PodReady: p.Ready, PodRestarts: p.Restarts,
			Node: p.Node, PodReason: p.Reason, PodCreated: p.Created, PodDeleting: p.Deleting, Since: p.Created,
			Restarts: p.Restarts, Retiring: p.Ordinal >= st.Target}
		if !p.Created.IsZero() {
			j.Age = now.Sub(p.Created).Round(time.Second).String()
		}
		switch {
		case p.Deleting:
			j.State = "stopping"
		case p.Failed():
			j.State = "failed"
		case p.Phase == "Running":
			j.State = "running"
		default:
			j.State = "starting"
		}
		if m, ok := members[p.Name]; ok {
			j.ReplicaState, j.Addr = m.State.String(), m.Addr
		}
		if r := reps[p.Name]; r.Retired {
			j.ReplicaState = "retired"
		}
		out.Jobs = append(out.Jobs, j)
	}
}

// kubeTemplate reads the StatefulSet template of a set created at run
// time (statefulset.template).
func (n *ProxyNode) kubeTemplate(sc proxy.SetConfig, raw []byte) (*appsv1.StatefulSet, error) {
	if n.kube == nil {
		return nil, &admin.SpecError{Problems: []string{"statefulset.template: this proxy has no Kubernetes client, so it cannot create the StatefulSet; set kubernetes.kubeconfig, or run keyway in a pod"}}
	}
	if !sc.StatefulSet.Enabled() {
		return nil, &admin.SpecError{Problems: []string{"statefulset.name: required with statefulset.template: the name of the StatefulSet to create"}}
	}
	tmpl, err := backend.ParseTemplate(sc.Name, sc.StatefulSet.WithNamespace(n.kube.Namespace()), raw)
	if err != nil {
		return nil, &admin.SpecError{Problems: strings.Split(err.Error(), "\n")}
	}
	return tmpl, nil
}

// kubeCreateError is the admin API's error for a set's objects that
// could not be created: one in the way is the caller's to fix (409).
func kubeCreateError(err error) error {
	if strings.HasPrefix(err.Error(), "statefulset") {
		return fmt.Errorf("%w: %v", admin.ErrObjectInTheWay, err)
	}
	return err
}
