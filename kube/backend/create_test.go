package backend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"keyway/kube"
)

// decodeJSON decodes b keeping numbers as they are written.
func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// A definition without statefulset.template, or that is no JSON object
// at all, comes back as it is (the same bytes), for the set's decoder.
func TestSplitTemplateUnchanged(t *testing.T) {
	for name, spec := range map[string]string{
		"no statefulset key":           `{"name": "orders", "replicas": 3}`,
		"statefulset without template": `{"name": "orders", "statefulset": {"name": "orders", "namespace": "db"}}`,
		"statefulset null":             `{"name": "orders", "statefulset": null}`,
		"statefulset not an object":    `{"name": "orders", "statefulset": "orders"}`,
		"statefulset an array":         `{"statefulset": [{"template": {}}]}`,
		"array":                        `[{"statefulset": {"template": {}}}]`,
		"string":                       `"statefulset"`,
		"number":                       `3`,
		"null":                         `null`,
		"empty":                        ``,
		"not JSON":                     `{"statefulset": {"template": {}`,
		"trailing data":                `{"statefulset": {"template": {}}} {}`,
		// Without a template, duplicates are the set decoder's to refuse:
		// returned unchanged, they still reach it.
		"duplicate key, no template": `{"name": "a", "name": "b", "statefulset": {"name": "x"}}`,
		// The last statefulset, the one a map keeps, has no template.
		"duplicate statefulset, last without template": `{"statefulset": {"template": {}}, "statefulset": {"name": "x"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			rest, tmpl, err := SplitTemplate([]byte(spec))
			if err != nil || tmpl != nil || string(rest) != spec {
				t.Errorf("SplitTemplate(%s) = %q, %q, %v; want the body unchanged, no template, nil", spec, rest, tmpl, err)
			}
		})
	}
}

func TestSplitTemplate(t *testing.T) {
	const tmpl = `{"metadata": {"labels": {"team": "a"}},
		"spec": {"template": {"spec": {"containers": [{"name": "db", "image": "postgres:17"}]}}}}`
	// The definition without its template, as a set's decoder would read
	// it: every other key and value, numbers as written, stays.
	const without = `{
		"name": "orders",
		"replicas": 3,
		"big": 12345678901234567890,
		"ratio": 1.50,
		"match": {"path_prefix": "/orders", "header": "<&>"},
		"statefulset": {"namespace": "db", "name": "orders"},
		"static": [1, "two", null, {"x": false}]
	}`
	spec := strings.Replace(without, `"name": "orders"}`, `"name": "orders", "template": `+tmpl+`}`, 1)
	if spec == without {
		t.Fatal("the test's template was not put in")
	}

	rest, got, err := SplitTemplate([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != tmpl {
		t.Errorf("template %s, want the bytes given: %s", got, tmpl)
	}
	if want := decodeJSON(t, []byte(without)); !reflect.DeepEqual(decodeJSON(t, rest), want) {
		t.Errorf("rest %s, want the definition without its template: %s", rest, without)
	}
	if err := json.Unmarshal(rest, new(map[string]any)); err != nil || !json.Valid(rest) {
		t.Errorf("rest %s is not a JSON object: %v", rest, err)
	}
	// The template is one a StatefulSet can be made of.
	if _, err := ParseTemplate("orders", kube.Ref{Namespace: "db", Name: "orders"}, got); err != nil {
		t.Errorf("ParseTemplate of the split template: %v", err)
	}

	// statefulset keeps no other key: it stays, empty.
	rest, got, err = SplitTemplate([]byte(`{"name": "orders", "statefulset": {"template": ` + tmpl + `}}`))
	if err != nil || string(got) != tmpl {
		t.Fatalf("SplitTemplate = %s, %s, %v; want the template", rest, got, err)
	}
	if want := decodeJSON(t, []byte(`{"name": "orders", "statefulset": {}}`)); !reflect.DeepEqual(decodeJSON(t, rest), want) {
		t.Errorf("rest %s, want {\"name\": \"orders\", \"statefulset\": {}}", rest)
	}
}

// "template": null is no template, and is taken out too.
func TestSplitTemplateNull(t *testing.T) {
	for _, null := range []string{`null`, ` null `} {
		spec := `{"name": "orders", "statefulset": {"name": "orders", "template":` + null + `}}`
		rest, tmpl, err := SplitTemplate([]byte(spec))
		if err != nil || tmpl != nil {
			t.Fatalf("SplitTemplate(%s) = %q, %q, %v; want no template, nil", spec, rest, tmpl, err)
		}
		if want := decodeJSON(t, []byte(`{"name": "orders", "statefulset": {"name": "orders"}}`)); !reflect.DeepEqual(decodeJSON(t, rest), want) {
			t.Errorf("rest %s, want the definition without template", rest)
		}
	}
}

// With a template, the body is read as strictly as a set's decoder reads
// it: a key given twice anywhere is refused (a map keeps only the last).
func TestSplitTemplateDuplicateKeys(t *testing.T) {
	for name, tc := range map[string]struct{ spec, key string }{
		"top level":                           {`{"name": "a", "name": "b", "statefulset": {"template": {}}}`, `"name"`},
		"statefulset, first without template": {`{"statefulset": {"name": "x"}, "statefulset": {"template": {}}}`, `"statefulset"`},
		"in statefulset":                      {`{"statefulset": {"name": "a", "template": {}, "name": "b"}}`, `"statefulset.name"`},
		"template twice":                      {`{"statefulset": {"template": {"spec": {}}, "template": null}}`, `"statefulset.template"`},
		"in the template":                     {`{"statefulset": {"template": {"spec": {"replicas": 1, "replicas": 2}}}}`, `"statefulset.template.spec.replicas"`},
		"deep in the template": {`{"statefulset": {"template": {"spec": {"template": {"spec": {"containers": [{"name": "a", "name": "b"}]}}}}}}`,
			`"statefulset.template.spec.template.spec.containers[0].name"`},
		"elsewhere": {`{"match": {"headers": {"x": "1", "x": "2"}}, "statefulset": {"template": {}}}`, `"match.headers.x"`},
	} {
		t.Run(name, func(t *testing.T) {
			rest, tmpl, err := SplitTemplate([]byte(tc.spec))
			if err == nil || rest != nil || tmpl != nil {
				t.Fatalf("SplitTemplate(%s) = %q, %q, %v; want an error and nothing else", tc.spec, rest, tmpl, err)
			}
			if !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), "twice") {
				t.Errorf("error %q does not name the key %s given twice", err, tc.key)
			}
		})
	}
}

// template is the JSON of a StatefulSet template, changed by edits: each
// sets (or, with a nil value, removes) the value at a dotted path.
func template(t *testing.T, edits map[string]any) []byte {
	t.Helper()
	var m map[string]any
	base := `{"metadata": {"labels": {"team": "a"}},
		"spec": {"template": {"metadata": {"labels": {"app": "orders"}},
			"spec": {"containers": [{"name": "db", "image": "postgres:17"}]}}}}`
	if err := json.Unmarshal([]byte(base), &m); err != nil {
		t.Fatal(err)
	}
	for _, path := range slices.Sorted(maps.Keys(edits)) {
		keys := strings.Split(path, ".")
		at := m
		for _, k := range keys[:len(keys)-1] {
			next, ok := at[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				at[k] = next
			}
			at = next
		}
		if v := edits[path]; v == nil {
			delete(at, keys[len(keys)-1])
		} else {
			at[keys[len(keys)-1]] = v
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var ordersRef = kube.Ref{Namespace: testNS, Name: "orders"}

// ParseTemplate fills what a template may leave out.
func TestParseTemplateDefaults(t *testing.T) {
	raw := template(t, map[string]any{
		"kind": "StatefulSet", "apiVersion": "apps/v1",
		"metadata.uid": "stale-uid", "metadata.resourceVersion": "42",
		"metadata.annotations": map[string]any{"note": "kept"},
	})
	sts, err := ParseTemplate("orders-set", ordersRef, raw)
	if err != nil {
		t.Fatal(err)
	}
	if sts.Kind != "" || sts.APIVersion != "" {
		t.Errorf("type meta %q %q, want none (the typed client sets it)", sts.Kind, sts.APIVersion)
	}
	if sts.Name != "orders" || sts.Namespace != testNS {
		t.Errorf("StatefulSet %s/%s, want %s", sts.Namespace, sts.Name, ordersRef)
	}
	if sts.UID != "" || sts.ResourceVersion != "" {
		t.Errorf("uid %q resourceVersion %q, want none", sts.UID, sts.ResourceVersion)
	}
	if sts.Spec.ServiceName != "orders" {
		t.Errorf("spec.serviceName %q, want the StatefulSet's name", sts.Spec.ServiceName)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Errorf("spec.replicas %v, want 1", sts.Spec.Replicas)
	}
	wantSel := &metav1.LabelSelector{MatchLabels: map[string]string{kube.LabelSet: "orders-set"}}
	if !reflect.DeepEqual(sts.Spec.Selector, wantSel) {
		t.Errorf("spec.selector %+v, want %+v", sts.Spec.Selector, wantSel)
	}
	if want := map[string]string{"app": "orders", kube.LabelSet: "orders-set"}; !maps.Equal(sts.Spec.Template.Labels, want) {
		t.Errorf("pod template labels %v, want %v", sts.Spec.Template.Labels, want)
	}
	if want := map[string]string{"team": "a", kube.LabelManagedBy: kube.ManagedBy, kube.LabelSet: "orders-set"}; !maps.Equal(sts.Labels, want) {
		t.Errorf("labels %v, want %v", sts.Labels, want)
	}
	if !ownedBySet(sts, "orders-set") || ownedBySet(sts, "orders") {
		t.Error("ownedBySet: the parsed StatefulSet is not the set's alone")
	}
	if want := map[string]string{"note": "kept"}; !maps.Equal(sts.Annotations, want) {
		t.Errorf("annotations %v, want %v", sts.Annotations, want)
	}
	if c := sts.Spec.Template.Spec.Containers; len(c) != 1 || c[0].Name != "db" || c[0].Image != "postgres:17" {
		t.Errorf("containers %+v, want the template's", c)
	}

	// A template without any labels gets the selector's on its pods, and
	// keyway's on the StatefulSet.
	sts, err = ParseTemplate("orders", ordersRef, template(t, map[string]any{"metadata": nil, "spec.template.metadata": nil}))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{kube.LabelSet: "orders"}; !maps.Equal(sts.Spec.Template.Labels, want) {
		t.Errorf("pod template labels %v, want %v", sts.Spec.Template.Labels, want)
	}
	if want := map[string]string{kube.LabelManagedBy: kube.ManagedBy, kube.LabelSet: "orders"}; !maps.Equal(sts.Labels, want) {
		t.Errorf("labels %v, want %v", sts.Labels, want)
	}

	// keyway's labels win over the template's own values for them.
	sts, err = ParseTemplate("orders", ordersRef, template(t, map[string]any{
		"metadata.labels": map[string]any{kube.LabelManagedBy: "helm", kube.LabelSet: "payments"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !ownedBySet(sts, "orders") {
		t.Errorf("labels %v, want keyway's for orders", sts.Labels)
	}
}

// What the template gives is kept: the name and namespace when equal to
// the ref's, spec.serviceName, spec.replicas (0 too), a selector its pods
// carry (the set's label is then not added to them).
func TestParseTemplateKeeps(t *testing.T) {
	raw := template(t, map[string]any{
		"metadata.name": "orders", "metadata.namespace": testNS,
		"spec.serviceName": "orders-headless",
		"spec.replicas":    0,
		"spec.selector":    map[string]any{"matchLabels": map[string]any{"app": "orders"}},
	})
	sts, err := ParseTemplate("orders", ordersRef, raw)
	if err != nil {
		t.Fatal(err)
	}
	if sts.Spec.ServiceName != "orders-headless" {
		t.Errorf("spec.serviceName %q, want orders-headless", sts.Spec.ServiceName)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 0 {
		t.Errorf("spec.replicas %v, want 0", sts.Spec.Replicas)
	}
	if want := map[string]string{"app": "orders"}; !maps.Equal(sts.Spec.Selector.MatchLabels, want) || len(sts.Spec.Selector.MatchExpressions) != 0 {
		t.Errorf("spec.selector %+v, want matchLabels %v", sts.Spec.Selector, want)
	}
	if want := map[string]string{"app": "orders"}; !maps.Equal(sts.Spec.Template.Labels, want) {
		t.Errorf("pod template labels %v, want %v", sts.Spec.Template.Labels, want)
	}
}

// Each refusal names its field under statefulset.template; all of a
// template's problems are reported at once.
func TestParseTemplateRefused(t *testing.T) {
	for name, tc := range map[string]struct {
		raw  string         // the template; "" for template(edits)
		edit map[string]any // edits of the default template
		want []string       // each in the error
	}{
		"kind": {edit: map[string]any{"kind": "Deployment"},
			want: []string{`statefulset.template.kind: "Deployment"`}},
		"apiVersion": {edit: map[string]any{"apiVersion": "apps/v1beta1"},
			want: []string{`statefulset.template.apiVersion: "apps/v1beta1"`}},
		"another name": {edit: map[string]any{"metadata.name": "payments"},
			want: []string{`statefulset.template.metadata.name: "payments", but statefulset.name is "orders"`}},
		"another namespace": {edit: map[string]any{"metadata.namespace": "other"},
			want: []string{`statefulset.template.metadata.namespace: "other"`, `"` + testNS + `"`}},
		"no containers": {edit: map[string]any{"spec.template.spec.containers": []any{}},
			want: []string{"statefulset.template.spec.template.spec.containers: none"}},
		"no pod spec": {edit: map[string]any{"spec.template": nil},
			want: []string{"statefulset.template.spec.template.spec.containers: none"}},
		"negative replicas": {edit: map[string]any{"spec.replicas": -1},
			want: []string{"statefulset.template.spec.replicas: -1"}},
		"selector with matchExpressions": {edit: map[string]any{"spec.selector": map[string]any{
			"matchLabels":      map[string]any{"app": "orders"},
			"matchExpressions": []any{map[string]any{"key": "app", "operator": "Exists"}}}},
			want: []string{"statefulset.template.spec.selector:"}},
		"selector with matchExpressions only": {edit: map[string]any{"spec.selector": map[string]any{
			"matchExpressions": []any{map[string]any{"key": "app", "operator": "Exists"}}}},
			want: []string{"statefulset.template.spec.selector:"}},
		"selector with empty matchLabels": {edit: map[string]any{"spec.selector": map[string]any{"matchLabels": map[string]any{}}},
			want: []string{"statefulset.template.spec.selector:"}},
		"empty selector": {edit: map[string]any{"spec.selector": map[string]any{}},
			want: []string{"statefulset.template.spec.selector:"}},
		"pods without a selector label": {edit: map[string]any{"spec.selector": map[string]any{"matchLabels": map[string]any{"app": "orders", "tier": "db"}}},
			want: []string{"statefulset.template.spec.template.metadata.labels: tier=db is missing"}},
		"pods with another value": {edit: map[string]any{"spec.selector": map[string]any{"matchLabels": map[string]any{"app": "payments"}}},
			want: []string{"statefulset.template.spec.template.metadata.labels: app=payments is missing"}},
		"all at once": {edit: map[string]any{"kind": "Deployment", "spec.replicas": -2, "spec.template.spec.containers": nil},
			want: []string{"statefulset.template.kind:", "statefulset.template.spec.replicas: -2", "statefulset.template.spec.template.spec.containers: none"}},

		"unknown key in spec": {edit: map[string]any{"spec.replicaz": 3},
			want: []string{"statefulset.template: unknown field", `"spec.replicaz"`}},
		"unknown key at the top": {edit: map[string]any{"specs": map[string]any{}},
			want: []string{"statefulset.template: unknown field", `"specs"`}},
		"unknown key in metadata": {edit: map[string]any{"metadata.label": map[string]any{}},
			want: []string{"statefulset.template: unknown field", `"metadata.label"`}},
		"unknown key in a container": {edit: map[string]any{"spec.template.spec.containers": []any{map[string]any{"name": "db", "imag": "postgres"}}},
			want: []string{"statefulset.template: unknown field", `"spec.template.spec.containers[0].imag"`}},
		"wrong type": {edit: map[string]any{"spec.replicas": "3"},
			want: []string{"statefulset.template: not a StatefulSet manifest", "spec.replicas"}},
		"not an object": {raw: `["StatefulSet"]`,
			want: []string{"statefulset.template: not a StatefulSet manifest"}},
		"not JSON": {raw: `{"spec": `,
			want: []string{"statefulset.template: not a StatefulSet manifest"}},
	} {
		t.Run(name, func(t *testing.T) {
			raw := []byte(tc.raw)
			if tc.raw == "" {
				raw = template(t, tc.edit)
			}
			sts, err := ParseTemplate("orders", ordersRef, raw)
			if err == nil || sts != nil {
				t.Fatalf("ParseTemplate(%s) = %v, %v; want an error", raw, sts, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "statefulset.template") {
					t.Errorf("error line %q does not start with statefulset.template", line)
				}
			}
		})
	}
}

// ParseTemplate reads keys as the API server does: by their exact names
// (a key in another case is unknown, and a second spelling of a key is
// not a silent override), and an unknown key's error gives its path under
// statefulset.template, as the other errors do.
func TestParseTemplateStrictAsAPIServer(t *testing.T) {
	containers := map[string]any{"containers": []any{map[string]any{"name": "db", "image": "postgres:17"}}}
	for name, tc := range map[string]struct {
		raw  map[string]any
		want string
	}{
		"key in another case": {map[string]any{"Spec": map[string]any{"template": map[string]any{"spec": containers}}}, `"Spec"`},
		"key in two cases": {map[string]any{"spec": map[string]any{"replicas": 1, "Replicas": 5, "template": map[string]any{"spec": containers}}},
			`spec.Replicas`},
		"unknown key's path": {map[string]any{"spec": map[string]any{"replicaz": 3, "template": map[string]any{"spec": containers}}},
			`spec.replicaz`},
	} {
		t.Run(name, func(t *testing.T) {
			raw, err := json.Marshal(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			sts, err := ParseTemplate("orders", ordersRef, raw)
			if err == nil {
				t.Fatalf("ParseTemplate(%s) = replicas %d, nil; want an error", raw, *sts.Spec.Replicas)
			}
			if !strings.HasPrefix(err.Error(), "statefulset.template") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one under statefulset.template naming %s", err, tc.want)
			}
		})
	}
}

// createFake is client-go's fake clientset plus what the API server does
// and the fake's tracker does not, for Create and DeleteOwned: a created
// object gets a UID, and a delete whose UID precondition is not the
// stored object's is a 409 Conflict. The reactors run under the fake's
// lock: they use the tracker, never the clientset.
type createFake struct {
	*fake.Clientset
	uids int
}

func newCreateFake(objs ...runtime.Object) *createFake {
	f := &createFake{Clientset: fake.NewSimpleClientset(objs...)}
	f.PrependReactor("create", "*", f.create)
	f.PrependReactor("delete", "*", f.delete)
	return f
}

var svcGVR = corev1.SchemeGroupVersion.WithResource("services")

// create gives the object a UID, on the action's copy, and goes on to the
// tracker.
func (f *createFake) create(a k8stesting.Action) (bool, runtime.Object, error) {
	m, err := meta.Accessor(a.(k8stesting.CreateAction).GetObject())
	if err != nil {
		return true, nil, err
	}
	f.uids++
	m.SetUID(types.UID(fmt.Sprintf("%s-%s-%d", a.GetResource().Resource, m.GetName(), f.uids)))
	return false, nil, nil
}

func (f *createFake) delete(a k8stesting.Action) (bool, runtime.Object, error) {
	d := a.(k8stesting.DeleteAction)
	pre := d.GetDeleteOptions().Preconditions
	if pre == nil || pre.UID == nil {
		return false, nil, nil
	}
	obj, err := f.Tracker().Get(a.GetResource(), a.GetNamespace(), d.GetName())
	if err != nil {
		return false, nil, nil // the tracker's NotFound
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return true, nil, err
	}
	if m.GetUID() != *pre.UID {
		return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), d.GetName(),
			fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", *pre.UID, m.GetUID()))
	}
	return false, nil, nil
}

func (f *createFake) service(t *testing.T, name string) (*corev1.Service, bool) {
	t.Helper()
	obj, err := f.Tracker().Get(svcGVR, testNS, name)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*corev1.Service), true
}

func (f *createFake) statefulSet(t *testing.T, name string) (*appsv1.StatefulSet, bool) {
	t.Helper()
	obj, err := f.Tracker().Get(stsGVR, testNS, name)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*appsv1.StatefulSet), true
}

// calls lists the API calls of a verb, as "verb resource ns/name".
func (f *createFake) calls(verb string) []string {
	var out []string
	for _, a := range f.Actions() {
		if a.GetVerb() != verb {
			continue
		}
		name := ""
		switch a := a.(type) {
		case k8stesting.CreateAction:
			m, _ := meta.Accessor(a.GetObject())
			name = m.GetName()
		case k8stesting.DeleteAction:
			name = a.GetName()
		case k8stesting.GetAction:
			name = a.GetName()
		}
		out = append(out, verb+" "+a.GetResource().Resource+" "+a.GetNamespace()+"/"+name)
	}
	return out
}

// deletes returns the delete calls' options, in order.
func (f *createFake) deletes() []metav1.DeleteOptions {
	var out []metav1.DeleteOptions
	for _, a := range f.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok {
			out = append(out, d.GetDeleteOptions())
		}
	}
	return out
}

// newCreateController is a Controller on f in testNS, whose events go to
// the returned func's result.
func newCreateController(t *testing.T, f *createFake) (*Controller, func() []event) {
	t.Helper()
	cfg := kube.DefaultConfig()
	cfg.Namespace = testNS
	var mu sync.Mutex
	var events []event
	c, err := New(Options{Client: f, Config: cfg, Identity: "me", Logger: zaptest.NewLogger(t),
		Replicas: func(string) map[string]Replica { return nil },
		Event: func(set string, fields map[string]any) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, event{set, fields})
		}})
	if err != nil {
		t.Fatal(err)
	}
	return c, func() []event {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
}

// parsed is the StatefulSet of set "orders" (ns/orders) from the default
// template, changed by edits.
func parsed(t *testing.T, edits map[string]any) *appsv1.StatefulSet {
	t.Helper()
	sts, err := ParseTemplate("orders", ordersRef, template(t, edits))
	if err != nil {
		t.Fatal(err)
	}
	return sts
}

// checkPrecondition checks a delete's options: the object's UID as
// precondition, background propagation.
func checkPrecondition(t *testing.T, opts metav1.DeleteOptions, uid types.UID) {
	t.Helper()
	if opts.Preconditions == nil || opts.Preconditions.UID == nil || *opts.Preconditions.UID != uid {
		t.Errorf("delete preconditions %+v, want UID %q", opts.Preconditions, uid)
	}
	if opts.PropagationPolicy == nil || *opts.PropagationPolicy != metav1.DeletePropagationBackground {
		t.Errorf("delete propagation %v, want Background", opts.PropagationPolicy)
	}
}

// Create makes the headless Service, then the StatefulSet naming it;
// Undo deletes both, the StatefulSet first.
func TestCreate(t *testing.T) {
	f := newCreateFake()
	c, _ := newCreateController(t, f)
	sts := parsed(t, map[string]any{"spec.serviceName": "orders-hl", "metadata.annotations": map[string]any{"note": "kept"}})
	before := sts.DeepCopy()

	created, err := c.Create(t.Context(), "orders", sts)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sts, before) {
		t.Error("Create changed the StatefulSet it was given")
	}
	if want := []string{"create services ns/orders-hl", "create statefulsets ns/orders"}; !slices.Equal(f.calls("create"), want) {
		t.Errorf("creates %v, want %v", f.calls("create"), want)
	}
	for _, a := range f.Actions() {
		if ca, ok := a.(k8stesting.CreateActionImpl); ok && ca.CreateOptions.FieldManager != "keyway" {
			t.Errorf("%s: field manager %q, want keyway", ca.GetResource().Resource, ca.CreateOptions.FieldManager)
		}
	}

	svc, ok := f.service(t, "orders-hl")
	if !ok {
		t.Fatal("no Service ns/orders-hl")
	}
	if svc.UID == "" {
		t.Fatal("the fake gave the Service no UID")
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service clusterIP %q, want None (headless)", svc.Spec.ClusterIP)
	}
	if !maps.Equal(svc.Spec.Selector, sts.Spec.Selector.MatchLabels) {
		t.Errorf("Service selector %v, want the StatefulSet's matchLabels %v", svc.Spec.Selector, sts.Spec.Selector.MatchLabels)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Error("Service does not publish not-ready addresses")
	}
	if want := map[string]string{kube.LabelManagedBy: kube.ManagedBy, kube.LabelSet: "orders"}; !maps.Equal(svc.Labels, want) {
		t.Errorf("Service labels %v, want %v", svc.Labels, want)
	}

	got, ok := f.statefulSet(t, "orders")
	if !ok {
		t.Fatal("no StatefulSet ns/orders")
	}
	if want := map[string]string{kube.AnnotationService: "orders-hl/" + string(svc.UID), "note": "kept"}; !maps.Equal(got.Annotations, want) {
		t.Errorf("StatefulSet annotations %v, want %v", got.Annotations, want)
	}
	if !ownedBySet(got, "orders") {
		t.Errorf("StatefulSet labels %v, want keyway's for orders", got.Labels)
	}
	want := before.DeepCopy()
	want.Annotations = got.Annotations
	want.UID = got.UID
	if !reflect.DeepEqual(got, want) {
		t.Errorf("StatefulSet stored %+v, want the one given %+v", got, want)
	}

	if want := []string{"Service ns/orders-hl", "StatefulSet ns/orders"}; !slices.Equal(created.Names(), want) {
		t.Errorf("Names() = %v, want %v", created.Names(), want)
	}

	if err := created.Undo(t.Context()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"delete statefulsets ns/orders", "delete services ns/orders-hl"}; !slices.Equal(f.calls("delete"), want) {
		t.Errorf("deletes %v, want %v", f.calls("delete"), want)
	}
	if d := f.deletes(); len(d) == 2 {
		checkPrecondition(t, d[0], got.UID)
		checkPrecondition(t, d[1], svc.UID)
	}
	if _, ok := f.service(t, "orders-hl"); ok {
		t.Error("Service still there after Undo")
	}
	if _, ok := f.statefulSet(t, "orders"); ok {
		t.Error("StatefulSet still there after Undo")
	}
	// What is gone already is no error.
	if err := created.Undo(t.Context()); err != nil {
		t.Errorf("Undo again = %v, want nil", err)
	}
}

// A Service of the name is in the way: nothing is created, the Service
// stays as it is.
func TestCreateServiceExists(t *testing.T) {
	theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: testNS, UID: "theirs", Labels: map[string]string{"app": "x"}}}
	f := newCreateFake(theirs)
	c, _ := newCreateController(t, f)

	created, err := c.Create(t.Context(), "orders", parsed(t, nil))
	if err == nil || created != nil {
		t.Fatalf("Create = %v, %v; want an error", created, err)
	}
	if !strings.HasPrefix(err.Error(), "statefulset.template.spec.serviceName: Service ns/orders exists") {
		t.Errorf("error %q, want one on statefulset.template.spec.serviceName naming Service ns/orders", err)
	}
	if _, ok := f.statefulSet(t, "orders"); ok {
		t.Error("StatefulSet created")
	}
	if d := f.calls("delete"); len(d) != 0 {
		t.Errorf("deletes %v, want none", d)
	}
	if svc, ok := f.service(t, "orders"); !ok || !reflect.DeepEqual(svc, theirs) {
		t.Errorf("Service %+v, want it as it was", svc)
	}
}

// A StatefulSet of the name is in the way: the Service Create made goes
// again (Undo), the StatefulSet stays as it is.
func TestCreateStatefulSetExists(t *testing.T) {
	theirs := statefulSet("orders", 3, nil)
	f := newCreateFake(theirs)
	c, _ := newCreateController(t, f)

	created, err := c.Create(t.Context(), "orders", parsed(t, nil))
	if err == nil || created != nil {
		t.Fatalf("Create = %v, %v; want an error", created, err)
	}
	if !strings.HasPrefix(err.Error(), "statefulset: StatefulSet ns/orders exists") {
		t.Errorf("error %q, want one starting statefulset: naming StatefulSet ns/orders", err)
	}
	if _, ok := f.service(t, "orders"); ok {
		t.Error("the Service Create made is still there")
	}
	if want := []string{"delete services ns/orders"}; !slices.Equal(f.calls("delete"), want) {
		t.Errorf("deletes %v, want %v", f.calls("delete"), want)
	}
	if d := f.deletes(); len(d) == 1 {
		checkPrecondition(t, d[0], "services-orders-1")
	}
	if sts, ok := f.statefulSet(t, "orders"); !ok || !reflect.DeepEqual(sts, theirs) {
		t.Errorf("StatefulSet %+v, want it as it was", sts)
	}
}

// Other failures wrap the API's error, and do not start with
// "statefulset" (the admin API's mark of an object in the way); an Undo
// that fails is reported too.
func TestCreateFails(t *testing.T) {
	forbidden := func(resource string) k8stesting.ReactionFunc {
		return func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource(resource), "", errors.New("no RBAC"))
		}
	}
	t.Run("Service", func(t *testing.T) {
		f := newCreateFake()
		f.PrependReactor("create", "services", forbidden("services"))
		c, _ := newCreateController(t, f)
		created, err := c.Create(t.Context(), "orders", parsed(t, nil))
		if created != nil || !apierrors.IsForbidden(err) || !strings.HasPrefix(err.Error(), "Service ns/orders not created: ") {
			t.Fatalf("Create = %v, %v; want a Service not created error wrapping the 403", created, err)
		}
		if want := []string{"create services ns/orders"}; !slices.Equal(f.calls("create"), want) {
			t.Errorf("creates %v, want %v", f.calls("create"), want)
		}
	})
	t.Run("StatefulSet", func(t *testing.T) {
		f := newCreateFake()
		f.PrependReactor("create", "statefulsets", forbidden("statefulsets"))
		c, _ := newCreateController(t, f)
		created, err := c.Create(t.Context(), "orders", parsed(t, nil))
		if created != nil || !apierrors.IsForbidden(err) || !strings.HasPrefix(err.Error(), "StatefulSet ns/orders not created: ") {
			t.Fatalf("Create = %v, %v; want a StatefulSet not created error wrapping the 403", created, err)
		}
		if _, ok := f.service(t, "orders"); ok {
			t.Error("the Service Create made is still there")
		}
	})
	t.Run("StatefulSet and Undo", func(t *testing.T) {
		f := newCreateFake()
		f.PrependReactor("create", "statefulsets", forbidden("statefulsets"))
		f.PrependReactor("delete", "services", forbidden("services"))
		c, _ := newCreateController(t, f)
		created, err := c.Create(t.Context(), "orders", parsed(t, nil))
		if created != nil || err == nil {
			t.Fatalf("Create = %v, %v; want an error", created, err)
		}
		for _, w := range []string{"StatefulSet ns/orders not created", "Service ns/orders not deleted"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q", err, w)
			}
		}
		if _, ok := f.service(t, "orders"); !ok {
			t.Error("the Service is gone, though its delete was refused")
		}
	})
}

// Undo goes on past an error, and reports it.
func TestCreatedUndoError(t *testing.T) {
	f := newCreateFake()
	c, _ := newCreateController(t, f)
	created, err := c.Create(t.Context(), "orders", parsed(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	f.PrependReactor("delete", "statefulsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(errors.New("etcd down"))
	})
	err = created.Undo(t.Context())
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "StatefulSet ns/orders not deleted") {
		t.Errorf("Undo = %v, want the StatefulSet's error", err)
	}
	if _, ok := f.service(t, "orders"); ok {
		t.Error("Service still there: Undo stopped at the StatefulSet's error")
	}
	if _, ok := f.statefulSet(t, "orders"); !ok {
		t.Error("StatefulSet gone, though its delete failed")
	}
}

// An object replaced since Create (another UID) is not Create's: Undo
// leaves it, and says so.
func TestCreatedUndoReplaced(t *testing.T) {
	f := newCreateFake()
	c, _ := newCreateController(t, f)
	created, err := c.Create(t.Context(), "orders", parsed(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: testNS, UID: "theirs"}}
	if err := f.Tracker().Update(svcGVR, other, testNS); err != nil {
		t.Fatal(err)
	}
	if err := created.Undo(t.Context()); !apierrors.IsConflict(err) {
		t.Errorf("Undo = %v, want the Service's 409", err)
	}
	if svc, ok := f.service(t, "orders"); !ok || svc.UID != "theirs" {
		t.Errorf("Service %+v, want the replacement left", svc)
	}
}

// DeleteOwned deletes the StatefulSet keyway created for the set and the
// Service its annotation names, each by its UID.
func TestDeleteOwned(t *testing.T) {
	f := newCreateFake()
	c, events := newCreateController(t, f)
	if _, err := c.Create(t.Context(), "orders", parsed(t, map[string]any{"spec.serviceName": "orders-hl"})); err != nil {
		t.Fatal(err)
	}
	sts, _ := f.statefulSet(t, "orders")
	svc, _ := f.service(t, "orders-hl")
	f.ClearActions()

	deleted, err := c.DeleteOwned(t.Context(), "orders", kube.Ref{Name: "orders"}) // the namespace: Config's
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Service ns/orders-hl", "StatefulSet ns/orders"}
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	if want := []string{"delete services ns/orders-hl", "delete statefulsets ns/orders"}; !slices.Equal(f.calls("delete"), want) {
		t.Errorf("deletes %v, want %v", f.calls("delete"), want)
	}
	if d := f.deletes(); len(d) == 2 {
		checkPrecondition(t, d[0], svc.UID)
		checkPrecondition(t, d[1], sts.UID)
	}
	if _, ok := f.service(t, "orders-hl"); ok {
		t.Error("Service still there")
	}
	if _, ok := f.statefulSet(t, "orders"); ok {
		t.Error("StatefulSet still there")
	}
	evs := events()
	if len(evs) != 1 || evs[0].set != "orders" || evs[0].fields["action"] != "delete" ||
		!reflect.DeepEqual(evs[0].fields["deleted"], want) || evs[0].fields["statefulset"] != "ns/orders" {
		t.Errorf("events %+v, want one delete of %v", evs, want)
	}

	// Once gone: nothing to do.
	f.ClearActions()
	deleted, err = c.DeleteOwned(t.Context(), "orders", kube.Ref{Name: "orders"})
	if err != nil || deleted != nil {
		t.Errorf("DeleteOwned again = %v, %v; want nil, nil", deleted, err)
	}
	if d := f.calls("delete"); len(d) != 0 {
		t.Errorf("deletes %v, want none", d)
	}
}

// A StatefulSet keyway did not create for the set stays, with its
// Service; so does one that is not there.
func TestDeleteOwnedLeaves(t *testing.T) {
	theirSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: testNS, UID: "svc-uid"}}
	ann := map[string]string{kube.AnnotationService: "orders/svc-uid"}
	labelled := func(l map[string]string) *appsv1.StatefulSet {
		sts := statefulSet("orders", 3, ann)
		sts.Labels = l
		return sts
	}
	for name, sts := range map[string]*appsv1.StatefulSet{
		"no labels":       labelled(nil),
		"another manager": labelled(map[string]string{kube.LabelManagedBy: "helm", kube.LabelSet: "orders"}),
		"another set":     labelled(map[string]string{kube.LabelManagedBy: kube.ManagedBy, kube.LabelSet: "payments"}),
		"no set label":    labelled(map[string]string{kube.LabelManagedBy: kube.ManagedBy}),
		"missing":         nil,
	} {
		t.Run(name, func(t *testing.T) {
			objs := []runtime.Object{theirSvc.DeepCopy()}
			if sts != nil {
				objs = append(objs, sts)
			}
			f := newCreateFake(objs...)
			c, events := newCreateController(t, f)
			deleted, err := c.DeleteOwned(t.Context(), "orders", ordersRef)
			if err != nil || deleted != nil {
				t.Fatalf("DeleteOwned = %v, %v; want nil, nil", deleted, err)
			}
			if d := f.calls("delete"); len(d) != 0 {
				t.Errorf("deletes %v, want none", d)
			}
			if _, ok := f.service(t, "orders"); !ok {
				t.Error("Service deleted")
			}
			if _, ok := f.statefulSet(t, "orders"); ok != (sts != nil) {
				t.Errorf("StatefulSet there: %v, want %v", ok, sts != nil)
			}
			if evs := events(); len(evs) != 0 {
				t.Errorf("events %+v, want none", evs)
			}
		})
	}
}

// The ref's namespace, when it has one, is the StatefulSet's.
func TestDeleteOwnedNamespace(t *testing.T) {
	sts := statefulSet("orders", 1, nil)
	sts.Namespace = "other"
	sts.Labels = keywayLabels(nil, "orders")
	f := newCreateFake(sts)
	c, _ := newCreateController(t, f)
	deleted, err := c.DeleteOwned(t.Context(), "orders", kube.Ref{Namespace: "other", Name: "orders"})
	if err != nil || !slices.Equal(deleted, []string{"StatefulSet other/orders"}) {
		t.Errorf("DeleteOwned = %v, %v; want [StatefulSet other/orders]", deleted, err)
	}
}

// Without a usable Service annotation, only the StatefulSet goes: keyway
// does not guess which Service it made.
func TestDeleteOwnedNoServiceAnnotation(t *testing.T) {
	for name, ann := range map[string]map[string]string{
		"none":     nil,
		"no UID":   {kube.AnnotationService: "orders/"},
		"no name":  {kube.AnnotationService: "/svc-uid"},
		"no slash": {kube.AnnotationService: "orders"},
	} {
		t.Run(name, func(t *testing.T) {
			sts := statefulSet("orders", 1, ann)
			sts.Labels = keywayLabels(nil, "orders")
			svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: testNS, UID: "svc-uid", Labels: keywayLabels(nil, "orders")}}
			f := newCreateFake(sts, svc)
			c, _ := newCreateController(t, f)
			deleted, err := c.DeleteOwned(t.Context(), "orders", ordersRef)
			if err != nil || !slices.Equal(deleted, []string{"StatefulSet ns/orders"}) {
				t.Fatalf("DeleteOwned = %v, %v; want [StatefulSet ns/orders]", deleted, err)
			}
			if _, ok := f.service(t, "orders"); !ok {
				t.Error("Service deleted")
			}
		})
	}
}

// The Service the annotation names, gone already, is no error.
func TestDeleteOwnedServiceGone(t *testing.T) {
	sts := statefulSet("orders", 1, map[string]string{kube.AnnotationService: "orders/svc-uid"})
	sts.Labels = keywayLabels(nil, "orders")
	f := newCreateFake(sts)
	c, _ := newCreateController(t, f)
	deleted, err := c.DeleteOwned(t.Context(), "orders", ordersRef)
	if err != nil {
		t.Fatal(err)
	}
	// Not listed: it was gone already.
	if want := []string{"StatefulSet ns/orders"}; !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	if _, ok := f.statefulSet(t, "orders"); ok {
		t.Error("StatefulSet still there")
	}
}

// A Service of the annotation's name but another UID (replaced since)
// is not keyway's: the UID precondition refuses its delete, and it stays;
// keyway's StatefulSet goes all the same.
func TestDeleteOwnedServiceReplaced(t *testing.T) {
	sts := statefulSet("orders", 1, map[string]string{kube.AnnotationService: "orders/svc-uid"})
	sts.Labels = keywayLabels(nil, "orders")
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: testNS, UID: "theirs"}}
	f := newCreateFake(sts, svc)
	c, _ := newCreateController(t, f)
	deleted, err := c.DeleteOwned(t.Context(), "orders", ordersRef)
	if err != nil || !slices.Equal(deleted, []string{"StatefulSet ns/orders"}) {
		t.Fatalf("DeleteOwned = %v, %v; want only the StatefulSet deleted", deleted, err)
	}
	if got, ok := f.service(t, "orders"); !ok || got.UID != "theirs" {
		t.Errorf("Service %+v, want the replacement left", got)
	}
	if _, ok := f.statefulSet(t, "orders"); ok {
		t.Error("StatefulSet still there")
	}
}

// Errors: reading the StatefulSet, deleting it.
func TestDeleteOwnedErrors(t *testing.T) {
	internal := func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(errors.New("etcd down"))
	}
	newOwned := func() *createFake {
		sts := statefulSet("orders", 1, map[string]string{kube.AnnotationService: "orders/svc-uid"})
		sts.Labels = keywayLabels(nil, "orders")
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: testNS, UID: "svc-uid"}}
		return newCreateFake(sts, svc)
	}
	t.Run("get", func(t *testing.T) {
		f := newOwned()
		f.PrependReactor("get", "statefulsets", internal)
		c, _ := newCreateController(t, f)
		deleted, err := c.DeleteOwned(t.Context(), "orders", ordersRef)
		if !apierrors.IsInternalError(err) || !strings.HasPrefix(err.Error(), "StatefulSet ns/orders: ") || deleted != nil {
			t.Errorf("DeleteOwned = %v, %v; want the get's error", deleted, err)
		}
		if d := f.calls("delete"); len(d) != 0 {
			t.Errorf("deletes %v, want none", d)
		}
	})
	t.Run("delete StatefulSet", func(t *testing.T) {
		f := newOwned()
		f.PrependReactor("delete", "statefulsets", internal)
		c, _ := newCreateController(t, f)
		deleted, err := c.DeleteOwned(t.Context(), "orders", ordersRef)
		if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "StatefulSet ns/orders not deleted") {
			t.Errorf("DeleteOwned = %v, want the delete's error", err)
		}
		if want := []string{"Service ns/orders"}; !slices.Equal(deleted, want) {
			t.Errorf("deleted %v, want %v", deleted, want)
		}
	})
}
