// Package kube holds the configuration of keyway's Kubernetes backend: a
// replica set may name its StatefulSet (Ref), whose spec.replicas is then
// the set's declared count, and the proxies' kubernetes section (Config)
// says how they reach the API server and elect the one proxy that acts.
// The backend itself, on client-go, is package kube/backend; this package
// imports no Kubernetes client, so that configuration stays light.
package kube

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Ref names a replica set's StatefulSet: the set's `statefulset` key. The
// zero value names none: the set's count is its own replicas key.
type Ref struct {
	// Namespace is the StatefulSet's namespace. Default "": the proxies'
	// kubernetes.namespace.
	Namespace string `yaml:"namespace" json:"namespace,omitempty"`
	// Name is the StatefulSet's name. Its pods, NAME-0 … NAME-(N-1), are
	// the set's replicas: their agents must advertise the pod name as
	// the replica name (the default: the host name).
	Name string `yaml:"name" json:"name,omitempty"`
}

// Enabled reports whether the set names a StatefulSet.
func (r Ref) Enabled() bool { return r.Name != "" }

// String is "namespace/name".
func (r Ref) String() string { return r.Namespace + "/" + r.Name }

// dns1123 is a Kubernetes object name (RFC 1123 label, as StatefulSets
// and namespaces need).
var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Validate checks the names. Each error starts with the key's name.
func (r Ref) Validate() error {
	if !r.Enabled() && r.Namespace == "" {
		return nil
	}
	var errs []error
	if r.Name == "" {
		errs = append(errs, errors.New("name: required: the StatefulSet's name, e.g. orders; or remove the statefulset section"))
	} else if len(r.Name) > 52 || !dns1123.MatchString(r.Name) {
		// 63 for a label value, less the "-NNNN…" ordinal suffix and the
		// controller-revision-hash label's room: Kubernetes caps it at 52.
		errs = append(errs, fmt.Errorf("name: %q is not a StatefulSet name: lower-case letters, digits and '-', starting and ending with a letter or digit, at most 52 characters", r.Name))
	}
	if r.Namespace != "" && (len(r.Namespace) > 63 || !dns1123.MatchString(r.Namespace)) {
		errs = append(errs, fmt.Errorf("namespace: %q is not a namespace name: lower-case letters, digits and '-', at most 63 characters", r.Namespace))
	}
	return errors.Join(errs...)
}

// WithNamespace returns r with its namespace defaulted to ns.
func (r Ref) WithNamespace(ns string) Ref {
	if r.Namespace == "" {
		r.Namespace = ns
	}
	return r
}

// Config is the proxies' kubernetes section: how they reach the API server
// and elect the proxy that drives scale-ins, restarts and repairs. It is
// used only when a set names a StatefulSet.
type Config struct {
	// Kubeconfig is the kubeconfig file keyway uses. Default "": the
	// pod's service account when keyway runs in a pod, else $KUBECONFIG,
	// else ~/.kube/config.
	Kubeconfig string `yaml:"kubeconfig"`
	// Namespace is the default namespace of the sets' StatefulSets and
	// the namespace of the Lease. Default "": the pod's namespace in a
	// pod, else the kubeconfig context's, else "default".
	Namespace string `yaml:"namespace"`
	// Lease is the name of the Lease the proxies elect the acting proxy
	// with. Default "keyway". Proxies of different fleets in one
	// namespace need different names.
	Lease string `yaml:"lease"`
	// LeaseDuration is how long a Lease holder that stopped renewing
	// keeps it: another proxy takes over at most this long after the
	// holder died. Default 15s.
	LeaseDuration time.Duration `yaml:"lease_duration"`
	// RenewDeadline is how long the holder keeps trying to renew before
	// it gives the Lease up. Default 10s; less than lease_duration.
	RenewDeadline time.Duration `yaml:"renew_deadline"`
	// RetryPeriod is how often proxies try to take or renew the Lease.
	// Default 2s; less than renew_deadline.
	RetryPeriod time.Duration `yaml:"retry_period"`
	// RetireTimeout bounds a keyway scale-in's wait for the leaving
	// replicas to drain and retire (each agent's own drain.timeout and
	// drain probe come first); after it, spec.replicas is lowered
	// anyway, and the event says which replicas had not retired.
	// Default 2m.
	RetireTimeout time.Duration `yaml:"retire_timeout"`
}

// DefaultConfig returns the kubernetes section's defaults.
func DefaultConfig() Config {
	return Config{Lease: "keyway", LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second, RetireTimeout: 2 * time.Minute}
}

// Validate checks the section. Each error starts with the key's name.
func (c Config) Validate() error {
	var errs []error
	if c.Namespace != "" && (len(c.Namespace) > 63 || !dns1123.MatchString(c.Namespace)) {
		errs = append(errs, fmt.Errorf("namespace: %q is not a namespace name: lower-case letters, digits and '-', at most 63 characters", c.Namespace))
	}
	if len(c.Lease) > 253 || !dns1123.MatchString(c.Lease) {
		errs = append(errs, fmt.Errorf("lease: %q is not a Lease name: lower-case letters, digits and '-', e.g. keyway", c.Lease))
	}
	switch {
	case c.RetryPeriod < 100*time.Millisecond:
		errs = append(errs, fmt.Errorf("retry_period: must be at least 100ms, got %s", c.RetryPeriod))
	case c.RenewDeadline <= c.RetryPeriod:
		errs = append(errs, fmt.Errorf("renew_deadline: must be more than retry_period (%s), got %s", c.RetryPeriod, c.RenewDeadline))
	case c.LeaseDuration <= c.RenewDeadline:
		errs = append(errs, fmt.Errorf("lease_duration: must be more than renew_deadline (%s), got %s", c.RenewDeadline, c.LeaseDuration))
	}
	if c.RetireTimeout < time.Second {
		errs = append(errs, fmt.Errorf("retire_timeout: must be at least 1s, got %s", c.RetireTimeout))
	}
	return errors.Join(errs...)
}

// Labels and annotations keyway puts on the Kubernetes objects.
const (
	// LabelManagedBy marks objects keyway created (value ManagedBy): only
	// those are deleted by keyway.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "keyway"
	// LabelSet names the replica set an object keyway created serves.
	LabelSet = "keyway.dev/set"
	// AnnotationScaleIn on a StatefulSet holds a keyway scale-in, as
	// "TO/FROM": spec.replicas goes from FROM down to TO. The acting
	// proxy retires the ordinals from TO up, then lowers spec.replicas to
	// TO and removes the annotation. Written with the StatefulSet's
	// resourceVersion as precondition, it survives the acting proxy: the
	// next one resumes. Once spec.replicas is not FROM (lowered, or
	// written by someone else since) it asks for nothing.
	AnnotationScaleIn = "keyway.dev/scale-in-to"
	// AnnotationService on a StatefulSet keyway created names the
	// headless Service it created with it, as "NAME/UID": deleting the
	// set deletes exactly that Service (keyway may not read Services).
	AnnotationService = "keyway.dev/service"
)
