package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/eventlog"
	"keyway/kube/backend"
	"keyway/membership"
	"keyway/proxy"
	"keyway/runstate"
)

// Run-time changes of replica sets (admin.SetAdmin): create, change,
// stop, start, delete, clear. Each is a record of the fleet's run-time
// state (runstate.State), which every proxy applies over its own
// configuration file (config.ApplyRuntime): the run-time state wins, per
// set and per key it sets, until an operator clears it.

// setAdmin implements admin.SetAdmin for a proxy node.
type setAdmin struct{ n *ProxyNode }

var _ admin.SetAdmin = setAdmin{}

// via names this proxy in the records it writes: its fleet ID, the
// record's origin too.
func (n *ProxyNode) via() string {
	if n.node != nil {
		return n.node.ID()
	}
	return "local"
}

func (n *ProxyNode) scope() string {
	if n.node != nil {
		return admin.ScopeFleet
	}
	return admin.ScopeThisProxy
}

func (n *ProxyNode) change(rec runstate.Record) admin.SetChange {
	return admin.SetChange{Set: rec.Set, Action: rec.Action, Version: rec.Version, By: rec.By, Via: rec.Via, Scope: n.scope()}
}

// fileConfig returns the configuration file last applied.
func (n *ProxyNode) fileConfig() config.Config {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	return n.cur
}

func (s setAdmin) CreateSet(spec []byte, w admin.Write) (admin.SetChange, error) {
	n, who := s.n, w.Who
	spec, tmplRaw, err := backend.SplitTemplate(spec)
	if err != nil {
		return admin.SetChange{}, &admin.SpecError{Problems: []string{"request body: " + err.Error()}}
	}
	sc, err := config.DecodeSet("request body", spec)
	if err != nil {
		return admin.SetChange{}, specError(err)
	}
	var tmpl *appsv1.StatefulSet
	if tmplRaw != nil {
		if tmpl, err = n.kubeTemplate(sc, tmplRaw); err != nil {
			return admin.SetChange{}, err
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, bytes.TrimSpace(spec)); err != nil {
		return admin.SetChange{}, &admin.SpecError{Problems: []string{"request body: " + err.Error()}}
	}
	rec := runstate.Record{Spec: compact.Bytes(), Action: "create", By: who.String(), Via: n.via()}
	// Would this proxy serve it? The same rules a file's set meets (a
	// unique match, valid limits), checked before
	// anything is written: a refused set must not reach the fleet.
	trial := slices.DeleteFunc(n.rt.Records(), func(r runstate.Record) bool { return r.Kind == runstate.KindSet && r.Set == sc.Name })
	trialRec := rec
	trialRec.Set = sc.Name
	eff, probs := config.ApplyRuntime(n.fileConfig(), append(trial, trialRec))
	for _, p := range probs {
		if p.Set == sc.Name {
			return admin.SetChange{}, &admin.SpecError{Problems: strings.Split(p.Problem, "\n")}
		}
	}
	if err := n.p.CheckReload(eff.Config); err != nil {
		return admin.SetChange{}, &admin.SpecError{Problems: strings.Split(err.Error(), "\n")}
	}
	var created *backend.Created
	if tmpl != nil {
		if n.p.Router(sc.Name) != nil {
			return admin.SetChange{}, fmt.Errorf("%w: %q; change it with PATCH, or delete it first", admin.ErrSetExists, sc.Name)
		}
		if created, err = n.kube.Create(w.Ctx, sc.Name, tmpl); err != nil {
			return admin.SetChange{}, kubeCreateError(err)
		}
	}
	stored, err := n.rt.Write(w.Ctx, runstate.KindSet, sc.Name, w.IfMatch, func(cur runstate.Record, ok bool) (runstate.Record, error) {
		if n.p.Router(sc.Name) != nil {
			where := "the configuration file defines it"
			if ok && len(cur.Spec) > 0 {
				where = fmt.Sprintf("created at run time by %s via %s", cur.By, cur.Via)
			}
			return cur, fmt.Errorf("%w: %q (%s); change it with PATCH, or delete it first", admin.ErrSetExists, sc.Name, where)
		}
		if ok && !cur.Deleted && len(cur.Spec) > 0 {
			return cur, fmt.Errorf("%w: %q was created at run time by %s via %s but this proxy cannot serve it (GET /v1/runtime says why); delete it first", admin.ErrSetExists, sc.Name, cur.By, cur.Via)
		}
		return rec, nil
	})
	if err != nil {
		if created != nil {
			// The set was not created: neither are its objects.
			if uerr := created.Undo(context.WithoutCancel(w.Ctx)); uerr != nil {
				n.log.Error("a set's Kubernetes objects not deleted after its record was refused; delete them with kubectl",
					zap.String("set", sc.Name), zap.Strings("objects", created.Names()), zap.Error(uerr))
			}
		}
		return admin.SetChange{}, writeError(err)
	}
	out := n.change(stored)
	out.Replicas, out.Stopped = &sc.Replicas, &sc.Stopped
	if created != nil {
		out.Created = created.Names()
		r := int(*tmpl.Spec.Replicas)
		out.Replicas = &r
		n.audit.Record(eventlog.KindStatefulSet, sc.Name, "", map[string]any{"action": "create", "created": out.Created, "by": who.String()})
	}
	return out, nil
}

// writeError turns the run-time state's refusals of a write into the
// admin API's (409, 503); other errors pass as they are.
func writeError(err error) error {
	var c *runstate.ConflictError
	var u *runstate.UnconfirmedError
	switch {
	case errors.As(err, &c):
		return &admin.ConflictError{Message: c.Error(), Current: runtimeRecord(c.Current), Lost: c.Lost}
	case errors.As(err, &u):
		return &admin.UnconfirmedError{Message: u.Error(), Record: runtimeRecord(u.Record), Missing: u.Missing}
	}
	return err
}

// runtimeRecord is a set's record as the admin API shows it.
func runtimeRecord(r runstate.Record) admin.RuntimeRecord {
	return admin.RuntimeRecord{
		Set: r.Set, Version: r.Version, Origin: r.Origin, Action: r.Action, By: r.By, Via: r.Via, At: r.At,
		Deleted: r.Deleted, Spec: r.Spec, Stopped: r.Stopped, Replicas: r.Replicas,
	}
}

// specError turns a config problem list into an admin.SpecError.
func specError(err error) error {
	var ce *config.Error
	if errors.As(err, &ce) {
		probs := make([]string, len(ce.Problems))
		for i, p := range ce.Problems {
			probs[i] = p.String()
		}
		return &admin.SpecError{Problems: probs}
	}
	return &admin.SpecError{Problems: []string{err.Error()}}
}

func (s setAdmin) PatchSet(set string, p admin.SetPatch, w admin.Write) (admin.SetChange, error) {
	n, who := s.n, w.Who
	if n.p.Router(set) == nil {
		return admin.SetChange{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	var actions []string
	if p.Stop != nil {
		actions = append(actions, map[bool]string{true: "stop", false: "start"}[*p.Stop])
	}
	if _, ok := n.isKubeSet(set); ok && p.Replicas != nil {
		return s.kubePatch(set, p, w)
	}
	if p.Replicas != nil {
		actions = append(actions, "scale")
	}
	prev, wasStopped := 0, false
	for _, sc := range n.p.SetConfigs() {
		if sc.Name == set {
			prev, wasStopped = sc.Replicas, sc.Stopped
		}
	}
	stored, err := n.rt.Write(w.Ctx, runstate.KindSet, set, w.IfMatch, func(cur runstate.Record, ok bool) (runstate.Record, error) {
		if ok && cur.Deleted {
			return cur, fmt.Errorf("%w %q (deleted at run time)", admin.ErrUnknownSet, set)
		}
		next := cur
		if !ok {
			next = runstate.Record{}
		}
		if p.Stop != nil {
			next.Stopped = p.Stop
		}
		if p.Replicas != nil {
			next.Replicas = p.Replicas
		}
		next.Action, next.By, next.Via = strings.Join(actions, "+"), who.String(), n.via()
		return next, nil
	})
	if err != nil {
		return admin.SetChange{}, writeError(err)
	}
	out := n.change(stored)
	if p.Replicas != nil {
		out.Replicas, out.Previous = p.Replicas, &prev
	}
	stopped := wasStopped
	if p.Stop != nil {
		stopped = *p.Stop
	}
	out.Stopped = &stopped
	return out, nil
}

// inUse lists the replicas of a set that keep it from being deleted: a
// gossip replica that is starting, ready, recovering or draining and not
// down, and, unless the set is stopped, every static replica (keyway
// cannot stop those; a stopped set sends them nothing).
func inUse(t *balancer.Table[*proxy.Backend], stopped bool) []string {
	var out []string
	for _, m := range t.Members() {
		switch {
		case m.Source == "static" && !stopped:
			out = append(out, m.Name+" (static)")
		case m.Source == "static", m.Down:
		case m.State == balancer.StateStarting, m.State == balancer.StateReady,
			m.State == balancer.StateRecovering, m.State == balancer.StateDraining:
			out = append(out, m.Name+" ("+m.State.String()+")")
		}
	}
	return out
}

func (s setAdmin) DeleteSet(set string, w admin.Write) (admin.SetChange, error) {
	n, who := s.n, w.Who
	r := n.p.Router(set)
	if r == nil {
		return admin.SetChange{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	stopped := false
	for _, sc := range n.p.SetConfigs() {
		if sc.Name == set {
			stopped = sc.Stopped
		}
	}
	if busy := inUse(r.Table(), stopped); len(busy) > 0 {
		return admin.SetChange{}, &admin.InUseError{Set: set, Replicas: busy}
	}
	ref, onKube := n.isKubeSet(set)
	stored, err := n.rt.Write(w.Ctx, runstate.KindSet, set, w.IfMatch, func(cur runstate.Record, ok bool) (runstate.Record, error) {
		// The tombstone keeps a definition made at run time: its route
		// answers 410 Gone until the record is cleared (config.ApplyRuntime).
		return runstate.Record{Deleted: true, Spec: cur.Spec, Action: "delete", By: who.String(), Via: n.via()}, nil
	})
	if err != nil {
		return admin.SetChange{}, writeError(err)
	}
	out := n.change(stored)
	if onKube && n.kube != nil {
		// What keyway created for the set goes with it; a StatefulSet
		// someone else made stays.
		deleted, err := n.kube.DeleteOwned(w.Ctx, set, ref)
		out.Deleted = deleted
		if err != nil {
			return out, fmt.Errorf("set %s deleted, but its Kubernetes objects were not all: %w; delete them with kubectl", set, err)
		}
	}
	return out, nil
}

func (s setAdmin) ClearRuntime(set string, w admin.Write) (admin.SetChange, error) {
	n, who := s.n, w.Who
	if !balancer.ValidSetName(set) {
		return admin.SetChange{}, fmt.Errorf("%w %q: not a replica set name", admin.ErrNoRuntimeState, set)
	}
	stored, err := n.rt.Write(w.Ctx, runstate.KindSet, set, w.IfMatch, func(cur runstate.Record, ok bool) (runstate.Record, error) {
		if !ok || !cur.Overrides() {
			return cur, fmt.Errorf("%w %q: the configuration file alone decides about it", admin.ErrNoRuntimeState, set)
		}
		return runstate.Record{Action: "clear", By: who.String(), Via: n.via()}, nil
	})
	if err != nil {
		return admin.SetChange{}, writeError(err)
	}
	return n.change(stored), nil
}

func (s setAdmin) Runtime() admin.RuntimeStatus {
	n := s.n
	st := admin.RuntimeStatus{Digest: n.rt.Digest(), Synced: n.rt.Synced(), StateDir: n.cfg.Runtime.StateDir}
	for _, r := range n.rt.Records() {
		if r.Kind != runstate.KindSet {
			continue // a rolling restart's progress: GET …/restart shows it
		}
		st.Records = append(st.Records, runtimeRecord(r))
	}
	for _, p := range n.runtimeProblems() {
		st.Problems = append(st.Problems, admin.RuntimeProblem{Set: p.Set, Version: p.Version, Problem: p.Problem})
	}
	return st
}

func (s setAdmin) Export() ([]byte, error) {
	n := s.n
	sets := n.p.SetConfigs()
	b, err := yaml.Marshal(struct {
		ReplicaSets []proxy.SetConfig `yaml:"replica_sets"`
	}{sets})
	if err != nil {
		return nil, err
	}
	head := fmt.Sprintf(`# The replica sets proxy %s serves at %s: its configuration file with the
# fleet's run-time state applied (every key, defaults included). To make the
# file say the same: replace its replica_sets with these, reload every proxy,
# then hand each set back to the file: keyway runtime clear --set NAME.
`, n.via(), time.Now().UTC().Format(time.RFC3339))
	return append([]byte(head), b...), nil
}

// runtimeProblems returns the records this proxy could not apply.
func (n *ProxyNode) runtimeProblems() []config.RuntimeProblem {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	return slices.Clone(n.rtProbs)
}

// runtimeChanged is the run-time state's OnChange: it records each change
// in the audit trail (who issued it, through which proxy) and applies the
// state.
func (n *ProxyNode) runtimeChanged(changed, _ []runstate.Record) {
	sets := 0
	for _, r := range changed {
		if r.Kind != runstate.KindSet {
			continue // a rolling restart's progress: its own log lines and events
		}
		sets++
		fields := map[string]any{"action": r.Action, "version": r.Version, "origin": r.Origin, "by": r.By, "via": r.Via}
		if r.Deleted {
			fields["deleted"] = true
		}
		if len(r.Spec) > 0 {
			fields["spec"] = json.RawMessage(r.Spec)
		}
		if r.Stopped != nil {
			fields["stopped"] = *r.Stopped
		}
		if r.Replicas != nil {
			fields["replicas"] = *r.Replicas
		}
		n.audit.Record(eventlog.KindRuntimeChange, r.Set, "", fields)
		n.log.Info("run-time change applied", zap.String("set", r.Set), zap.String("action", r.Action), zap.Uint64("version", r.Version),
			zap.String("by", r.By), zap.String("via", r.Via))
	}
	if sets > 0 {
		n.applyRuntime()
	}
}

// applyRuntime applies the file and the run-time state as they are now.
func (n *ProxyNode) applyRuntime() {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	eff, probs := config.ApplyRuntime(n.cur, n.rt.Records())
	n.overlayKube(&eff)
	info, err := n.p.Reload(eff.Config)
	if err != nil {
		n.log.Error("run-time state not applied; this proxy keeps serving what it did", zap.Error(err))
		n.audit.Record(eventlog.KindRuntimeChange, "", "", map[string]any{"result": "failure", "error": err.Error()})
		return
	}
	n.applied(eff, probs, info, time.Millisecond)
}

// applied brings the rest of the node in line with a configuration the
// proxy has just applied (at a reload or a run-time change): discovery
// re-feeds added sets, the gossip metadata carries the new ring
// fingerprints (waiting up to wait for the broadcast), phases and agents
// learn which sets are stopped, and the views show it. n.reloadMu is held.
func (n *ProxyNode) applied(eff config.Config, probs []config.RuntimeProblem, info proxy.ReloadInfo, wait time.Duration) {
	for _, p := range probs {
		if !slices.Contains(n.rtProbs, p) {
			n.log.Error("a set created at run time cannot be served by this proxy; it is left out here", zap.String("set", p.Set),
				zap.Uint64("version", p.Version), zap.String("problem", p.Problem))
		}
	}
	n.rtProbs = probs
	n.eff = eff
	if n.disc != nil && (len(info.Added) > 0 || len(info.Removed) > 0) {
		n.disc.Resync()
	}
	if n.node != nil {
		fp := membership.FingerprintMeta(n.p.Fingerprints())
		if n.node.Meta().Fingerprint != fp {
			if err := n.node.UpdateMeta(func(m *membership.Meta) { m.Fingerprint = fp }, wait); err != nil && wait > time.Millisecond {
				n.log.Warn("gossip metadata not updated with the new ring fingerprints", zap.Error(err))
			}
		}
	}
	n.applyStops(eff)
	n.applyRunner(eff)
	n.applyKube(eff)
	n.view.setConfig(eff)
}

// applyStops tells the phases and the agents which sets are stopped.
func (n *ProxyNode) applyStops(eff config.Config) {
	wants := make(map[string]membership.SetWant, len(eff.ReplicaSets))
	for _, sc := range eff.ReplicaSets {
		n.phases.SetStopped(sc.Name, sc.Stopped)
		w := membership.SetWant{Stop: sc.Stopped}
		if r, ok := n.rt.Get(runstate.KindSet, sc.Name); ok {
			w.Version = r.Version
		}
		wants[sc.Name] = w
	}
	if n.disc != nil {
		n.disc.SetWants(wants)
	}
}

// setRuntime says how the run-time state changes a set ("" source for a
// set this proxy does not serve).
func (n *ProxyNode) setRuntime(set string) (source string, rt *admin.SetRuntime) {
	source = "file"
	r, ok := n.rt.Get(runstate.KindSet, set)
	if !ok || !r.Overrides() {
		return source, nil
	}
	rt = &admin.SetRuntime{Version: r.Version, Action: r.Action, By: r.By, Via: r.Via, At: r.At, Overrides: []string{}}
	if len(r.Spec) > 0 {
		source = "runtime"
		rt.Overrides = append(rt.Overrides, "definition")
	}
	if r.Stopped != nil {
		rt.Overrides = append(rt.Overrides, "stopped")
	}
	if r.Replicas != nil {
		rt.Overrides = append(rt.Overrides, "replicas")
	}
	return source, rt
}

// kubePatch changes a set on a StatefulSet: the count goes to the
// StatefulSet (the API server is the compare-and-set: If-Match is its
// resourceVersion), a stop or start to the run-time state as for any set.
func (s setAdmin) kubePatch(set string, p admin.SetPatch, w admin.Write) (admin.SetChange, error) {
	n := s.n
	var ifMatch uint64
	if w.IfMatch != nil {
		ifMatch = *w.IfMatch
	}
	prev, err := n.kubeScale(w.Ctx, set, *p.Replicas, ifMatch)
	if err != nil {
		return admin.SetChange{}, err
	}
	out := admin.SetChange{Set: set, Action: "scale", By: w.Who.String(), Via: n.via(), Scope: n.scope(), Replicas: p.Replicas, Previous: &prev}
	n.audit.Record(eventlog.KindAdminAction, set, "", map[string]any{"action": "scale", "replicas": *p.Replicas, "previous": prev,
		"by": w.Who.String(), "statefulset": true})
	if p.Stop != nil {
		p.Replicas = nil
		ch, err := s.PatchSet(set, p, w)
		if err != nil {
			return out, err
		}
		out.Action, out.Version, out.Stopped = "scale+"+ch.Action, ch.Version, ch.Stopped
	}
	return out, nil
}
