package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kjson "sigs.k8s.io/json"

	"keyway/internal/strictjson"
	"keyway/kube"
)

// A set created at run time may carry its StatefulSet: the set's
// statefulset.template, a StatefulSet manifest (apps/v1). keyway creates
// it and its headless Service, labelled as keyway's (LabelManagedBy,
// LabelSet), and deletes them with the set. It injects nothing: the
// template carries the agent container and the credentials it mounts.

// ParseTemplate reads a StatefulSet manifest (JSON) for set, whose
// StatefulSet is ref (namespace resolved), strictly: an unknown key is an
// error. It fills what the manifest may leave out: the name and namespace
// (ref's), spec.serviceName (the StatefulSet's name), spec.replicas (1),
// the selector (LabelSet: set, also put on the pod template), and adds
// keyway's labels to the StatefulSet. Each error names its field under
// statefulset.template.
func ParseTemplate(set string, ref kube.Ref, raw []byte) (*appsv1.StatefulSet, error) {
	const at = "statefulset.template"
	// As the API server reads it: keys are case-sensitive, and an
	// unknown or repeated one is an error naming its path.
	sts := &appsv1.StatefulSet{}
	strict, err := kjson.UnmarshalStrict(raw, sts)
	if err != nil {
		return nil, fmt.Errorf("%s: not a StatefulSet manifest: %v", at, err)
	}
	var errs []error
	for _, e := range strict {
		errs = append(errs, fmt.Errorf("%s: %v; see kubectl explain statefulset", at, e))
	}
	if sts.Kind != "" && sts.Kind != "StatefulSet" {
		errs = append(errs, fmt.Errorf("%s.kind: %q; a StatefulSet template has kind StatefulSet (or none)", at, sts.Kind))
	}
	if sts.APIVersion != "" && sts.APIVersion != "apps/v1" {
		errs = append(errs, fmt.Errorf("%s.apiVersion: %q; use apps/v1 (or none)", at, sts.APIVersion))
	}
	if sts.Name != "" && sts.Name != ref.Name {
		errs = append(errs, fmt.Errorf("%s.metadata.name: %q, but statefulset.name is %q; leave it out, or make them equal", at, sts.Name, ref.Name))
	}
	if sts.Namespace != "" && sts.Namespace != ref.Namespace {
		errs = append(errs, fmt.Errorf("%s.metadata.namespace: %q, but the set's StatefulSet is in %q; leave it out, or set statefulset.namespace", at, sts.Namespace, ref.Namespace))
	}
	if len(sts.Spec.Template.Spec.Containers) == 0 {
		errs = append(errs, fmt.Errorf("%s.spec.template.spec.containers: none; the pod needs the replica and its keyway agent (docs/kubernetes.md shows a complete template)", at))
	}
	if sts.Spec.Replicas != nil && *sts.Spec.Replicas < 0 {
		errs = append(errs, fmt.Errorf("%s.spec.replicas: %d; the initial count must be 0 or more", at, *sts.Spec.Replicas))
	}
	if sel := sts.Spec.Selector; sel != nil {
		if len(sel.MatchExpressions) > 0 || len(sel.MatchLabels) == 0 {
			errs = append(errs, fmt.Errorf("%s.spec.selector: keyway's headless Service selects the pods by matchLabels only; give matchLabels and no matchExpressions, or leave the selector out", at))
		}
		for _, k := range slices.Sorted(maps.Keys(sel.MatchLabels)) {
			if v := sel.MatchLabels[k]; sts.Spec.Template.Labels[k] != v {
				errs = append(errs, fmt.Errorf("%s.spec.template.metadata.labels: %s=%s is missing; the pods must carry the selector's labels", at, k, v))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sts.Kind, sts.APIVersion = "", ""
	sts.Name, sts.Namespace = ref.Name, ref.Namespace
	sts.ResourceVersion, sts.UID = "", ""
	if sts.Spec.ServiceName == "" {
		sts.Spec.ServiceName = ref.Name
	}
	if sts.Spec.Replicas == nil {
		one := int32(1)
		sts.Spec.Replicas = &one
	}
	if sts.Spec.Selector == nil {
		sts.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{kube.LabelSet: set}}
		if sts.Spec.Template.Labels == nil {
			sts.Spec.Template.Labels = map[string]string{}
		}
		sts.Spec.Template.Labels[kube.LabelSet] = set
	}
	sts.Labels = keywayLabels(sts.Labels, set)
	return sts, nil
}

func keywayLabels(in map[string]string, set string) map[string]string {
	out := maps.Clone(in)
	if out == nil {
		out = map[string]string{}
	}
	out[kube.LabelManagedBy] = kube.ManagedBy
	out[kube.LabelSet] = set
	return out
}

// ownedBySet reports whether keyway created obj for set.
func ownedBySet(obj metav1.Object, set string) bool {
	l := obj.GetLabels()
	return l[kube.LabelManagedBy] == kube.ManagedBy && l[kube.LabelSet] == set
}

// Created is what Create made, for Undo.
type Created struct {
	c       *Controller
	objects []createdObject
}

type createdObject struct {
	kind, namespace, name string
	uid                   types.UID
}

// Names lists what was created, as kind namespace/name.
func (c *Created) Names() []string {
	var out []string
	for _, o := range c.objects {
		out = append(out, o.kind+" "+o.namespace+"/"+o.name)
	}
	return out
}

// Undo deletes what Create made (the set's record was not written).
func (c *Created) Undo(ctx context.Context) error {
	var errs []error
	for _, o := range slices.Backward(c.objects) {
		_, err := c.c.deleteObject(ctx, o)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Create makes set's StatefulSet from its parsed template (ParseTemplate)
// and the headless Service it names, both labelled as keyway's (the
// StatefulSet names the Service's UID: AnnotationService). An object in
// the way is an error that names it.
func (c *Controller) Create(ctx context.Context, set string, sts *appsv1.StatefulSet) (*Created, error) {
	if sts.Spec.Selector == nil {
		return nil, errors.New("statefulset.template: no selector; parse it with ParseTemplate first")
	}
	out := &Created{c: c}
	ns := sts.Namespace
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: sts.Spec.ServiceName, Namespace: ns, Labels: keywayLabels(nil, set)},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, Selector: maps.Clone(sts.Spec.Selector.MatchLabels),
			PublishNotReadyAddresses: true,
		},
	}
	made, err := c.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{FieldManager: "keyway"})
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil, fmt.Errorf("statefulset.template.spec.serviceName: Service %s/%s exists; name another one, or delete it", ns, svc.Name)
	case err != nil:
		return nil, fmt.Errorf("Service %s/%s not created: %w", ns, svc.Name, err)
	}
	out.objects = append(out.objects, createdObject{"Service", ns, made.Name, made.UID})
	sts = sts.DeepCopy()
	if sts.Annotations == nil {
		sts.Annotations = map[string]string{}
	}
	sts.Annotations[kube.AnnotationService] = made.Name + "/" + string(made.UID)
	madeSts, err := c.client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{FieldManager: "keyway"})
	if err != nil {
		undo := out.Undo(ctx)
		if apierrors.IsAlreadyExists(err) {
			err = fmt.Errorf("statefulset: StatefulSet %s/%s exists; to serve it as it is, leave statefulset.template out", ns, sts.Name)
		} else {
			err = fmt.Errorf("StatefulSet %s/%s not created: %w", ns, sts.Name, err)
		}
		return nil, errors.Join(err, undo)
	}
	out.objects = append(out.objects, createdObject{"StatefulSet", ns, madeSts.Name, madeSts.UID})
	return out, nil
}

// DeleteOwned deletes set's StatefulSet (its pods go with it) and the
// headless Service keyway created with it, if keyway created the
// StatefulSet for set, and returns what it deleted, as kind
// namespace/name; objects keyway did not create stay.
func (c *Controller) DeleteOwned(ctx context.Context, set string, ref kube.Ref) ([]string, error) {
	ref = ref.WithNamespace(c.ns)
	sts, err := c.client.AppsV1().StatefulSets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("StatefulSet %s: %w", ref, err)
	}
	if !ownedBySet(sts, set) {
		return nil, nil
	}
	var deleted []string
	if name, uid, ok := strings.Cut(sts.Annotations[kube.AnnotationService], "/"); ok && name != "" && uid != "" {
		// The UID precondition: only the Service keyway created (one
		// made again since under that name is someone else's, and stays).
		gone, err := c.deleteObject(ctx, createdObject{"Service", ref.Namespace, name, types.UID(uid)})
		switch {
		case err != nil && !apierrors.IsConflict(errors.Unwrap(err)):
			return deleted, err
		case gone:
			deleted = append(deleted, "Service "+ref.Namespace+"/"+name)
		}
	}
	gone, err := c.deleteObject(ctx, createdObject{"StatefulSet", ref.Namespace, ref.Name, sts.UID})
	if err != nil {
		return deleted, err
	}
	if gone {
		deleted = append(deleted, "StatefulSet "+ref.String())
	}
	c.event(set, "delete", map[string]any{"deleted": deleted, "statefulset": ref.String()})
	return deleted, nil
}

// deleteObject deletes o if it is still the object with o's UID;
// deleted is false when it was gone already.
func (c *Controller) deleteObject(ctx context.Context, o createdObject) (deleted bool, err error) {
	uid := o.uid
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}, PropagationPolicy: &bg}
	switch o.kind {
	case "Service":
		err = c.client.CoreV1().Services(o.namespace).Delete(ctx, o.name, opts)
	case "StatefulSet":
		err = c.client.AppsV1().StatefulSets(o.namespace).Delete(ctx, o.name, opts)
	default:
		return false, fmt.Errorf("unknown kind %s", o.kind)
	}
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%s %s/%s not deleted: %w", o.kind, o.namespace, o.name, err)
	}
	return true, nil
}

// SplitTemplate takes statefulset.template out of a set definition
// (JSON), returning the definition without it and the template ("" when
// there is none). A definition without one is returned as it is, for the
// set's decoder to check.
func SplitTemplate(spec []byte) (rest, template []byte, err error) {
	var top map[string]json.RawMessage
	if json.Unmarshal(spec, &top) != nil {
		return spec, nil, nil
	}
	raw, ok := top["statefulset"]
	if !ok {
		return spec, nil, nil
	}
	var sts map[string]json.RawMessage
	if json.Unmarshal(raw, &sts) != nil {
		return spec, nil, nil
	}
	tmpl, ok := sts["template"]
	if !ok {
		return spec, nil, nil
	}
	// As strict as a set's decoder: one object, no key twice (a map
	// would keep only the last).
	if err := strictjson.Check(spec); err != nil {
		return nil, nil, err
	}
	delete(sts, "template")
	b, err := json.Marshal(sts)
	if err != nil {
		return nil, nil, err
	}
	top["statefulset"] = b
	// Keys in their order: encoding/json sorts map keys, which changes
	// nothing a set's decoder reads.
	rest, err = json.Marshal(top)
	if err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(string(tmpl)) == "null" {
		return rest, nil, nil
	}
	return rest, tmpl, nil
}
