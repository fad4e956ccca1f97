// Package backend is keyway's Kubernetes backend, on client-go: it
// follows the StatefulSets that replica sets name (their spec.replicas is
// the set's declared count, their pods its jobs), writes their scale
// subresource with the StatefulSet's resourceVersion as the precondition,
// and elects, with a Lease, the one proxy that drives scale-ins: it
// retires the leaving ordinals (they drain and leave for good) before it
// lowers spec.replicas. Every proxy runs one Controller.
package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"keyway/kube"
)

// Replica is what the proxies know of one replica from gossip, for the
// acting proxy's decisions.
type Replica struct {
	// Alive is true while an agent of the replica is alive in gossip.
	Alive bool
	// Retired is true when that agent advertises stopped with Remove.
	Retired bool
	// Boot is the newest alive agent's boot time.
	Boot int64
}

// Options are a Controller's dependencies.
type Options struct {
	Config kube.Config
	// Identity names this proxy in the Lease (its fleet ID).
	Identity string
	Logger   *zap.Logger
	// Client overrides the client built from Config (tests).
	Client kubernetes.Interface
	// OnChange is called when a watched StatefulSet's count or scale-in
	// changed, or it appeared or went. It must not block.
	OnChange func()
	// OnPods is called when a pod of a watched namespace changed. It
	// must not block.
	OnPods func()
	// Replicas reports the gossip view of a set's replicas, by name.
	Replicas func(set string) map[string]Replica
	// Event records an audit event of the backend; fields["action"] says
	// what happened (scale_in, revive, delete_pod).
	Event func(set string, fields map[string]any)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// State is what the backend knows of a set's StatefulSet.
type State struct {
	Ref kube.Ref
	// Found is false while the StatefulSet is not there (or not synced).
	Found bool
	// Replicas is its spec.replicas; Target the count a keyway scale-in
	// in progress goes down to (Replicas when none is).
	Replicas, Target int
	// Ready is status.readyReplicas.
	Ready int
	// ResourceVersion is the StatefulSet's, the precondition of a write.
	ResourceVersion string
	// ManagedByKeyway is true when keyway created it.
	ManagedByKeyway bool
}

// Retiring reports the ordinals that leave: Target and above.
func (s State) Retiring() bool { return s.Found && s.Target < s.Replicas }

// Pod is one job of a set: one pod of its StatefulSet.
type Pod struct {
	Name     string
	Ordinal  int
	Phase    string
	Ready    bool
	Restarts int
	Node     string
	// Reason is why a container waits or ended badly
	// (CrashLoopBackOff, Error, …); "" when none does.
	Reason   string
	Created  time.Time
	Deleting bool
	UID      string
}

// ConflictError is a write refused because the StatefulSet changed since
// the version the caller (or keyway) read.
type ConflictError struct {
	Set             string
	ResourceVersion string // the current one, when known
	Replicas        int
	Err             error
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("the StatefulSet of set %s changed meanwhile (resourceVersion now %s, replicas %d): %v; read it again and retry", e.Set, e.ResourceVersion, e.Replicas, e.Err)
}

func (e *ConflictError) Unwrap() error { return e.Err }

// ErrNotFound is returned for a set whose StatefulSet does not exist.
var ErrNotFound = errors.New("StatefulSet not found")

// ErrUnknownSet is returned for a set that names no StatefulSet.
var ErrUnknownSet = errors.New("the set names no StatefulSet")

// Controller follows StatefulSets and drives their scale. Safe for
// concurrent use.
type Controller struct {
	cfg    kube.Config
	opts   Options
	log    *zap.Logger
	client kubernetes.Interface
	ns     string
	now    func() time.Time

	mu       sync.Mutex
	runCtx   context.Context
	sets     map[string]kube.Ref  // set → its StatefulSet, namespace resolved
	watchers map[string]*nsWatch  // by namespace
	last     map[string]State     // the states last reported by OnChange
	holder   string               // the Lease holder last seen
	leading  bool                 // this proxy holds the Lease
	scaleIns map[string]time.Time // set → when this leader began driving its scale-in
	// revived: set/pod → the boot of the retired agent whose pod this
	// leader deleted; that agent may still look alive in gossip for a
	// while, and the pod made again must not be deleted for it.
	revived map[string]int64
	kick    chan struct{}
}

// nsWatch is one namespace's informers.
type nsWatch struct {
	sts  cache.SharedIndexInformer
	pods cache.SharedIndexInformer
	stop context.CancelFunc
	f    informers.SharedInformerFactory
}

// New builds a Controller: its client, from Config unless Options gives
// one. It starts nothing; Run does.
func New(opts Options) (*Controller, error) {
	c := &Controller{cfg: opts.Config, opts: opts, log: opts.Logger, client: opts.Client, now: opts.Now,
		sets: map[string]kube.Ref{}, watchers: map[string]*nsWatch{}, last: map[string]State{}, scaleIns: map[string]time.Time{}, revived: map[string]int64{},
		kick: make(chan struct{}, 1)}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	// client-go logs through klog: into keyway's log, not stderr.
	RouteKlog(c.log.Named("klog"))
	if c.now == nil {
		c.now = time.Now
	}
	ns := opts.Config.Namespace
	if c.client == nil {
		rc, kubeNS, err := restConfig(opts.Config.Kubeconfig)
		if err != nil {
			return nil, err
		}
		rc.UserAgent = "keyway"
		cl, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		c.client = cl
		if ns == "" {
			ns = kubeNS
		}
	}
	if ns == "" {
		ns = "default"
	}
	c.ns = ns
	return c, nil
}

// restConfig loads the client configuration: the kubeconfig file named,
// else the pod's service account, else the default loading rules
// ($KUBECONFIG, ~/.kube/config). It returns the namespace it implies.
func restConfig(path string) (*rest.Config, string, error) {
	if path == "" {
		if rc, err := rest.InClusterConfig(); err == nil {
			ns := ""
			if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
				ns = strings.TrimSpace(string(b))
			}
			return rc, ns, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		where := "kubernetes.kubeconfig " + path
		if path == "" {
			where = "no kubernetes.kubeconfig, not in a pod, and $KUBECONFIG or ~/.kube/config"
		}
		return nil, "", fmt.Errorf("kubernetes client configuration (%s): %w; set kubernetes.kubeconfig to a kubeconfig file", where, err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		ns = ""
	}
	return rc, ns, nil
}

// Namespace is the default namespace: the sets' StatefulSets' unless
// they name one, and the Lease's.
func (c *Controller) Namespace() string { return c.ns }

// Client is the Kubernetes client.
func (c *Controller) Client() kubernetes.Interface { return c.client }

// Watch replaces the sets followed: set name → its StatefulSet.
func (c *Controller) Watch(sets map[string]kube.Ref) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := map[string]kube.Ref{}
	for set, r := range sets {
		next[set] = r.WithNamespace(c.ns)
	}
	c.sets = next
	if c.runCtx != nil {
		c.watchLocked()
	}
	c.kickLocked()
}

// watchLocked starts the informers of namespaces that sets need.
func (c *Controller) watchLocked() {
	for _, r := range c.sets {
		if _, ok := c.watchers[r.Namespace]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(c.runCtx)
		f := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithNamespace(r.Namespace))
		w := &nsWatch{sts: f.Apps().V1().StatefulSets().Informer(), pods: f.Core().V1().Pods().Informer(), stop: cancel, f: f}
		h := cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.changed() },
			UpdateFunc: func(any, any) { c.changed() },
			DeleteFunc: func(any) { c.changed() },
		}
		if _, err := w.sts.AddEventHandler(h); err != nil {
			c.log.Warn("StatefulSet watch handler not added", zap.Error(err))
		}
		if _, err := w.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { c.podChanged() }, UpdateFunc: func(any, any) { c.podChanged() }, DeleteFunc: func(any) { c.podChanged() },
		}); err != nil {
			c.log.Warn("pod watch handler not added", zap.Error(err))
		}
		f.Start(ctx.Done())
		c.watchers[r.Namespace] = w
		c.log.Info("following StatefulSets", zap.String("namespace", r.Namespace))
	}
}

// changed reports new StatefulSet states to OnChange, and wakes the
// acting proxy's loop.
func (c *Controller) changed() {
	c.mu.Lock()
	diff := false
	for set := range c.sets {
		st := c.stateLocked(set)
		if old, ok := c.last[set]; !ok || old.Found != st.Found || old.Replicas != st.Replicas || old.Target != st.Target {
			diff = true
		}
		c.last[set] = st
	}
	for set := range c.last {
		if _, ok := c.sets[set]; !ok {
			delete(c.last, set)
		}
	}
	c.kickLocked()
	c.mu.Unlock()
	if diff && c.opts.OnChange != nil {
		c.opts.OnChange()
	}
}

// podChanged wakes the acting proxy's loop and tells OnPods.
func (c *Controller) podChanged() {
	c.mu.Lock()
	c.kickLocked()
	c.mu.Unlock()
	if c.opts.OnPods != nil {
		c.opts.OnPods()
	}
}

func (c *Controller) kickLocked() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// State returns what the backend knows of set's StatefulSet.
func (c *Controller) State(set string) (State, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.sets[set]; !ok {
		return State{}, false
	}
	return c.stateLocked(set), true
}

func (c *Controller) stateLocked(set string) State {
	r := c.sets[set]
	st := State{Ref: r}
	sts := c.cachedLocked(r)
	if sts == nil {
		return st
	}
	return stateOf(r, sts)
}

// stateOf reads a StatefulSet's state.
func stateOf(r kube.Ref, sts *appsv1.StatefulSet) State {
	st := State{Ref: r, Found: true, Replicas: 1, ResourceVersion: sts.ResourceVersion, Ready: int(sts.Status.ReadyReplicas),
		ManagedByKeyway: sts.Labels[kube.LabelManagedBy] == kube.ManagedBy}
	if sts.Spec.Replicas != nil {
		st.Replicas = int(*sts.Spec.Replicas)
	}
	st.Target = st.Replicas
	if to, from, ok := parseScaleIn(sts.Annotations[kube.AnnotationScaleIn]); ok && from == st.Replicas && to < from {
		st.Target = to
	}
	return st
}

// parseScaleIn reads a scale-in annotation, "TO/FROM": the scale-in from
// spec.replicas FROM down to TO. Once spec.replicas is no longer FROM
// (keyway lowered it, or someone else wrote it since), it asks nothing.
func parseScaleIn(v string) (to, from int, ok bool) {
	a, b, found := strings.Cut(v, "/")
	if !found {
		return 0, 0, false
	}
	to, err1 := strconv.Atoi(a)
	from, err2 := strconv.Atoi(b)
	return to, from, err1 == nil && err2 == nil && to >= 0 && from >= 0
}

// Synced reports whether the informers of every followed namespace have
// listed what is there.
func (c *Controller) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.sets {
		w, ok := c.watchers[r.Namespace]
		if !ok || !w.sts.HasSynced() || !w.pods.HasSynced() {
			return false
		}
	}
	return true
}

func (c *Controller) cachedLocked(r kube.Ref) *appsv1.StatefulSet {
	w, ok := c.watchers[r.Namespace]
	if !ok {
		return nil
	}
	obj, ok, err := w.sts.GetStore().GetByKey(r.Namespace + "/" + r.Name)
	if err != nil || !ok {
		return nil
	}
	sts, _ := obj.(*appsv1.StatefulSet)
	return sts
}

// Pods lists a set's pods (from the watch), by ordinal.
func (c *Controller) Pods(set string) ([]Pod, error) {
	c.mu.Lock()
	r, ok := c.sets[set]
	if !ok {
		c.mu.Unlock()
		return nil, ErrUnknownSet
	}
	sts := c.cachedLocked(r)
	w := c.watchers[r.Namespace]
	c.mu.Unlock()
	if sts == nil || w == nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, r)
	}
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("StatefulSet %s: selector: %w", r, err)
	}
	var out []Pod
	for _, obj := range w.pods.GetStore().List() {
		p, ok := obj.(*corev1.Pod)
		if !ok || !sel.Matches(labels.Set(p.Labels)) || !ownedBy(p, sts) {
			continue
		}
		ord, ok := Ordinal(r.Name, p.Name)
		if !ok {
			continue
		}
		out = append(out, podOf(p, ord))
	}
	slices.SortFunc(out, func(a, b Pod) int { return a.Ordinal - b.Ordinal })
	return out, nil
}

func ownedBy(p *corev1.Pod, sts *appsv1.StatefulSet) bool {
	for _, o := range p.OwnerReferences {
		if o.UID == sts.UID {
			return true
		}
	}
	return false
}

func podOf(p *corev1.Pod, ord int) Pod {
	out := Pod{Name: p.Name, Ordinal: ord, Phase: string(p.Status.Phase), Node: p.Spec.NodeName,
		Created: p.CreationTimestamp.Time, Deleting: p.DeletionTimestamp != nil, UID: string(p.UID)}
	ready := false
	for _, cnd := range p.Status.Conditions {
		if cnd.Type == corev1.PodReady && cnd.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	out.Ready = ready
	for _, cs := range p.Status.ContainerStatuses {
		out.Restarts += int(cs.RestartCount)
		switch {
		case cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff":
			out.Reason = cs.State.Waiting.Reason // the one that asks for a repair wins
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "" && cs.State.Waiting.Reason != "ContainerCreating" && out.Reason == "":
			out.Reason = cs.State.Waiting.Reason
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0 && out.Reason == "":
			out.Reason = cs.State.Terminated.Reason
		}
	}
	if out.Reason == "" && p.Status.Phase == corev1.PodFailed {
		out.Reason = p.Status.Reason
		if out.Reason == "" {
			out.Reason = "Failed"
		}
	}
	return out
}

// Ordinal parses a StatefulSet pod's ordinal from its name.
func Ordinal(sts, pod string) (int, bool) {
	rest, ok := strings.CutPrefix(pod, sts+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return 0, false
	}
	return n, true
}

// Failed reports whether a pod needs a repair: a container in
// CrashLoopBackOff, or the pod Failed.
func (p Pod) Failed() bool {
	return p.Reason == "CrashLoopBackOff" || p.Phase == string(corev1.PodFailed)
}

// Scale sets a set's count. A scale-out (or no change) writes the scale
// subresource at once. A scale-in marks the StatefulSet with the target
// (AnnotationScaleIn): the acting proxy retires the leaving ordinals, then
// lowers spec.replicas. Each write carries the StatefulSet's
// resourceVersion as read (ifMatch, when given, must be it): a change
// meanwhile is a *ConflictError. prev is the count before.
func (c *Controller) Scale(ctx context.Context, set string, n int, ifMatch string) (prev int, err error) {
	// Without If-Match, a conflict with a write that is not a count (the
	// controller's status updates move resourceVersion too) is read
	// again and retried: the count decided from a fresh read.
	for range 5 {
		prev, err = c.scaleOnce(ctx, set, n, ifMatch)
		var ce *ConflictError
		if ifMatch != "" || !errors.As(err, &ce) {
			return prev, err
		}
	}
	return prev, err
}

func (c *Controller) scaleOnce(ctx context.Context, set string, n int, ifMatch string) (prev int, err error) {
	c.mu.Lock()
	r, ok := c.sets[set]
	c.mu.Unlock()
	if !ok {
		return 0, ErrUnknownSet
	}
	sts, err := c.client.AppsV1().StatefulSets(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("%w: %s", ErrNotFound, r)
	}
	if err != nil {
		return 0, fmt.Errorf("StatefulSet %s: %w", r, err)
	}
	st := stateOf(r, sts)
	if ifMatch != "" && ifMatch != st.ResourceVersion {
		return st.Target, &ConflictError{Set: set, ResourceVersion: st.ResourceVersion, Replicas: st.Target,
			Err: fmt.Errorf("If-Match %s", ifMatch)}
	}
	prev = st.Target
	conflict := func(err error) error {
		if apierrors.IsConflict(err) {
			return &ConflictError{Set: set, ResourceVersion: st.ResourceVersion, Replicas: st.Target, Err: err}
		}
		return fmt.Errorf("StatefulSet %s: %w", r, err)
	}
	if n < st.Replicas {
		if err := c.annotate(ctx, r, st.ResourceVersion, strconv.Itoa(n)+"/"+strconv.Itoa(st.Replicas)); err != nil {
			return prev, conflict(err)
		}
		c.event(set, "scale_in", map[string]any{"from": st.Replicas, "to": n, "statefulset": r.String(), "step": "asked"})
		return prev, nil
	}
	rv := st.ResourceVersion
	if st.Retiring() || sts.Annotations[kube.AnnotationScaleIn] != "" {
		// A scale-out cancels the scale-in: the acting proxy revives the
		// ordinals it retired below the new count.
		patched, err := c.annotated(ctx, r, rv, "")
		if err != nil {
			return prev, conflict(err)
		}
		rv = patched.ResourceVersion
	}
	if n != st.Replicas {
		if err := c.writeScale(ctx, r, n, rv); err != nil {
			return prev, conflict(err)
		}
	}
	return prev, nil
}

// writeScale writes spec.replicas through the scale subresource, with rv
// as the precondition.
func (c *Controller) writeScale(ctx context.Context, r kube.Ref, n int, rv string) error {
	sc := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, ResourceVersion: rv},
		Spec:       autoscalingv1.ScaleSpec{Replicas: int32(n)},
	}
	_, err := c.client.AppsV1().StatefulSets(r.Namespace).UpdateScale(ctx, r.Name, sc, metav1.UpdateOptions{FieldManager: "keyway"})
	return err
}

// annotate sets (value "" removes) the scale-in annotation, with rv as
// the precondition.
func (c *Controller) annotate(ctx context.Context, r kube.Ref, rv, value string) error {
	_, err := c.annotated(ctx, r, rv, value)
	return err
}

func (c *Controller) annotated(ctx context.Context, r kube.Ref, rv, value string) (*appsv1.StatefulSet, error) {
	var v any = value
	if value == "" {
		v = nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": rv,
		"annotations":     map[string]any{kube.AnnotationScaleIn: v},
	}})
	return c.client.AppsV1().StatefulSets(r.Namespace).Patch(ctx, r.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "keyway"})
}

// DeletePod deletes one of set's pods (its StatefulSet makes it again,
// under the same name), if it is still the pod with uid ("" any).
func (c *Controller) DeletePod(ctx context.Context, set, pod, uid string) error {
	c.mu.Lock()
	r, ok := c.sets[set]
	c.mu.Unlock()
	if !ok {
		return ErrUnknownSet
	}
	opts := metav1.DeleteOptions{}
	if uid != "" {
		u := types.UID(uid)
		opts.Preconditions = &metav1.Preconditions{UID: &u}
	}
	err := c.client.CoreV1().Pods(r.Namespace).Delete(ctx, pod, opts)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Leader returns the Lease holder last seen, and whether it is this
// proxy.
func (c *Controller) Leader() (holder string, me bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holder, c.leading
}

// Run follows the StatefulSets and takes part in the election until ctx
// ends; while this proxy holds the Lease it drives scale-ins.
func (c *Controller) Run(ctx context.Context) error {
	c.mu.Lock()
	c.runCtx = ctx
	c.watchLocked()
	c.mu.Unlock()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.ns, Name: c.cfg.Lease},
		Client:     c.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.opts.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: c.cfg.LeaseDuration, RenewDeadline: c.cfg.RenewDeadline, RetryPeriod: c.cfg.RetryPeriod,
			ReleaseOnCancel: true, Name: c.cfg.Lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: c.lead,
				OnStoppedLeading: func() {
					c.mu.Lock()
					c.leading = false
					c.mu.Unlock()
					c.log.Info("this proxy no longer acts for the Kubernetes sets", zap.String("lease", c.ns+"/"+c.cfg.Lease))
				},
				OnNewLeader: func(id string) {
					c.mu.Lock()
					c.holder = id
					c.mu.Unlock()
					c.log.Info("acting proxy for the Kubernetes sets", zap.String("holder", id), zap.Bool("self", id == c.opts.Identity))
				},
			},
		})
		if err != nil {
			return fmt.Errorf("kubernetes leader election: %w", err)
		}
		le.Run(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(c.cfg.RetryPeriod):
		}
	}
	c.mu.Lock()
	ws := slices.Collect(maps.Values(c.watchers))
	c.mu.Unlock()
	for _, w := range ws {
		w.stop()
		w.f.Shutdown() // waits for the informers' goroutines
	}
	return nil
}

// lead is the acting proxy's loop: it reconciles every set at each change
// and every second, until ctx (the leadership) ends.
func (c *Controller) lead(ctx context.Context) {
	c.mu.Lock()
	c.leading = true
	c.scaleIns = map[string]time.Time{}
	c.revived = map[string]int64{}
	c.mu.Unlock()
	c.log.Info("this proxy acts for the Kubernetes sets", zap.String("lease", c.ns+"/"+c.cfg.Lease))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		c.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-tick.C:
		}
	}
}

// reconcile drives each set's scale-in one step on.
func (c *Controller) reconcile(ctx context.Context) {
	c.mu.Lock()
	sets := maps.Clone(c.sets)
	c.mu.Unlock()
	for _, set := range slices.Sorted(maps.Keys(sets)) {
		if ctx.Err() != nil {
			return
		}
		st, _ := c.State(set)
		if !st.Found {
			continue
		}
		c.reviveBelow(ctx, set, st)
		if !st.Retiring() {
			c.mu.Lock()
			delete(c.scaleIns, set)
			c.mu.Unlock()
			continue
		}
		c.driveScaleIn(ctx, set, st)
	}
}

// driveScaleIn lowers spec.replicas to the target once every leaving
// ordinal has retired (or retire_timeout has passed).
func (c *Controller) driveScaleIn(ctx context.Context, set string, st State) {
	c.mu.Lock()
	began, ok := c.scaleIns[set]
	if !ok {
		began = c.now()
		c.scaleIns[set] = began
	}
	c.mu.Unlock()
	reps := c.opts.Replicas(set)
	var pending []string
	for i := st.Target; i < st.Replicas; i++ {
		name := st.Ref.Name + "-" + strconv.Itoa(i)
		if r := reps[name]; r.Alive && !r.Retired {
			pending = append(pending, name)
		}
	}
	waited := c.now().Sub(began)
	if len(pending) > 0 && waited < c.cfg.RetireTimeout {
		return
	}
	fields := map[string]any{"from": st.Replicas, "to": st.Target, "statefulset": st.Ref.String(), "step": "scaled", "waited_ms": waited.Milliseconds()}
	if len(pending) > 0 {
		fields["not_retired"] = pending
		c.log.Warn("scale-in: lowering spec.replicas although replicas have not retired (kubernetes.retire_timeout)",
			zap.String("set", set), zap.Strings("pending", pending), zap.Duration("waited", waited))
	}
	if err := c.writeScale(ctx, st.Ref, st.Target, st.ResourceVersion); err != nil {
		c.log.Info("scale-in: spec.replicas not written; trying again", zap.String("set", set), zap.Error(err))
		return
	}
	c.log.Info("scale-in: the leaving replicas retired; spec.replicas lowered", zap.String("set", set),
		zap.Int("from", st.Replicas), zap.Int("to", st.Target))
	c.event(set, "scale_in", fields)
	// The annotation goes last: once spec.replicas is lowered it asks
	// for nothing, and a successor that finds it only removes it.
	c.clearScaleIn(ctx, set, st.Ref)
}

// clearScaleIn removes a scale-in annotation that has been carried out.
func (c *Controller) clearScaleIn(ctx context.Context, set string, r kube.Ref) {
	for range 5 {
		sts, err := c.client.AppsV1().StatefulSets(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err != nil {
			return
		}
		if _, ok := sts.Annotations[kube.AnnotationScaleIn]; !ok {
			return
		}
		if stateOf(r, sts).Retiring() {
			return // a new scale-in
		}
		err = c.annotate(ctx, r, sts.ResourceVersion, "")
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			c.log.Warn("scale-in annotation not removed", zap.String("set", set), zap.Error(err))
			return
		}
	}
}

// reviveBelow deletes the pods of retired replicas below the target (a
// scale-out after a scale-in began, or an annotation that went stale):
// their StatefulSet makes them again, with a new agent. It also clears an
// annotation that asks for nothing.
func (c *Controller) reviveBelow(ctx context.Context, set string, st State) {
	reps := c.opts.Replicas(set)
	pods, err := c.Pods(set)
	if err != nil {
		return
	}
	for _, p := range pods {
		if p.Ordinal >= st.Target || p.Deleting {
			continue
		}
		r := reps[p.Name]
		if !r.Alive || !r.Retired {
			continue
		}
		key := set + "/" + p.Name
		c.mu.Lock()
		done := c.revived[key] == r.Boot
		c.mu.Unlock()
		if done {
			continue // its pod was deleted already: this pod is the new one
		}
		c.log.Info("replica retired below its set's count (a scale-in was cancelled): deleting its pod so it comes back",
			zap.String("set", set), zap.String("pod", p.Name))
		if err := c.DeletePod(ctx, set, p.Name, p.UID); err != nil {
			c.log.Warn("pod not deleted", zap.String("pod", p.Name), zap.Error(err))
			continue
		}
		c.mu.Lock()
		c.revived[key] = r.Boot
		c.mu.Unlock()
		c.event(set, "revive", map[string]any{"pod": p.Name})
	}
	c.mu.Lock()
	sts := c.cachedLocked(st.Ref)
	c.mu.Unlock()
	if sts != nil && !st.Retiring() && sts.Annotations[kube.AnnotationScaleIn] != "" {
		c.clearScaleIn(ctx, set, st.Ref)
	}
}

func (c *Controller) event(set, action string, fields map[string]any) {
	if c.opts.Event != nil {
		fields["action"] = action
		c.opts.Event(set, fields)
	}
}
