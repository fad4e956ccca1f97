package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"keyway/admin"
	"keyway/internal/kubetest"
	"keyway/internal/poll"
)

const kubeNS = "kw"

// kubelet plays the scheduler and the kubelet for one namespace: every pod
// is bound to kubetest.NodeName, then gets a supervising
// agent and a demo replica named like the pod, running here, and is marked
// Running and Ready once the replica answers; a pod being deleted gets its
// agent SIGTERMed (it drains), and is removed once the agent exited.
type kubelet struct {
	t    *testing.T
	c    *kubetest.Cluster
	join []string
	dir  string

	// unsupervised: each pod's agent supervises no process; the replica
	// is a second process (container) of the pod.
	unsupervised bool

	mu      sync.Mutex
	running map[types.UID]*podProc
	starts  atomic.Int64
	stop    chan struct{}
	done    chan struct{}
}

type podProc struct {
	name, addr string
	cmd        *exec.Cmd     // the agent, leader of the pod's process group
	replica    *exec.Cmd     // unsupervised: the replica, in the same group
	exited     chan struct{} // closed once every process of the pod exited
	ready      bool
	terming    bool
}

func startKubelet(t *testing.T, c *kubetest.Cluster, join []string, unsupervised bool) *kubelet {
	k := &kubelet{t: t, c: c, join: join, dir: t.TempDir(), unsupervised: unsupervised,
		running: map[types.UID]*podProc{}, stop: make(chan struct{}), done: make(chan struct{})}
	go k.loop()
	t.Cleanup(func() {
		close(k.stop)
		<-k.done
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, p := range k.running {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
	})
	return k
}

func (k *kubelet) loop() {
	defer close(k.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		k.sync()
	}
}

func (k *kubelet) sync() {
	ctx := context.Background()
	pods, err := k.c.Admin.CoreV1().Pods(kubeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	listed := map[types.UID]bool{}
	for i := range pods.Items {
		listed[pods.Items[i].UID] = true
	}
	// A pod gone from the API (deleted with no grace) loses its
	// processes, as on a kubelet.
	k.mu.Lock()
	for uid, p := range k.running {
		if !listed[uid] {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			delete(k.running, uid)
		}
	}
	k.mu.Unlock()
	for i := range pods.Items {
		pod := &pods.Items[i]
		k.mu.Lock()
		p := k.running[pod.UID]
		k.mu.Unlock()
		switch {
		case pod.DeletionTimestamp != nil && p == nil:
			k.remove(pod)
		case pod.DeletionTimestamp != nil:
			select {
			case <-p.exited:
				k.remove(pod)
				k.mu.Lock()
				delete(k.running, pod.UID)
				k.mu.Unlock()
			default:
				if !p.terming {
					// Every container of the pod at once: the agent, and
					// the replica when it is a container of its own.
					p.terming = true
					_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
				}
			}
		case p == nil && pod.Spec.NodeName == "":
			// The scheduler's part: bound, a pod is deleted gracefully
			// (an unbound one goes at once).
			_ = k.c.Bind(ctx, kubeNS, pod.Name)
		case p == nil:
			k.start(pod)
		default:
			select {
			case <-p.exited:
				// The pod's processes exited by themselves: they restart.
				k.mu.Lock()
				delete(k.running, pod.UID)
				k.mu.Unlock()
				continue
			default:
			}
			if !p.ready && replicaReady(p.addr) {
				if err := k.c.MarkReady(ctx, kubeNS, pod.Name, true); err == nil {
					p.ready = true
				}
			}
		}
	}
}

func replicaReady(addr string) bool {
	hc := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := hc.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// remove deletes a pod for good, as the kubelet does once its containers
// have stopped.
func (k *kubelet) remove(pod *corev1.Pod) {
	zero := int64(0)
	uid := pod.UID
	_ = k.c.Admin.CoreV1().Pods(kubeNS).Delete(context.Background(), pod.Name,
		metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
}

// start runs the pod's agent, supervising its demo replica (or beside it).
func (k *kubelet) start(pod *corev1.Pod) {
	addr := freeAddr(k.t)
	name := pod.Name
	args := supervisedArgs(name, addr, k.join, nil, Binary, "replica", "--name", name, "--listen", addr)
	if k.unsupervised {
		args = supervisedArgs(name, addr, k.join, nil)
		args = args[:len(args)-1] // no "--": the agent supervises nothing
	}
	n := k.starts.Add(1)
	logf, err := os.Create(filepath.Join(k.dir, fmt.Sprintf("%s.%d.log", name, n)))
	if err != nil {
		k.t.Error(err)
		return
	}
	cmd := exec.Command(Binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		k.t.Error(err)
		logf.Close()
		return
	}
	p := &podProc{name: name, addr: addr, cmd: cmd, exited: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { _ = cmd.Wait() })
	if k.unsupervised {
		rep := exec.Command(Binary, "replica", "--name", name, "--listen", addr)
		rep.Stdout, rep.Stderr = logf, logf
		rep.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: cmd.Process.Pid}
		if err := rep.Start(); err != nil {
			k.t.Error(err)
		} else {
			p.replica = rep
			wg.Go(func() { _ = rep.Wait() })
		}
	}
	go func() { wg.Wait(); logf.Close(); close(p.exited) }()
	k.mu.Lock()
	k.running[pod.UID] = p
	k.mu.Unlock()
	_ = k.c.MarkReady(context.Background(), kubeNS, pod.Name, false)
}

// proc returns the processes of the pod named name.
func (k *kubelet) proc(name string) *podProc {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.running {
		if p.name == name && !p.terming {
			return p
		}
	}
	return nil
}

// keywayRBAC creates what deploy/kubernetes/rbac.yaml grants, bound to
// the user keyway authenticates as.
func keywayRBAC(t *testing.T, c *kubetest.Cluster) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", "kubernetes", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.Role
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			t.Fatal(err)
		}
		if kind.Kind == "Role" {
			role = &rbacv1.Role{}
			if err := yaml.Unmarshal([]byte(doc), role); err != nil {
				t.Fatal(err)
			}
		}
	}
	if role == nil {
		t.Fatal("deploy/kubernetes/rbac.yaml has no Role")
	}
	ctx := context.Background()
	if _, err := c.Admin.RbacV1().Roles(kubeNS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "keyway"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: kubetest.KeywayUser}}}
	if _, err := c.Admin.RbacV1().RoleBindings(kubeNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func kubeProxyYAML(kubeconfig string, join []string) string {
	return kubeProxyYAMLSets(kubeconfig, join, `replica_sets:
  - name: orders
    statefulset: {name: orders}
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 5s, idle: 30s}
`)
}

// kubeProxyYAMLSets is a proxy's configuration with the replica_sets
// section sets ("" for none).
func kubeProxyYAMLSets(kubeconfig string, join []string, sets string) string {
	return fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
gossip:
  enabled: true
  %s
kubernetes:
  kubeconfig: %s
  namespace: %s
  lease_duration: 3s
  renew_deadline: 2s
  retry_period: 500ms
%s`, gossipYAML(join, "  "), kubeconfig, kubeNS, sets)
}

func specReplicas(t *testing.T, c *kubetest.Cluster) int {
	sts, err := c.Admin.AppsV1().StatefulSets(kubeNS).Get(context.Background(), "orders", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return int(*sts.Spec.Replicas)
}

func kubeJobs(t *testing.T, p *ProxyProc) admin.JobsStatus {
	t.Helper()
	st, ok := jobsOf(p.Admin)
	if !ok || st.Kubernetes == nil {
		t.Fatalf("%s: no jobs answer with a kubernetes section: %+v", p.Name, st)
	}
	return st
}

// scaleSet runs keyway scale against a proxy.
func scaleSet(t *testing.T, p *ProxyProc, n int) {
	t.Helper()
	cli(t, "scale", "--admin", p.Admin, "--set", "orders", "--replicas", fmt.Sprint(n))
}

// kubeStack starts a control plane with keyway's namespace and RBAC,
// a StatefulSet orders of 3 when orders3, two proxies from proxyYAML
// (given the kubeconfig and the gossip seeds) and the test kubelet.
func kubeStack(t *testing.T, orders3, unsupervised bool, proxyYAML func(kubeconfig string, join []string) string) (*kubetest.Cluster, *ProxyProc, *ProxyProc, *kubelet) {
	t.Helper()
	c := kubetest.Start(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret") // inherited by the proxies and the CLI
	c.Namespace(t, kubeNS)
	keywayRBAC(t, c)
	if orders3 {
		if _, err := c.Admin.AppsV1().StatefulSets(kubeNS).Create(context.Background(), kubetest.StatefulSet("orders", 3), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kc := c.Kubeconfig(t, c.KeywayToken)
	a := StartProxyFile(t, "proxy-a", WriteFile(t, t.TempDir(), "a.yaml", proxyYAML(kc, nil)))
	b := StartProxyFile(t, "proxy-b", WriteFile(t, t.TempDir(), "b.yaml", proxyYAML(kc, []string{a.Gossip})))
	kl := startKubelet(t, c, []string{a.Gossip, b.Gossip}, unsupervised)
	return c, a, b, kl
}

// kubectlScale writes the scale subresource as kubectl scale does, as the
// cluster's admin.
func kubectlScale(t *testing.T, c *kubetest.Cluster, n int) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sc, err := c.Admin.AppsV1().StatefulSets(kubeNS).GetScale(context.Background(), "orders", metav1.GetOptions{})
		if err != nil {
			return err
		}
		sc.Spec.Replicas = int32(n)
		_, err = c.Admin.AppsV1().StatefulSets(kubeNS).UpdateScale(context.Background(), "orders", sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ringSize is the number of replicas on a proxy's ring for orders.
func ringSize(t *testing.T, p *ProxyProc) float64 {
	return Metric(p.Admin, "keyway_ring_replicas", map[string]string{"set": "orders"})
}

// A set on a StatefulSet, through two proxies at 300 req/s: keyway scales
// it out (3 → 5) and in (5 → 2), each through another proxy. No request
// fails, every key is on its owner after each step, and no key waits on a
// stand-in after the scale-in: the leaving pods retired (drained and left
// for good) before spec.replicas went down.
func TestKubernetesScale(t *testing.T) {
	c, a, b, _ := kubeStack(t, true, false, kubeProxyYAML)

	a.WaitRotation(t, 3, 60*time.Second)
	b.WaitRotation(t, 3, 60*time.Second)
	cl := NewClient()
	keys := Keys(200)
	owners := waitRoutes(t, cl, keys, 3, 60*time.Second, a, b)
	for _, p := range []*ProxyProc{a, b} {
		if st := kubeJobs(t, p); st.Kubernetes == nil || st.Kubernetes.Replicas != 3 || len(st.Jobs) != 3 || st.Kubernetes.Acting == "" {
			t.Fatalf("%s jobs: %+v", p.Name, st)
		}
	}
	// The load goes through both proxies, or only through one once it is
	// set.
	var only atomic.Pointer[ProxyProc]
	var flip atomic.Int64
	load := StartLoad(func() string {
		if p := only.Load(); p != nil {
			return p.Addr
		}
		if flip.Add(1)%2 == 0 {
			return b.Addr
		}
		return a.Addr
	}, keys, nil, 300)
	stopped := false
	defer func() {
		if !stopped {
			load.Stop()
		}
	}()
	step := func(what string, n int, proxies ...*ProxyProc) {
		t.Helper()
		for _, p := range proxies {
			p.WaitRotation(t, n, 60*time.Second)
		}
		owners = waitRoutes(t, cl, keys, n, 60*time.Second, proxies...)
		for _, p := range proxies {
			poll.Until(t, 30*time.Second, fmt.Sprintf("%s: %s: %d replicas on the ring", p.Name, what, n), func() bool { return ringSize(t, p) == float64(n) })
		}
		if sent, failed := load.Counts(); failed > 0 {
			_, failures := load.Stop()
			stopped = true
			t.Fatalf("after %s: %d of %d requests failed: %s", what, failed, sent, failures)
		}
	}

	// keyway scale 3 → 5, then 5 → 2.
	scaleSet(t, a, 5)
	poll.Until(t, 10*time.Second, "spec.replicas 5", func() bool { return specReplicas(t, c) == 5 })
	step("scale to 5", 5, a, b)
	scaleSet(t, b, 2)
	step("scale to 2", 2, a, b)
	poll.Until(t, 30*time.Second, "spec.replicas 2", func() bool { return specReplicas(t, c) == 2 })

	// Someone else scales (kubectl scale, an HPA): 2 → 4, then 4 → 3.
	kubectlScale(t, c, 4)
	step("kubectl scale to 4", 4, a, b)
	kubectlScale(t, c, 3)
	step("kubectl scale to 3", 3, a, b)

	// The acting proxy dies during a scale-in: it is stopped (SIGSTOP)
	// before the scale-in is asked, so that only the other one can carry
	// it out once it has taken the Lease over, then killed.
	holder, survivor := a, b
	if !kubeJobs(t, a).Kubernetes.ActingHere {
		holder, survivor = b, a
	}
	if !kubeJobs(t, holder).Kubernetes.ActingHere {
		t.Fatal("neither proxy acts")
	}
	only.Store(survivor)
	poll.Until(t, 5*time.Second, "the load off "+holder.Name, func() bool {
		return Metric(holder.Admin, "keyway_inflight_requests", nil) == 0
	})
	if err := syscall.Kill(holder.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	scaleSet(t, survivor, 2)
	holder.Kill(t)
	step("scale to 2 with the acting proxy killed", 2, survivor)
	poll.Until(t, 30*time.Second, "spec.replicas 2 written by "+survivor.Name, func() bool { return specReplicas(t, c) == 2 })
	if k := kubeJobs(t, survivor).Kubernetes; !k.ActingHere {
		t.Fatalf("%s does not act after %s died: %+v", survivor.Name, holder.Name, k)
	}

	stopped = true
	sent, failures := load.Stop()
	t.Logf("%d requests, failures: %q", sent, failures)
	if failures != "" {
		t.Fatalf("failed requests: %s", failures)
	}
	_ = owners
}

// podUIDs maps the pods of orders to their UIDs.
func podUIDs(t *testing.T, c *kubetest.Cluster) map[string]types.UID {
	t.Helper()
	pods, err := c.Admin.CoreV1().Pods(kubeNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p.UID
		}
	}
	return out
}

// A set on a StatefulSet whose agents supervise no process (the replica
// is a container of its own), behind two proxies. keyway restart, under
// load through both, drains each
// replica, deletes its pod and waits until it is back in rotation under
// the same name: no request fails. keyway repair deletes a pod in
// CrashLoopBackOff, and it comes back.
func TestKubernetesRestartRepair(t *testing.T) {
	c, a, b, kl := kubeStack(t, true, true, kubeProxyYAML)
	ctx := context.Background()
	a.WaitRotation(t, 3, 60*time.Second)
	b.WaitRotation(t, 3, 60*time.Second)
	cl := NewClient()
	keys := Keys(200)
	waitRoutes(t, cl, keys, 3, 60*time.Second, a, b)
	before := podUIDs(t, c)

	var flip atomic.Int64
	load := StartLoad(func() string {
		if flip.Add(1)%2 == 0 {
			return b.Addr
		}
		return a.Addr
	}, keys, nil, 300)
	out := cli(t, "restart", "--admin", a.Admin, "--set", "orders")
	sent, failures := load.Stop()
	t.Logf("restart, %d requests:\n%s", sent, out)
	if failures != "" {
		t.Fatalf("failed requests during the restart: %s", failures)
	}
	after := podUIDs(t, c)
	for name, uid := range before {
		if after[name] == "" || after[name] == uid {
			t.Fatalf("pod %s: uid %s before the restart, %q after: not made again", name, uid, after[name])
		}
	}
	if !strings.Contains(out, "deleting pod orders-2") {
		t.Fatalf("the restart did not say it deleted the pods:\n%s", out)
	}

	// orders-1's replica crashes, and its pod is in CrashLoopBackOff.
	p := kl.proc("orders-1")
	if p == nil || p.replica == nil {
		t.Fatal("no replica process for orders-1")
	}
	_ = p.replica.Process.Kill()
	pod, err := c.Admin.CoreV1().Pods(kubeNS).Get(ctx, "orders-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubetest.SetStatus(pod, corev1.PodRunning, false, 4, "CrashLoopBackOff")
	if _, err := c.Admin.CoreV1().Pods(kubeNS).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "orders-1 failed in jobs", func() bool {
		for _, j := range kubeJobs(t, a).Jobs {
			if j.Replica == "orders-1" {
				return j.State == "failed" && j.PodReason == "CrashLoopBackOff" && j.PodRestarts == 4
			}
		}
		return false
	})
	out = cli(t, "repair", "--admin", a.Admin, "--set", "orders")
	if !strings.Contains(out, "deleted pods orders-1;") {
		t.Fatalf("repair did not delete the crashing pod:\n%s", out)
	}
	poll.Until(t, 30*time.Second, "orders-1 made again", func() bool {
		uid := podUIDs(t, c)["orders-1"]
		return uid != "" && uid != pod.UID
	})
	a.WaitRotation(t, 3, 60*time.Second)
	b.WaitRotation(t, 3, 60*time.Second)
	waitRoutes(t, cl, keys, 3, 60*time.Second, a, b)
}

// ordersTemplate is a set definition that creates its StatefulSet: the
// pod runs the keyway agent beside the replica, with the set's
// credentials mounted, as docs/kubernetes.md shows (this test's kubelet
// runs the agent and replica itself).
func ordersTemplate(replicas int) string {
	return fmt.Sprintf(`{"name": "orders", "key": [{"header": "X-Key"}],
  "timeouts": {"connect": "500ms", "request": "5s", "idle": "30s"},
  "statefulset": {"name": "orders", "template": {
    "apiVersion": "apps/v1", "kind": "StatefulSet",
    "spec": {"replicas": %d, "podManagementPolicy": "Parallel",
      "template": {"spec": {
        "containers": [
          {"name": "replica", "image": "example.com/orders:1"},
          {"name": "keyway-agent", "image": "example.com/keyway:1",
           "args": ["agent", "-c", "/etc/keyway/agent.yaml"],
           "volumeMounts": [{"name": "keyway", "mountPath": "/etc/keyway", "readOnly": true}]}],
        "volumes": [{"name": "keyway", "secret": {"secretName": "keyway-orders"}}]}}}}}}`, replicas)
}

// A set created with a StatefulSet template: keyway creates the
// StatefulSet and its headless Service, labelled as keyway's, and the
// pods become the set's replicas. A second set whose objects are in the
// way is refused. Deleting the set (stopped first) deletes what keyway
// created; a StatefulSet keyway did not create stays.
func TestKubernetesCreateDelete(t *testing.T) {
	c, a, b, _ := kubeStack(t, false, false, func(kc string, join []string) string { return kubeProxyYAMLSets(kc, join, "") })
	ctx := context.Background()
	dir := t.TempDir()

	out := cli(t, "create", "--admin", a.Admin, "-f", WriteFile(t, dir, "orders.json", ordersTemplate(2)))
	if !strings.Contains(out, "created on Kubernetes: Service kw/orders, StatefulSet kw/orders") {
		t.Fatalf("keyway create:\n%s", out)
	}
	sts, err := c.Admin.AppsV1().StatefulSets(kubeNS).Get(ctx, "orders", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := c.Admin.CoreV1().Services(kubeNS).Get(ctx, "orders", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []map[string]string{sts.Labels, svc.Labels} {
		if l["app.kubernetes.io/managed-by"] != "keyway" || l["keyway.dev/set"] != "orders" {
			t.Fatalf("labels %v: not keyway's", l)
		}
	}
	if svc.Spec.ClusterIP != "None" || sts.Spec.ServiceName != "orders" || svc.Spec.Selector["keyway.dev/set"] != "orders" {
		t.Fatalf("service %+v, statefulset serviceName %q: not a headless Service for the pods", svc.Spec, sts.Spec.ServiceName)
	}
	if n := len(sts.Spec.Template.Spec.Containers); n != 2 {
		t.Fatalf("the StatefulSet has %d containers, want the template's 2: keyway injects nothing", n)
	}
	a.WaitRotation(t, 2, 60*time.Second)
	b.WaitRotation(t, 2, 60*time.Second)
	keys := Keys(100)
	waitRoutes(t, NewClient(), keys, 2, 60*time.Second, a, b)
	var flip atomic.Int64
	load := StartLoad(func() string {
		if flip.Add(1)%2 == 0 {
			return b.Addr
		}
		return a.Addr
	}, keys, nil, 300)
	poll.Until(t, 20*time.Second, "600 requests sent", func() bool { n, _ := load.Counts(); return n >= 600 })

	// Another set whose StatefulSet is there already: refused, nothing made.
	clash := strings.Replace(ordersTemplate(1), `"name": "orders", "key"`, `"name": "orders-b", "match": {"path_prefix": "/b"}, "key"`, 1)
	cmd := exec.Command(Binary, "create", "--admin", a.Admin, "-f", WriteFile(t, dir, "clash.json", clash))
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "exists") {
		t.Fatalf("a second set on the same StatefulSet: err %v, output:\n%s", err, out)
	}

	// Delete: refused while the replicas run, then done once stopped.
	cmd = exec.Command(Binary, "delete", "--admin", b.Admin, "--set", "orders")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("delete of a running set was not refused:\n%s", out)
	}
	sent, failures := load.Stop()
	t.Logf("%d requests while the set created with its StatefulSet served", sent)
	if failures != "" {
		t.Fatalf("failed requests: %s", failures)
	}
	cli(t, "stop", "--admin", a.Admin, "--set", "orders")
	poll.Until(t, 30*time.Second, "orders stopped", func() bool { return a.InRotation() == 0 })
	var del string
	poll.Until(t, 30*time.Second, "keyway delete accepted", func() bool {
		b, err := exec.Command(Binary, "delete", "--admin", a.Admin, "--set", "orders").CombinedOutput()
		del = string(b)
		return err == nil
	})
	if !strings.Contains(del, "deleted on Kubernetes: Service kw/orders, StatefulSet kw/orders") {
		t.Fatalf("keyway delete:\n%s", del)
	}
	poll.Until(t, 30*time.Second, "the StatefulSet, its Service and its pods gone", func() bool {
		_, e1 := c.Admin.AppsV1().StatefulSets(kubeNS).Get(ctx, "orders", metav1.GetOptions{})
		_, e2 := c.Admin.CoreV1().Services(kubeNS).Get(ctx, "orders", metav1.GetOptions{})
		return apierrors.IsNotFound(e1) && apierrors.IsNotFound(e2) && len(podUIDs(t, c)) == 0
	})

	// A StatefulSet someone else made stays when its set is deleted.
	if _, err := c.Admin.AppsV1().StatefulSets(kubeNS).Create(ctx, kubetest.StatefulSet("orders", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	plain := `{"name": "orders", "key": [{"header": "X-Key"}], "statefulset": {"name": "orders"}}`
	cli(t, "create", "--admin", a.Admin, "-f", WriteFile(t, dir, "plain.json", plain))
	a.WaitRotation(t, 1, 60*time.Second)
	cli(t, "stop", "--admin", a.Admin, "--set", "orders")
	poll.Until(t, 30*time.Second, "keyway delete accepted", func() bool {
		b, err := exec.Command(Binary, "delete", "--admin", a.Admin, "--set", "orders").CombinedOutput()
		del = string(b)
		return err == nil
	})
	if strings.Contains(del, "deleted on Kubernetes") {
		t.Fatalf("keyway delete removed a StatefulSet it did not create:\n%s", del)
	}
	if _, err := c.Admin.AppsV1().StatefulSets(kubeNS).Get(ctx, "orders", metav1.GetOptions{}); err != nil {
		t.Fatalf("the StatefulSet keyway did not create: %v", err)
	}
}
