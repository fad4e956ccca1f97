package kubetest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"keyway/internal/poll"
)

// The control plane stores a StatefulSet, scales it through the scale
// subresource, and its controller makes and removes the pods.
func TestClusterScalesAStatefulSet(t *testing.T) {
	c := Start(t)
	c.Namespace(t, "kt")
	ctx := context.Background()
	_, err := c.Admin.AppsV1().StatefulSets("kt").Create(ctx, StatefulSet("orders", 2), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := func(n int) func() bool {
		return func() bool {
			l, err := c.Admin.CoreV1().Pods("kt").List(ctx, metav1.ListOptions{LabelSelector: "app=orders"})
			return err == nil && len(l.Items) == n
		}
	}
	poll.Until(t, 30*time.Second, "2 pods", pods(2))
	// The controller's status writes move resourceVersion: a write from a
	// read taken before one of them conflicts, and is read again.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		scale, err := c.Admin.AppsV1().StatefulSets("kt").GetScale(ctx, "orders", metav1.GetOptions{})
		if err != nil {
			return err
		}
		scale.Spec.Replicas = 3
		_, err = c.Admin.AppsV1().StatefulSets("kt").UpdateScale(ctx, "orders", scale, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "3 pods", pods(3))
	if err := c.MarkReady(ctx, "kt", "orders-2", true); err != nil {
		t.Fatal(err)
	}
	p, err := c.Admin.CoreV1().Pods("kt").Get(ctx, "orders-2", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
		t.Fatalf("orders-2 after MarkReady: %+v, %v", p.Status, err)
	}
}
