package backend

import (
	"os"
	"strings"
	"testing"

	"keyway/config"
	"keyway/kube"
)

// The complete set definition in docs/kubernetes.md is what keyway
// create takes: it decodes as a set, and its template as a StatefulSet
// with the agent container and the credentials mount.
func TestDocTemplate(t *testing.T) {
	b, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, after, ok := strings.Cut(doc, "A complete set definition with its StatefulSet")
	if !ok {
		t.Fatal("docs/kubernetes.md: no complete set definition")
	}
	_, block, ok := strings.Cut(after, "```json\n")
	if !ok {
		t.Fatal("docs/kubernetes.md: the complete set definition has no json block")
	}
	block, _, _ = strings.Cut(block, "```")
	rest, tmpl, err := SplitTemplate([]byte(block))
	if err != nil || tmpl == nil {
		t.Fatalf("SplitTemplate: template %q, err %v", tmpl, err)
	}
	sc, err := config.DecodeSet("docs/kubernetes.md", rest)
	if err != nil {
		t.Fatal(err)
	}
	sts, err := ParseTemplate(sc.Name, sc.StatefulSet.WithNamespace("keyway"), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var agent, mount bool
	for _, c := range sts.Spec.Template.Spec.Containers {
		if len(c.Args) > 0 && c.Args[0] == "agent" {
			agent = true
			for _, m := range c.VolumeMounts {
				mount = mount || m.Name == "credentials"
			}
		}
	}
	secret := false
	for _, v := range sts.Spec.Template.Spec.Volumes {
		secret = secret || (v.Secret != nil && v.Secret.SecretName == "keyway-agent-orders-credentials")
	}
	if !agent || !mount || !secret {
		t.Fatalf("the documented template: agent container %v, credentials mounted %v, Secret volume %v", agent, mount, secret)
	}
	if sts.Labels[kube.LabelManagedBy] != kube.ManagedBy || *sts.Spec.Replicas != 3 || sts.Spec.ServiceName != "orders" {
		t.Fatalf("parsed: labels %v, replicas %d, serviceName %q", sts.Labels, *sts.Spec.Replicas, sts.Spec.ServiceName)
	}
}
