package backend

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"keyway/internal/poll"
	"keyway/kube"
)

// TestMain routes klog before any test starts a client-go goroutine:
// klog.SetLogger, which RouteKlog's first call makes, must not race with
// one that logs. Later RouteKlog calls (TestRouteKlog) only swap.
func TestMain(m *testing.M) {
	RouteKlog(zap.NewNop())
	os.Exit(m.Run())
}

const testNS = "ns"

var stsGVR = appsv1.SchemeGroupVersion.WithResource("statefulsets")

// fakeAPI is client-go's fake clientset plus the API server's optimistic
// concurrency for the StatefulSet writes Scale makes, which the fake's
// tracker does not check: a scale subresource update or a merge patch
// whose resourceVersion is not the stored one is a 409 Conflict, and each
// write stores a new resourceVersion. It records the writes it received.
type fakeAPI struct {
	*fake.Clientset

	mu      sync.Mutex
	rv      int          // the last resourceVersion stored
	scales  []scaleWrite // scale subresource updates, in order
	patches []string     // merge patches of StatefulSets, in order
}

// scaleWrite is a scale subresource update and the StatefulSet's
// resourceVersion when it arrived.
type scaleWrite struct {
	autoscalingv1.Scale
	stored string
}

func newFakeAPI(objs ...runtime.Object) *fakeAPI {
	f := &fakeAPI{Clientset: fake.NewSimpleClientset(objs...), rv: 100}
	f.PrependReactor("update", "statefulsets", f.updateScale)
	f.PrependReactor("patch", "statefulsets", f.patch)
	return f
}

// The reactors run under the fake's lock: they use the tracker, never
// the clientset.
func (f *fakeAPI) updateScale(a k8stesting.Action) (bool, runtime.Object, error) {
	if a.GetSubresource() != "scale" {
		return false, nil, nil
	}
	sc := a.(k8stesting.UpdateAction).GetObject().(*autoscalingv1.Scale).DeepCopy()
	f.mu.Lock()
	defer f.mu.Unlock()
	sts, err := f.getLocked(a.GetNamespace(), sc.Name)
	if err != nil {
		return true, nil, err
	}
	f.scales = append(f.scales, scaleWrite{*sc, sts.ResourceVersion})
	if sc.ResourceVersion != "" && sc.ResourceVersion != sts.ResourceVersion {
		return true, nil, conflict(sc.Name)
	}
	sts.Spec.Replicas = new(sc.Spec.Replicas)
	if err := f.storeLocked(sts); err != nil {
		return true, nil, err
	}
	sc.ResourceVersion = sts.ResourceVersion
	return true, sc, nil
}

func (f *fakeAPI) patch(a k8stesting.Action) (bool, runtime.Object, error) {
	p := a.(k8stesting.PatchAction)
	if p.GetSubresource() != "" || p.GetPatchType() != types.MergePatchType {
		return false, nil, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.patches = append(f.patches, string(p.GetPatch()))
	cur, err := f.getLocked(p.GetNamespace(), p.GetName())
	if err != nil {
		return true, nil, err
	}
	var pre struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(p.GetPatch(), &pre); err != nil {
		return true, nil, apierrors.NewBadRequest(err.Error())
	}
	if pre.Metadata.ResourceVersion != "" && pre.Metadata.ResourceVersion != cur.ResourceVersion {
		return true, nil, conflict(p.GetName())
	}
	// The fake's own reaction applies the merge patch.
	_, obj, err := k8stesting.ObjectReaction(f.Tracker())(a)
	if err != nil {
		return true, nil, err
	}
	sts := obj.(*appsv1.StatefulSet)
	if err := f.storeLocked(sts); err != nil {
		return true, nil, err
	}
	return true, sts, nil
}

func conflict(name string) error {
	return apierrors.NewConflict(stsGVR.GroupResource(), name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
}

func (f *fakeAPI) getLocked(ns, name string) (*appsv1.StatefulSet, error) {
	obj, err := f.Tracker().Get(stsGVR, ns, name)
	if err != nil {
		return nil, err
	}
	return obj.(*appsv1.StatefulSet), nil
}

// storeLocked stores sts under a new resourceVersion.
func (f *fakeAPI) storeLocked(sts *appsv1.StatefulSet) error {
	f.rv++
	sts.ResourceVersion = strconv.Itoa(f.rv)
	return f.Tracker().Update(stsGVR, sts, sts.Namespace)
}

// add stores a new StatefulSet.
func (f *fakeAPI) add(t *testing.T, sts *appsv1.StatefulSet) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	sts.ResourceVersion = strconv.Itoa(f.rv)
	if err := f.Tracker().Add(sts); err != nil {
		t.Fatal(err)
	}
}

// bumpLocked moves a StatefulSet's resourceVersion without touching its
// spec, as the StatefulSet controller's status writes do.
func (f *fakeAPI) bumpLocked(t *testing.T, name string) {
	sts, err := f.getLocked(testNS, name)
	if err != nil {
		t.Error(err)
		return
	}
	sts.Status.ObservedGeneration++
	if err := f.storeLocked(sts); err != nil {
		t.Error(err)
	}
}

// sts reads a StatefulSet back.
func (f *fakeAPI) sts(t *testing.T, name string) *appsv1.StatefulSet {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	sts, err := f.getLocked(testNS, name)
	if err != nil {
		t.Fatal(err)
	}
	return sts
}

func (f *fakeAPI) writes() ([]scaleWrite, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.scales), slices.Clone(f.patches)
}

// statefulSet is a StatefulSet of testNS whose pods are labelled
// app=name.
func statefulSet(name string, replicas int32, annotations map[string]string) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID(name + "-uid"), Annotations: annotations},
		Spec: appsv1.StatefulSetSpec{
			Replicas: new(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
		},
	}
}

// event is one Options.Event call.
type event struct {
	set    string
	fields map[string]any
}

// newController is a Controller on f following set "orders" (StatefulSet
// ns/orders). Its Options.Event calls go to the returned func's result.
func newController(t *testing.T, f *fakeAPI, log *zap.Logger) (*Controller, func() []event) {
	t.Helper()
	cfg := kube.DefaultConfig()
	cfg.Namespace = testNS
	var mu sync.Mutex
	var events []event
	c, err := New(Options{Client: f, Config: cfg, Identity: "me", Logger: log,
		Replicas: func(string) map[string]Replica { return nil },
		Event: func(set string, fields map[string]any) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, event{set, fields})
		}})
	if err != nil {
		t.Fatal(err)
	}
	c.Watch(map[string]kube.Ref{"orders": {Name: "orders"}})
	return c, func() []event {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
}

// Scale writes a scale-out through the scale subresource and a scale-in
// as the AnnotationScaleIn annotation, each with the resourceVersion it
// read as precondition; a scale-out or the same count cancels a scale-in
// in progress by removing the annotation first.
func TestScale(t *testing.T) {
	const removed = "(removed)"
	for name, tc := range map[string]struct {
		replicas   int32
		annotation string // "" none
		n          int
		ifMatch    bool // pass the StatefulSet's resourceVersion as If-Match
		wantPrev   int
		// wantPatch is the annotation value the merge patch writes,
		// removed for a removal, "" for no patch.
		wantPatch    string
		wantScale    bool // a scale subresource write of n
		wantReplicas int32
	}{
		"scale out":                          {replicas: 3, n: 5, wantPrev: 3, wantScale: true, wantReplicas: 5},
		"scale out with If-Match":            {replicas: 3, n: 5, ifMatch: true, wantPrev: 3, wantScale: true, wantReplicas: 5},
		"scale out from zero":                {replicas: 0, n: 2, wantPrev: 0, wantScale: true, wantReplicas: 2},
		"same count writes nothing":          {replicas: 3, n: 3, wantPrev: 3, wantReplicas: 3},
		"scale in asks by annotation":        {replicas: 5, n: 3, wantPrev: 5, wantPatch: "3/5", wantReplicas: 5},
		"scale in with If-Match":             {replicas: 5, n: 3, ifMatch: true, wantPrev: 5, wantPatch: "3/5", wantReplicas: 5},
		"scale in to zero":                   {replicas: 3, n: 0, wantPrev: 3, wantPatch: "0/3", wantReplicas: 3},
		"scale in further during scale-in":   {replicas: 5, annotation: "3/5", n: 2, wantPrev: 3, wantPatch: "2/5", wantReplicas: 5},
		"scale in less during scale-in":      {replicas: 5, annotation: "2/5", n: 4, wantPrev: 2, wantPatch: "4/5", wantReplicas: 5},
		"scale out cancels scale-in":         {replicas: 5, annotation: "3/5", n: 6, wantPrev: 3, wantPatch: removed, wantScale: true, wantReplicas: 6},
		"count before cancels scale-in":      {replicas: 5, annotation: "3/5", n: 5, wantPrev: 3, wantPatch: removed, wantReplicas: 5},
		"stale annotation goes on scale-out": {replicas: 3, annotation: "3/5", n: 4, wantPrev: 3, wantPatch: removed, wantScale: true, wantReplicas: 4},
	} {
		t.Run(name, func(t *testing.T) {
			var ann map[string]string
			if tc.annotation != "" {
				ann = map[string]string{kube.AnnotationScaleIn: tc.annotation}
			}
			f := newFakeAPI()
			f.add(t, statefulSet("orders", tc.replicas, ann))
			rv0 := f.sts(t, "orders").ResourceVersion
			c, events := newController(t, f, zaptest.NewLogger(t))
			ifMatch := ""
			if tc.ifMatch {
				ifMatch = rv0
			}

			prev, err := c.Scale(t.Context(), "orders", tc.n, ifMatch)
			if err != nil || prev != tc.wantPrev {
				t.Fatalf("Scale(%d) = %d, %v; want %d, nil", tc.n, prev, err, tc.wantPrev)
			}

			scales, patches := f.writes()
			rvScale := rv0 // the resourceVersion the scale write must carry
			switch {
			case tc.wantPatch == "" && len(patches) != 0:
				t.Errorf("patches %q, want none", patches)
			case tc.wantPatch != "":
				v := strconv.Quote(tc.wantPatch)
				if tc.wantPatch == removed {
					v = "null"
				}
				want := `{"metadata":{"annotations":{"` + kube.AnnotationScaleIn + `":` + v + `},"resourceVersion":"` + rv0 + `"}}`
				if len(patches) != 1 || patches[0] != want {
					t.Errorf("patches %q, want [%s]", patches, want)
				}
				rvScale = strconv.Itoa(mustAtoi(t, rv0) + 1)
			}
			if tc.wantScale {
				if len(scales) != 1 {
					t.Fatalf("%d scale writes, want 1: %+v", len(scales), scales)
				}
				sc := scales[0]
				if sc.Name != "orders" || sc.Namespace != testNS || sc.Spec.Replicas != int32(tc.n) || sc.ResourceVersion != rvScale || sc.stored != rvScale {
					t.Errorf("scale write %s/%s replicas %d resourceVersion %q (stored %q), want %s/orders replicas %d resourceVersion %q",
						sc.Namespace, sc.Name, sc.Spec.Replicas, sc.ResourceVersion, sc.stored, testNS, tc.n, rvScale)
				}
			} else if len(scales) != 0 {
				t.Errorf("scale writes %+v, want none", scales)
			}

			sts := f.sts(t, "orders")
			if *sts.Spec.Replicas != tc.wantReplicas {
				t.Errorf("spec.replicas = %d, want %d", *sts.Spec.Replicas, tc.wantReplicas)
			}
			got, has := sts.Annotations[kube.AnnotationScaleIn]
			switch tc.wantPatch {
			case "":
				if got != tc.annotation {
					t.Errorf("annotation %q, want %q as before", got, tc.annotation)
				}
			case removed:
				if has {
					t.Errorf("annotation %q, want none", got)
				}
			default:
				if got != tc.wantPatch {
					t.Errorf("annotation %q, want %q", got, tc.wantPatch)
				}
			}

			// A scale-in reads back as the target, and is recorded.
			st := stateOf(kube.Ref{Namespace: testNS, Name: "orders"}, sts)
			if st.Target != tc.n || st.Replicas != int(tc.wantReplicas) || st.Retiring() != (tc.n < int(tc.wantReplicas)) {
				t.Errorf("stateOf: target %d replicas %d retiring %v, want target %d replicas %d", st.Target, st.Replicas, st.Retiring(), tc.n, tc.wantReplicas)
			}
			evs := events()
			if tc.n < int(tc.replicas) {
				if len(evs) != 1 || evs[0].set != "orders" || evs[0].fields["action"] != "scale_in" || evs[0].fields["step"] != "asked" ||
					evs[0].fields["from"] != int(tc.replicas) || evs[0].fields["to"] != tc.n {
					t.Errorf("events %+v, want one scale_in asked from %d to %d", evs, tc.replicas, tc.n)
				}
			} else if len(evs) != 0 {
				t.Errorf("events %+v, want none", evs)
			}
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Without If-Match, a 409 (here: the StatefulSet controller wrote status
// between Scale's read and its write) is read again and retried, and the
// retry carries the new resourceVersion.
func TestScaleRetriesConflict(t *testing.T) {
	f := newFakeAPI()
	f.add(t, statefulSet("orders", 3, nil))
	rv0 := f.sts(t, "orders").ResourceVersion
	attempts := 0
	f.PrependReactor("update", "statefulsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "scale" {
			return false, nil, nil
		}
		attempts++
		if attempts > 1 {
			return false, nil, nil
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.bumpLocked(t, "orders")
		return true, nil, conflict("orders")
	})
	c, _ := newController(t, f, zaptest.NewLogger(t))

	prev, err := c.Scale(t.Context(), "orders", 5, "")
	if err != nil || prev != 3 {
		t.Fatalf("Scale = %d, %v; want 3, nil", prev, err)
	}
	if attempts != 2 {
		t.Errorf("%d scale writes attempted, want 2", attempts)
	}
	scales, _ := f.writes()
	rv1 := strconv.Itoa(mustAtoi(t, rv0) + 1)
	if len(scales) != 1 || scales[0].ResourceVersion != rv1 || scales[0].Spec.Replicas != 5 {
		t.Fatalf("scale writes past the conflict %+v, want one of 5 replicas at resourceVersion %s", scales, rv1)
	}
	if got := *f.sts(t, "orders").Spec.Replicas; got != 5 {
		t.Errorf("spec.replicas = %d, want 5", got)
	}
}

// A conflict that persists ends the retries with a *ConflictError that
// wraps the 409.
func TestScaleGivesUpAfterConflicts(t *testing.T) {
	f := newFakeAPI()
	f.add(t, statefulSet("orders", 3, nil))
	attempts := 0
	f.PrependReactor("update", "statefulsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "scale" {
			return false, nil, nil
		}
		attempts++
		return true, nil, conflict("orders")
	})
	c, _ := newController(t, f, zaptest.NewLogger(t))

	_, err := c.Scale(t.Context(), "orders", 5, "")
	var ce *ConflictError
	if !errors.As(err, &ce) || !apierrors.IsConflict(err) || ce.Set != "orders" || ce.Replicas != 3 {
		t.Fatalf("Scale = %v, want a *ConflictError of set orders, replicas 3, wrapping a 409", err)
	}
	if attempts != 5 {
		t.Errorf("%d scale writes attempted, want 5", attempts)
	}
	if got := *f.sts(t, "orders").Spec.Replicas; got != 3 {
		t.Errorf("spec.replicas = %d, want 3", got)
	}
}

// With If-Match, a resourceVersion that is not the StatefulSet's is a
// *ConflictError at once: nothing is written, nothing retried.
func TestScaleIfMatchMismatch(t *testing.T) {
	for name, n := range map[string]int{"scale out": 5, "scale in": 1} {
		t.Run(name, func(t *testing.T) {
			f := newFakeAPI()
			f.add(t, statefulSet("orders", 3, nil))
			rv := f.sts(t, "orders").ResourceVersion
			c, _ := newController(t, f, zaptest.NewLogger(t))

			prev, err := c.Scale(t.Context(), "orders", n, "1")
			var ce *ConflictError
			if !errors.As(err, &ce) || ce.ResourceVersion != rv || ce.Replicas != 3 || prev != 3 {
				t.Fatalf("Scale = %d, %v; want 3 and a *ConflictError at resourceVersion %s, replicas 3", prev, err, rv)
			}
			var verbs []string
			for _, a := range f.Actions() {
				verbs = append(verbs, a.GetVerb())
			}
			if !slices.Equal(verbs, []string{"get"}) {
				t.Errorf("API calls %v, want one get", verbs)
			}
		})
	}
}

// With If-Match, a write refused because the StatefulSet changed between
// Scale's read and its write is a *ConflictError too, not retried.
func TestScaleIfMatchConflictOnWrite(t *testing.T) {
	f := newFakeAPI()
	f.add(t, statefulSet("orders", 5, nil))
	rv := f.sts(t, "orders").ResourceVersion
	f.PrependReactor("patch", "statefulsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.bumpLocked(t, "orders")
		return false, nil, nil // on to fakeAPI.patch, which finds it stale
	})
	c, _ := newController(t, f, zaptest.NewLogger(t))

	_, err := c.Scale(t.Context(), "orders", 3, rv)
	var ce *ConflictError
	if !errors.As(err, &ce) || !apierrors.IsConflict(err) {
		t.Fatalf("Scale = %v, want a *ConflictError wrapping a 409", err)
	}
	if _, patches := f.writes(); len(patches) != 1 {
		t.Errorf("%d patches, want 1 (not retried)", len(patches))
	}
	if ann, ok := f.sts(t, "orders").Annotations[kube.AnnotationScaleIn]; ok {
		t.Errorf("annotation %q written, want none", ann)
	}
}

func TestScaleUnknownOrMissing(t *testing.T) {
	f := newFakeAPI()
	c, _ := newController(t, f, zaptest.NewLogger(t))
	if _, err := c.Scale(t.Context(), "payments", 3, ""); !errors.Is(err, ErrUnknownSet) {
		t.Errorf("Scale of a set that names no StatefulSet = %v, want ErrUnknownSet", err)
	}
	if _, err := c.Scale(t.Context(), "orders", 3, ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("Scale of a missing StatefulSet = %v, want ErrNotFound", err)
	}
}

func TestParseScaleIn(t *testing.T) {
	type result struct {
		to, from int
		ok       bool
	}
	for v, want := range map[string]result{
		"3/5":    {3, 5, true},
		"0/3":    {0, 3, true},
		"5/3":    {5, 3, true}, // parsed; stateOf ignores it (TO not below FROM)
		"":       {},
		"3":      {},
		"3/":     {},
		"/5":     {},
		"a/5":    {},
		"3/b":    {},
		"-1/5":   {},
		"3/-5":   {},
		"3/5/7":  {},
		" 3/5":   {},
		"3/5 ":   {},
		"3.0/5":  {},
		"3 / 5":  {},
		"0x3/05": {},
	} {
		to, from, ok := parseScaleIn(v)
		if ok != want.ok || (ok && (to != want.to || from != want.from)) {
			t.Errorf("parseScaleIn(%q) = %d, %d, %v; want %d, %d, %v", v, to, from, ok, want.to, want.from, want.ok)
		}
	}
}

func TestStateOf(t *testing.T) {
	for name, tc := range map[string]struct {
		replicas           *int32
		annotation         string
		wantReplicas, want int // want: Target
	}{
		"no annotation":              {replicas: new(int32(5)), wantReplicas: 5, want: 5},
		"scale-in":                   {replicas: new(int32(5)), annotation: "3/5", wantReplicas: 5, want: 3},
		"scale-in to zero":           {replicas: new(int32(5)), annotation: "0/5", wantReplicas: 5, want: 0},
		"carried out (lowered)":      {replicas: new(int32(3)), annotation: "3/5", wantReplicas: 3, want: 3},
		"overtaken by another write": {replicas: new(int32(7)), annotation: "3/5", wantReplicas: 7, want: 7},
		"not a scale-in":             {replicas: new(int32(5)), annotation: "5/5", wantReplicas: 5, want: 5},
		"upside down":                {replicas: new(int32(5)), annotation: "6/5", wantReplicas: 5, want: 5},
		"garbage":                    {replicas: new(int32(5)), annotation: "three/5", wantReplicas: 5, want: 5},
		"spec.replicas unset":        {annotation: "0/1", wantReplicas: 1, want: 0}, // Kubernetes' default: 1
	} {
		t.Run(name, func(t *testing.T) {
			sts := statefulSet("orders", 0, map[string]string{kube.AnnotationScaleIn: tc.annotation})
			sts.Spec.Replicas = tc.replicas
			sts.ResourceVersion = "42"
			sts.Status.ReadyReplicas = 2
			sts.Labels = map[string]string{kube.LabelManagedBy: kube.ManagedBy}
			r := kube.Ref{Namespace: testNS, Name: "orders"}
			want := State{Ref: r, Found: true, Replicas: tc.wantReplicas, Target: tc.want, Ready: 2, ResourceVersion: "42", ManagedByKeyway: true}
			if got := stateOf(r, sts); got != want {
				t.Errorf("stateOf = %+v, want %+v", got, want)
			}
		})
	}
}

func TestOrdinal(t *testing.T) {
	type result struct {
		n  int
		ok bool
	}
	for _, tc := range []struct {
		sts, pod string
		want     result
	}{
		{"orders", "orders-0", result{0, true}},
		{"orders", "orders-1", result{1, true}},
		{"orders", "orders-12", result{12, true}},
		{"orders-web", "orders-web-3", result{3, true}},
		{"orders", "orders-01", result{}}, // not ordinal 1: StatefulSets do not pad
		{"orders", "orders-00", result{}},
		{"orders", "orders-+1", result{}},
		{"orders", "orders--1", result{}},
		{"orders", "orders-x", result{}},
		{"orders", "orders-1x", result{}},
		{"orders", "orders-", result{}},
		{"orders", "orders", result{}},
		{"orders", "orders-web-3", result{}}, // another StatefulSet's pod
		{"ord", "orders-1", result{}},
		{"orders", "payments-1", result{}},
		{"orders", "Orders-1", result{}},
		{"orders", "orders-99999999999999999999", result{}}, // overflows
	} {
		n, ok := Ordinal(tc.sts, tc.pod)
		if (result{n, ok}) != tc.want {
			t.Errorf("Ordinal(%q, %q) = %d, %v; want %d, %v", tc.sts, tc.pod, n, ok, tc.want.n, tc.want.ok)
		}
	}
}

func TestPodOf(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	notReady := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse}
	scheduled := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}
	waiting := func(reason string, restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{RestartCount: restarts, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
	}
	terminated := func(reason string, code int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code}}}
	}
	running := func(restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{RestartCount: restarts, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	}
	for name, tc := range map[string]struct {
		status     corev1.PodStatus
		want       Pod // Phase, Ready, Restarts, Reason
		wantFailed bool
	}{
		"running and ready": {
			status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{scheduled, ready}, ContainerStatuses: []corev1.ContainerStatus{running(1), running(2)}},
			want:   Pod{Phase: "Running", Ready: true, Restarts: 3},
		},
		"running, not ready": {
			status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{notReady}, ContainerStatuses: []corev1.ContainerStatus{running(0)}},
			want:   Pod{Phase: "Running"},
		},
		"only scheduled": {
			status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{scheduled}},
			want:   Pod{Phase: "Pending"},
		},
		"creating": {
			status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{waiting("ContainerCreating", 0)}},
			want:   Pod{Phase: "Pending"},
		},
		"crash loop": {
			status:     corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{notReady}, ContainerStatuses: []corev1.ContainerStatus{running(0), waiting("CrashLoopBackOff", 7)}},
			want:       Pod{Phase: "Running", Restarts: 7, Reason: "CrashLoopBackOff"},
			wantFailed: true,
		},
		"image pull back-off is not a repair": {
			status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{waiting("ImagePullBackOff", 0)}},
			want:   Pod{Phase: "Pending", Reason: "ImagePullBackOff"},
		},
		"container exited badly": {
			status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{terminated("Error", 1)}},
			want:   Pod{Phase: "Running", Reason: "Error"},
		},
		"container completed": {
			status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{terminated("Completed", 0)}},
			want:   Pod{Phase: "Running"},
		},
		"a crash loop in a later container wins": {
			status:     corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{terminated("Error", 1), waiting("CrashLoopBackOff", 3)}},
			want:       Pod{Phase: "Running", Reason: "CrashLoopBackOff", Restarts: 3},
			wantFailed: true,
		},
		"first reason wins": {
			status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{terminated("OOMKilled", 137), terminated("Error", 1)}},
			want:   Pod{Phase: "Running", Reason: "OOMKilled"},
		},
		"failed, evicted": {
			status:     corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted"},
			want:       Pod{Phase: "Failed", Reason: "Evicted"},
			wantFailed: true,
		},
		"failed without a reason": {
			status:     corev1.PodStatus{Phase: corev1.PodFailed},
			want:       Pod{Phase: "Failed", Reason: "Failed"},
			wantFailed: true,
		},
		"failed, a container's reason first": {
			status:     corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", ContainerStatuses: []corev1.ContainerStatus{terminated("Error", 2)}},
			want:       Pod{Phase: "Failed", Reason: "Error"},
			wantFailed: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "orders-2", UID: "u-2", CreationTimestamp: created},
				Spec:       corev1.PodSpec{NodeName: "node-a"},
				Status:     tc.status,
			}
			want := tc.want
			want.Name, want.Ordinal, want.Node, want.Created, want.UID = "orders-2", 2, "node-a", created.Time, "u-2"
			got := podOf(p, 2)
			if got != want {
				t.Errorf("podOf = %+v, want %+v", got, want)
			}
			if got.Failed() != tc.wantFailed {
				t.Errorf("Failed() = %v, want %v", got.Failed(), tc.wantFailed)
			}
		})
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orders-0", DeletionTimestamp: &created}}
	if !podOf(p, 0).Deleting {
		t.Error("a pod with a deletion timestamp is not Deleting")
	}
}

// Run follows the StatefulSets through informers: State, Pods and
// OnChange see what is there and what Scale writes. The Lease is held by
// another proxy, so this one never acts (never lowers spec.replicas).
func TestRunFollows(t *testing.T) {
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "keyway", Namespace: testNS},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("other"), LeaseDurationSeconds: new(int32(3600)),
			AcquireTime: &now, RenewTime: &now},
	}
	sts := statefulSet("orders", 3, nil)
	pod := func(name string, owner types.UID, app string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: map[string]string{"app": app},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "orders", UID: owner}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	f := newFakeAPI(lease,
		pod("orders-1", sts.UID, "orders"),
		pod("orders-0", sts.UID, "orders"),
		pod("orders-01", sts.UID, "orders"),      // not a StatefulSet pod name
		pod("orders-2", "another-uid", "orders"), // another owner
		pod("orders-3", sts.UID, "payments"),     // outside the selector
	)
	f.add(t, sts)
	var changes atomic.Int32
	cfg := kube.DefaultConfig()
	cfg.Namespace = testNS
	// Goroutines of Run may log after the test: no zaptest logger.
	c, err := New(Options{Client: f, Config: cfg, Identity: "me", OnChange: func() { changes.Add(1) },
		Replicas: func(string) map[string]Replica { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	c.Watch(map[string]kube.Ref{"orders": {Name: "orders"}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	}()

	poll.Until(t, 5*time.Second, "the informers to sync", c.Synced)
	st, ok := c.State("orders")
	if !ok || !st.Found || st.Replicas != 3 || st.Target != 3 {
		t.Fatalf("State = %+v, %v; want found, 3 replicas, target 3", st, ok)
	}
	if _, ok := c.State("payments"); ok {
		t.Error("State of a set not followed is reported")
	}
	pods, err := c.Pods("orders")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name+"#"+strconv.Itoa(p.Ordinal))
	}
	if !slices.Equal(names, []string{"orders-0#0", "orders-1#1"}) {
		t.Errorf("Pods = %v, want [orders-0#0 orders-1#1]", names)
	}
	poll.Until(t, 5*time.Second, "OnChange for the StatefulSet found", func() bool { return changes.Load() > 0 })

	seen := changes.Load()
	if _, err := c.Scale(ctx, "orders", 1, ""); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "State to show the scale-in", func() bool {
		st, _ := c.State("orders")
		return st.Target == 1
	})
	if st, _ := c.State("orders"); st.Replicas != 3 || !st.Retiring() {
		t.Errorf("State = %+v, want replicas 3 retiring to 1", st)
	}
	poll.Until(t, 5*time.Second, "OnChange for the scale-in", func() bool { return changes.Load() > seen })
	poll.Until(t, 5*time.Second, "the Lease holder to be seen", func() bool { h, _ := c.Leader(); return h == "other" })
	if _, me := c.Leader(); me {
		t.Error("this proxy leads, though another holds the Lease")
	}
	if got := *f.sts(t, "orders").Spec.Replicas; got != 3 {
		t.Errorf("spec.replicas = %d, want 3: only the acting proxy lowers it", got)
	}
}

// RouteKlog sends klog's lines, with their fields and their callers, to
// the zap logger last given.
func TestRouteKlog(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	RouteKlog(zap.New(core, zap.AddCaller()).Named("kubernetes"))
	t.Cleanup(func() { RouteKlog(zap.NewNop()) })

	klog.InfoS("lease acquired", "lease", "ns/keyway")
	klog.ErrorS(errors.New("connection refused"), "watch failed", "resource", "statefulsets")
	klog.Infof("plain %d", 1)
	klog.Warning("a warning")
	klog.Error("an error")
	klog.V(1).InfoS("verbose") // klog's -v is 0: not made at all

	for _, want := range []struct {
		msg    string
		level  zapcore.Level
		fields map[string]any
	}{
		{"lease acquired", zapcore.InfoLevel, map[string]any{"lease": "ns/keyway"}},
		{"watch failed", zapcore.WarnLevel, map[string]any{"resource": "statefulsets", "error": "connection refused"}},
		{"plain 1", zapcore.InfoLevel, map[string]any{}},
		{"a warning", zapcore.InfoLevel, map[string]any{}},
		{"an error", zapcore.WarnLevel, map[string]any{}},
	} {
		got := logs.FilterMessage(want.msg).All()
		if len(got) != 1 {
			t.Errorf("%d entries %q, want 1", len(got), want.msg)
			continue
		}
		e := got[0]
		if e.Level != want.level || e.LoggerName != "kubernetes" || !equalFields(e.ContextMap(), want.fields) {
			t.Errorf("entry %q: level %s logger %q fields %v, want %s %q %v", want.msg, e.Level, e.LoggerName, e.ContextMap(), want.level, "kubernetes", want.fields)
		}
		if !e.Caller.Defined || filepath.Base(e.Caller.File) != "backend_test.go" {
			t.Errorf("entry %q: caller %s, want this file", want.msg, e.Caller)
		}
	}
	if n := logs.FilterMessage("verbose").Len(); n != 0 {
		t.Errorf("%d V(1) entries, want none at klog's -v 0", n)
	}

	// A later call replaces the logger; nil discards.
	core2, logs2 := observer.New(zapcore.InfoLevel)
	RouteKlog(zap.New(core2))
	klog.InfoS("after")
	if logs.FilterMessage("after").Len() != 0 || logs2.FilterMessage("after").Len() != 1 {
		t.Errorf("after RouteKlog again: %d entries in the old logger, %d in the new; want 0, 1", logs.FilterMessage("after").Len(), logs2.FilterMessage("after").Len())
	}
	RouteKlog(nil)
	klog.InfoS("discarded")
	if logs2.FilterMessage("discarded").Len() != 0 {
		t.Error("after RouteKlog(nil), klog still writes to the previous logger")
	}
}

func equalFields(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

type marshaler string

func (m marshaler) MarshalLog() any {
	if m == "panic" {
		panic("boom")
	}
	return "marshalled " + string(m)
}

// The sink maps logr's verbosity, names and values onto zap.
func TestKlogSink(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	RouteKlog(zap.New(core, zap.AddCaller()).Named("kubernetes"))
	t.Cleanup(func() { RouteKlog(zap.NewNop()) })
	l := logr.New(newKlogSink())

	if l.V(1).Enabled() {
		t.Error("V(1) enabled on a logger at Info")
	}
	l.V(1).Info("dropped")
	l.WithName("reflector").WithName("sts").WithValues("k", 1).Info("named", "obj", marshaler("x"), "bad", marshaler("panic"), 42, "v", "odd")
	l.Error(nil, "no error")

	if logs.FilterMessage("dropped").Len() != 0 {
		t.Error("a V(1) line reached a logger at Info")
	}
	e := logs.FilterMessage("named").All()
	want := map[string]any{"k": int64(1), "obj": "marshalled x", "bad": "<panic: boom>", "42": "v", "odd": "(MISSING)"}
	if len(e) != 1 || e[0].LoggerName != "kubernetes.reflector.sts" || e[0].Level != zapcore.InfoLevel || !equalFields(e[0].ContextMap(), want) {
		t.Errorf("entries %+v, want one at Info, logger kubernetes.reflector.sts, fields %v", e, want)
	} else if filepath.Base(e[0].Caller.File) != "backend_test.go" {
		t.Errorf("caller %s, want this file", e[0].Caller)
	}
	if e := logs.FilterMessage("no error").All(); len(e) != 1 || e[0].Level != zapcore.WarnLevel || len(e[0].Context) != 0 {
		t.Errorf("entries %+v, want one at Warn without fields", e)
	}

	core2, logs2 := observer.New(zapcore.DebugLevel)
	RouteKlog(zap.New(core2))
	l.V(1).Info("debug line")
	l.V(3).Info("debug line too")
	if e := logs2.FilterLevelExact(zapcore.DebugLevel).All(); len(e) != 2 {
		t.Errorf("%d Debug entries, want V(1) and V(3)", len(e))
	}
}
