// Package kubetest runs a real Kubernetes control plane on loopback for
// tests: etcd (Debian's etcd-server), kube-apiserver and the StatefulSet
// controller of kube-controller-manager, built by
// scripts/kube-testserver.sh. There is no kubelet: a test plays it
// (Kubelet), marking pods Running and Ready and running their processes
// locally.
//
// Start skips the test when the binaries are absent, unless
// KUBE_TEST_REQUIRE=1 (CI sets it after building them). They are slow
// scenarios: they run only with KEYWAY_SLOW_TESTS=1 (package internal/slow).
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"keyway/internal/slow"
)

// Version is the Kubernetes version the control plane is built at; it
// matches keyway's client-go.
const Version = "v1.37.2"

// Bin returns the directory holding kube-apiserver and
// kube-controller-manager: $KUBE_TEST_BIN, else the build script's cache.
func Bin() string {
	if d := os.Getenv("KUBE_TEST_BIN"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "keyway", "kube", Version)
}

// Cluster is a running control plane. Its processes stop at the test's
// end.
type Cluster struct {
	// URL is the API server's address (https, a self-signed certificate).
	URL string
	// Admin is a client with system:masters rights.
	Admin *kubernetes.Clientset
	// KeywayToken is the bearer token of the user "keyway", who has no
	// rights but those RBAC grants it.
	KeywayToken string

	dir        string
	adminToken string
}

// KeywayUser is the user name KeywayToken authenticates as.
const KeywayUser = "keyway"

// Start runs a control plane for t, or skips t when its binaries are not
// there.
func Start(t testing.TB) *Cluster {
	t.Helper()
	slow.Skip(t) // a control plane takes seconds to start; CI runs these
	bin := Bin()
	etcd, err := exec.LookPath("etcd")
	missing := err != nil
	for _, b := range []string{"kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			missing = true
		}
	}
	if missing {
		if os.Getenv("KUBE_TEST_REQUIRE") == "1" {
			t.Fatalf("kubetest: the control plane is missing (etcd on PATH, kube-apiserver and kube-controller-manager in %s); run scripts/kube-testserver.sh", bin)
		}
		t.Skipf("kubetest: no control plane here (etcd on PATH, %s/kube-apiserver): apt-get install etcd-server; scripts/kube-testserver.sh", bin)
	}
	dir := t.TempDir()
	c := &Cluster{dir: dir, adminToken: randomHex(16), KeywayToken: randomHex(16)}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var procs []*exec.Cmd
	var wg sync.WaitGroup
	t.Cleanup(func() {
		// In reverse: the controller, the API server, then etcd.
		for i := len(procs) - 1; i >= 0; i-- {
			_ = procs[i].Process.Signal(syscall.SIGTERM)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			for _, p := range procs {
				_ = p.Process.Kill()
			}
			<-done
		}
	})
	start := func(name string, path string, args ...string) {
		t.Helper()
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(path, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("kubetest: %s: %v", name, err)
		}
		procs = append(procs, cmd)
		wg.Add(1)
		go func() { defer wg.Done(); _ = cmd.Wait(); _ = logf.Close() }()
	}

	etcdPort, peerPort := freePort(t), freePort(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	start("etcd", etcd, "--data-dir", filepath.Join(dir, "etcd"), "--name", "kubetest",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-cluster", "kubetest=http://127.0.0.1:"+strconv.Itoa(peerPort))

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	writeFile(t, filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	writeFile(t, filepath.Join(dir, "tokens.csv"), []byte(
		c.adminToken+",admin,admin,system:masters\n"+c.KeywayToken+","+KeywayUser+","+KeywayUser+"\n"))

	port := freePort(t)
	c.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	start("kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL, "--secure-port="+strconv.Itoa(port), "--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1", "--cert-dir="+filepath.Join(dir, "certs"),
		"--service-account-key-file="+filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16",
		// No kubernetes Service endpoints to keep: nothing here reaches
		// the API server through a Service.
		"--endpoint-reconciler-type=none")

	c.Admin = kubernetes.NewForConfigOrDie(c.RESTConfig(c.adminToken))
	ready := false
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		body, err := c.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			ready = true
			break
		}
		<-time.After(100 * time.Millisecond)
	}
	if !ready {
		t.Fatalf("kubetest: the API server did not get ready in 90s; its log:\n%s", tail(filepath.Join(dir, "kube-apiserver.log")))
	}
	kc := c.Kubeconfig(t, c.adminToken)
	start("kube-controller-manager", filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig="+kc, "--controllers=statefulset-controller,garbage-collector-controller",
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false")
	return c
}

// StatefulSet is a StatefulSet called name of replicas pods (label
// app=NAME, parallel pod management, one container "replica").
func StatefulSet(name string, replicas int32) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas: &replicas, ServiceName: name, PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "replica", Image: "keyway"}}},
			},
		},
	}
}

// RESTConfig is a client configuration for token.
func (c *Cluster) RESTConfig(token string) *rest.Config {
	return &rest.Config{Host: c.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 200, Burst: 400}
}

// Kubeconfig writes a kubeconfig file for token, in the namespace
// "default", and returns its path.
func (c *Cluster) Kubeconfig(t testing.TB, token string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.URL, InsecureSkipTLSVerify: true}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "user", Namespace: "default"}
	cfg.CurrentContext = "kubetest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Namespace creates namespace ns and its default ServiceAccount (the
// StatefulSet controller's pods name it; no controller here makes it).
func (c *Cluster) Namespace(t testing.TB, ns string) {
	t.Helper()
	ctx := context.Background()
	_, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = c.Admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// Log returns the tail of a control-plane process's log ("etcd",
// "kube-apiserver", "kube-controller-manager"), for failure messages.
func (c *Cluster) Log(name string) string { return tail(filepath.Join(c.dir, name+".log")) }

// NodeName is the node that Bind assigns pods to (no Node object is
// made; nothing here checks).
const NodeName = "kubetest-node"

// Bind assigns a pod to NodeName, as the scheduler does. A pod must be
// bound for a deletion to be graceful: the API server deletes an
// unscheduled pod at once, without the deletionTimestamp a kubelet acts
// on.
func (c *Cluster) Bind(ctx context.Context, ns, pod string) error {
	return c.Admin.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns},
		Target:     corev1.ObjectReference{Kind: "Node", Name: NodeName},
	}, metav1.CreateOptions{})
}

// MarkReady sets a pod's status as a kubelet does for a running, ready
// pod (or, ready false, a running one that is not ready).
func (c *Cluster) MarkReady(ctx context.Context, ns, pod string, ready bool) error {
	p, err := c.Admin.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	SetStatus(p, corev1.PodRunning, ready, 0, "")
	_, err = c.Admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// SetStatus writes a kubelet-like status into p: its phase, a Ready
// condition, and one status per container (ready, restarts, and a
// waiting reason such as "CrashLoopBackOff" when not "").
func SetStatus(p *corev1.Pod, phase corev1.PodPhase, ready bool, restarts int32, waiting string) {
	now := metav1.Now()
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	p.Status.Phase = phase
	p.Status.PodIP = "127.0.0.1"
	p.Status.HostIP = "127.0.0.1"
	if p.Status.StartTime == nil {
		p.Status.StartTime = &now
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: now}}
	p.Status.ContainerStatuses = nil
	for _, ctr := range p.Spec.Containers {
		cs := corev1.ContainerStatus{Name: ctr.Name, Image: ctr.Image, Ready: ready, RestartCount: restarts}
		if waiting != "" {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: waiting}
		} else if phase == corev1.PodRunning {
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
		}
		cs.Started = &ready
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, cs)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(bytes.TrimSpace(b))
}
