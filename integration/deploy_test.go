package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"keyway/agent"
	"keyway/config"
	"keyway/fleetauth"
	"keyway/membership"
)

// The Kubernetes manifests under deploy/kubernetes are checked against
// keyway's own rules: every configuration they carry loads (with the
// environment the pods give it), ports, probes, mounts, selectors and
// gossip join names line up, and grace periods outlast the drains.
// Kubernetes itself is not here; `kubectl kustomize deploy/kubernetes`
// renders them.

type obj = map[string]any

func dig(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(obj)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

func str(o any, path ...string) string { s, _ := dig(o, path...).(string); return s }
func list(o any, path ...string) []any { l, _ := dig(o, path...).([]any); return l }
func num(o any, path ...string) int    { n, _ := dig(o, path...).(int); return n }
func mapOf(o any, path ...string) obj  { m, _ := dig(o, path...).(obj); return m }
func strs(o any, path ...string) []string {
	var out []string
	for _, v := range list(o, path...) {
		out = append(out, fmt.Sprint(v))
	}
	return out
}

type manifests struct {
	namespace string
	objs      []obj
}

func (m *manifests) find(kind, name string) obj {
	for _, o := range m.objs {
		if str(o, "kind") == kind && str(o, "metadata", "name") == name {
			return o
		}
	}
	return nil
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	dir := filepath.Join("..", "deploy", "kubernetes")
	var k obj
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	m := &manifests{namespace: str(k, "namespace")}
	resources := strs(k, "resources")
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(resources, base) {
			t.Errorf("%s is not listed in kustomization.yaml's resources", base)
		}
	}
	for _, r := range resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatalf("kustomization.yaml lists %s: %v", r, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o obj
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", r, err)
			}
			if o == nil {
				continue
			}
			if str(o, "kind") == "" || str(o, "metadata", "name") == "" || str(o, "apiVersion") == "" {
				t.Errorf("%s: a document without apiVersion, kind or metadata.name", r)
			}
			m.objs = append(m.objs, o)
		}
	}
	if m.find("Namespace", m.namespace) == nil {
		t.Errorf("kustomization namespace %q has no Namespace manifest", m.namespace)
	}
	return m
}

// fakePodEnv resolves a container's env as the kubelet would, with a fake
// pod IP and the pod name given; Secret values are placeholders, in the
// shape of a gossip key (32 bytes, base64), the one Secret read through
// the environment (docs/kubernetes.md).
func fakePodEnv(c obj, podName string) map[string]string {
	env := map[string]string{}
	for _, e := range list(c, "env") {
		name, val := str(e, "name"), str(e, "value")
		switch {
		case str(e, "valueFrom", "fieldRef", "fieldPath") == "status.podIP":
			val = "10.1.2.3"
		case str(e, "valueFrom", "fieldRef", "fieldPath") == "metadata.name":
			val = podName
		case mapOf(e, "valueFrom", "secretKeyRef") != nil:
			val = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I="
		}
		env[name] = regexp.MustCompile(`\$\((\w+)\)`).ReplaceAllStringFunc(val, func(s string) string { return env[s[2:len(s)-1]] })
	}
	return env
}

// mountedFile returns the ConfigMap data a container sees at path.
func (m *manifests) mountedFile(t *testing.T, pod, c obj, path string) []byte {
	t.Helper()
	for _, vm := range list(c, "volumeMounts") {
		dir := str(vm, "mountPath")
		if filepath.Dir(path) != filepath.Clean(dir) {
			continue
		}
		for _, v := range list(pod, "volumes") {
			if str(v, "name") != str(vm, "name") {
				continue
			}
			cm := m.find("ConfigMap", str(v, "configMap", "name"))
			if cm == nil {
				t.Fatalf("volume %s: no ConfigMap %q", str(v, "name"), str(v, "configMap", "name"))
			}
			data := str(cm, "data", filepath.Base(path))
			if data == "" {
				t.Fatalf("ConfigMap %s has no key %s (mounted at %s)", str(cm, "metadata", "name"), filepath.Base(path), dir)
			}
			return []byte(data)
		}
		t.Fatalf("volumeMount %s names no volume", str(vm, "name"))
	}
	t.Fatalf("container %s: nothing mounted at %s", str(c, "name"), filepath.Dir(path))
	return nil
}

// secretMounted reports whether path lies in a Secret volume of the container.
func secretMounted(pod, c obj, path, secret string) bool {
	for _, vm := range list(c, "volumeMounts") {
		if filepath.Dir(path) != filepath.Clean(str(vm, "mountPath")) {
			continue
		}
		for _, v := range list(pod, "volumes") {
			if str(v, "name") == str(vm, "name") && str(v, "secret", "secretName") == secret {
				return true
			}
		}
	}
	return false
}

// secretMount names the Secret whose volume the container mounts where
// path lies, and whether the mount is read-only.
func secretMount(pod, c obj, path string) (secret string, readOnly bool) {
	for _, vm := range list(c, "volumeMounts") {
		if filepath.Dir(path) != filepath.Clean(str(vm, "mountPath")) {
			continue
		}
		for _, v := range list(pod, "volumes") {
			if str(v, "name") == str(vm, "name") {
				return str(v, "secret", "secretName"), dig(vm, "readOnly") == true
			}
		}
	}
	return "", false
}

// fleetSecrets returns, by Secret name, the credentials files that the
// Secrets `keyway keys --sets SETS` writes hold (their key
// credentials.yaml), each written to a file of a temporary directory. The
// manifests mount those Secrets by name. Under -short, with no keyway
// binary built, the files are made here, with the names keyway keys gives
// them (cmd/keyway's tests hold it to those).
func fleetSecrets(t *testing.T, sets []string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	content := map[string][]byte{}
	if Binary == "" {
		c := fleetauth.Generate(sets)
		content["keyway-proxy-credentials"] = c.ForProxy().Marshal("the proxies' credentials")
		for _, set := range sets {
			content["keyway-agent-"+set+"-credentials"] = c.ForAgent(set).Marshal("the credentials of set " + set + "'s agents")
		}
	} else {
		out := filepath.Join(dir, "keys")
		if b, err := exec.Command(Binary, "keys", "--sets", strings.Join(sets, ","), "--out", out).CombinedOutput(); err != nil {
			t.Fatalf("keyway keys --sets %s: %v\n%s", strings.Join(sets, ","), err, b)
		}
		secrets, _ := filepath.Glob(filepath.Join(out, "*.secret.yaml"))
		for _, f := range secrets {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var s obj
			if err := yaml.Unmarshal(b, &s); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if str(s, "kind") != "Secret" || str(s, "stringData", "credentials.yaml") == "" {
				t.Fatalf("%s: not a Secret with the key credentials.yaml", f)
			}
			content[str(s, "metadata", "name")] = []byte(str(s, "stringData", "credentials.yaml"))
		}
	}
	paths := map[string]string{}
	for name, b := range content {
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		paths[name] = p
	}
	return paths
}

// credentialsFile checks that a container's gossip.credentials_file (from
// its configuration file or from env, whose variable is envVar) lies in a
// read-only mount of the Secret want, under the key credentials.yaml, and
// sets envVar in env to the file that Secret holds, so that the
// configuration loads as in the pod.
func credentialsFile(t *testing.T, who string, pod, c obj, file []byte, env map[string]string, envVar, want string, secrets map[string]string) {
	t.Helper()
	var raw obj
	if err := yaml.Unmarshal(file, &raw); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	path := str(raw, "gossip", "credentials_file")
	if v, ok := env[envVar]; ok {
		path = v
	}
	if path == "" {
		t.Errorf("%s: no gossip.credentials_file: gossip off loopback needs the fleet's credentials (the Secret %s, from keyway keys)", who, want)
		return
	}
	secret, ro := secretMount(pod, c, path)
	if secret != want || !ro || filepath.Base(path) != "credentials.yaml" {
		there := "no Secret is mounted there"
		if secret != "" {
			there = fmt.Sprintf("the Secret %s is mounted there, read-only %v", secret, ro)
		}
		t.Errorf("%s: gossip.credentials_file %q must be the key credentials.yaml of a read-only mount of the Secret %s (%s)", who, path, want, there)
	}
	if secrets[want] == "" {
		t.Fatalf("%s mounts the Secret %s, which keyway keys does not write (it writes %v)", who, want, slices.Sorted(maps.Keys(secrets)))
	}
	env[envVar] = secrets[want]
}

func containerPort(c obj, name string) (int, string) {
	for _, p := range list(c, "ports") {
		if str(p, "name") == name {
			return num(p, "containerPort"), cmpOr(str(p, "protocol"), "TCP")
		}
	}
	return 0, ""
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func hasPort(c obj, port int, proto string) bool {
	for _, p := range list(c, "ports") {
		if num(p, "containerPort") == port && cmpOr(str(p, "protocol"), "TCP") == proto {
			return true
		}
	}
	return false
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// probePort resolves a probe's httpGet port (a name or a number).
func probePort(c obj, probe string) int {
	switch p := dig(c, probe, "httpGet", "port").(type) {
	case int:
		return p
	case string:
		n, _ := containerPort(c, p)
		return n
	}
	return 0
}

func containers(pod obj) map[string]obj {
	out := map[string]obj{}
	for _, c := range list(pod, "containers") {
		out[str(c, "name")] = c.(obj)
	}
	return out
}

func TestDeployManifests(t *testing.T) {
	m := loadManifests(t)
	gossipSvc := m.find("Service", "keyway-gossip")
	if gossipSvc == nil {
		t.Fatal("no keyway-gossip Service")
	}
	if str(gossipSvc, "spec", "clusterIP") != "None" || dig(gossipSvc, "spec", "publishNotReadyAddresses") != true {
		t.Error("keyway-gossip must be headless (clusterIP: None) and publish not-ready addresses: starting members must find each other")
	}
	gossipJoin := fmt.Sprintf("keyway-gossip.%s.svc.cluster.local:%d", m.namespace, num(list(gossipSvc, "spec", "ports")[0], "port"))

	// The proxies.
	dep := m.find("Deployment", "keyway-proxy")
	if dep == nil {
		t.Fatal("no keyway-proxy Deployment")
	}
	pod := mapOf(dep, "spec", "template", "spec")
	proxyC := containers(pod)["keyway"]
	args := strs(proxyC, "args")
	if len(args) != 3 || args[0] != "proxy" || args[1] != "-c" {
		t.Fatalf("proxy args %v, want [proxy -c FILE]", args)
	}
	env := fakePodEnv(proxyC, "keyway-proxy-x")
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	proxyFile := m.mountedFile(t, pod, proxyC, args[2])
	// The fleet's signing keys, as keyway keys makes them for the sets the
	// proxies route (docs/kubernetes.md).
	var raw obj
	if err := yaml.Unmarshal(proxyFile, &raw); err != nil {
		t.Fatalf("keyway-proxy ConfigMap: %v", err)
	}
	var sets []string
	for _, rs := range list(raw, "replica_sets") {
		sets = append(sets, str(rs, "name"))
	}
	secrets := fleetSecrets(t, sets)
	credentialsFile(t, "the proxy", pod, proxyC, proxyFile, env, "KEYWAY_GOSSIP_CREDENTIALS_FILE", "keyway-proxy-credentials", secrets)
	cfg, err := config.LoadBytes("keyway-proxy ConfigMap", proxyFile, config.WithEnv(lookup))
	if err != nil {
		t.Fatalf("the proxy configuration does not load:\n%v", err)
	}
	if cfg.Gossip.AdvertiseAddr != "10.1.2.3" {
		t.Errorf("proxy gossip.advertise_addr = %q, want the pod IP", cfg.Gossip.AdvertiseAddr)
	}
	if !slices.Equal(cfg.Gossip.Join, []string{gossipJoin}) {
		t.Errorf("proxy gossip.join %v, want [%s]", cfg.Gossip.Join, gossipJoin)
	}
	for _, want := range []struct {
		what, port string
		n          int
	}{{"listen", "http", portOf(t, cfg.Listen)}, {"admin.listen", "admin", portOf(t, cfg.Admin.Listen)}} {
		if p, _ := containerPort(proxyC, want.port); p != want.n {
			t.Errorf("proxy %s port %d, but containerPort %q is %d", want.what, want.n, want.port, p)
		}
	}
	if !hasPort(proxyC, cfg.Gossip.BindPort, "TCP") || !hasPort(proxyC, cfg.Gossip.BindPort, "UDP") {
		t.Errorf("proxy gossip.bind_port %d needs a TCP and a UDP containerPort", cfg.Gossip.BindPort)
	}
	if !strings.HasPrefix(cfg.Admin.Listen, ":") && !strings.HasPrefix(cfg.Admin.Listen, "0.0.0.0:") {
		t.Errorf("admin.listen %q: the kubelet probes the pod IP", cfg.Admin.Listen)
	}
	if cfg.Admin.TokenFile == "" || filepath.Base(cfg.Admin.TokenFile) != "token" || !secretMounted(pod, proxyC, cfg.Admin.TokenFile, "keyway-admin-token") {
		t.Errorf("admin.listen is off loopback: admin.token_file (%q) must be the key \"token\" of the keyway-admin-token Secret mount (docs/kubernetes.md), or keyway refuses to start", cfg.Admin.TokenFile)
	}
	if cfg.Audit.Dir != "" && !writableMount(pod, proxyC, cfg.Audit.Dir) {
		t.Errorf("audit.dir %q is on no writable volume (the root filesystem is read-only)", cfg.Audit.Dir)
	}
	proxyKey := secretEnv(proxyC, "KEYWAY_GOSSIP_KEY")
	if probePort(proxyC, "readinessProbe") != portOf(t, cfg.Admin.Listen) || str(proxyC, "readinessProbe", "httpGet", "path") != "/readyz" {
		t.Error("proxy readinessProbe must GET /readyz on the admin port")
	}
	if probePort(proxyC, "livenessProbe") != portOf(t, cfg.Admin.Listen) || str(proxyC, "livenessProbe", "httpGet", "path") != "/healthz" {
		t.Error("proxy livenessProbe must GET /healthz on the admin port")
	}
	// The kubelet sends the pod IP as the Host, which the admin listener
	// answers; a name (httpGet.host, a Host header) would be 421 unless in
	// admin.allowed_hosts.
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		host := str(proxyC, probe, "httpGet", "host")
		if hs, ok := dig(proxyC, probe, "httpGet", "httpHeaders").([]any); ok {
			for _, h := range hs {
				if m, ok := h.(obj); ok && strings.EqualFold(fmt.Sprint(m["name"]), "Host") {
					host = fmt.Sprint(m["value"])
				}
			}
		}
		if host != "" && net.ParseIP(host) == nil && !slices.Contains(cfg.Admin.AllowedHosts, host) {
			t.Errorf("proxy %s sends Host %q: the admin listener answers it 421 unless admin.allowed_hosts lists it", probe, host)
		}
	}
	preStop := time.Duration(num(proxyC, "lifecycle", "preStop", "sleep", "seconds")) * time.Second
	if cmd := strs(proxyC, "lifecycle", "preStop", "exec", "command"); len(cmd) == 2 && cmd[0] == "sleep" {
		n, _ := strconv.Atoi(cmd[1])
		preStop = time.Duration(n) * time.Second
	}
	if preStop == 0 {
		t.Error("proxy: no preStop pause: endpoints would still send new connections to a closing listener")
	}
	if grace := time.Duration(num(pod, "terminationGracePeriodSeconds")) * time.Second; grace <= preStop+cfg.Server.ShutdownTimeout {
		t.Errorf("proxy terminationGracePeriodSeconds %s <= preStop %s + server.shutdown_timeout %s: the kubelet would kill in-flight requests", grace, preStop, cfg.Server.ShutdownTimeout)
	}
	if cfg.Gossip.Signatures != membership.SignaturesRequired {
		t.Errorf("proxy gossip.signatures %q: required, but for the time of a rolling upgrade from a version without signatures", cfg.Gossip.Signatures)
	}
	checkServices(t, m)

	// Each replica set's StatefulSet.
	for _, sc := range cfg.ReplicaSets {
		sts := m.find("StatefulSet", sc.Name)
		if sts == nil {
			t.Errorf("the proxies route set %s, but no StatefulSet %s runs it", sc.Name, sc.Name)
			continue
		}
		if n := num(sts, "spec", "replicas"); n != sc.Replicas {
			t.Errorf("StatefulSet %s runs %d replicas, the proxies declare %d", sc.Name, n, sc.Replicas)
		}
		checkReplicaPod(t, m, sc.Name, mapOf(sts, "spec", "template", "spec"), gossipJoin, cfg.Gossip, proxyKey, secrets)
	}
}

func checkReplicaPod(t *testing.T, m *manifests, set string, pod obj, gossipJoin string, proxyGossip config.Gossip, proxyKey string, secrets map[string]string) {
	t.Helper()
	cs := containers(pod)
	ag, rep := cs["keyway-agent"], cs["replica"]
	if ag == nil || rep == nil {
		t.Fatalf("StatefulSet %s: want containers replica and keyway-agent, have %v", set, len(cs))
	}
	args := strs(ag, "args")
	if len(args) != 3 || args[0] != "agent" || args[1] != "-c" {
		t.Fatalf("agent args %v, want [agent -c FILE]", args)
	}
	env := fakePodEnv(ag, set+"-0")
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	agentFile := m.mountedFile(t, pod, ag, args[2])
	// The set's own Secret: an agent holding the proxies' would sign as a proxy.
	credentialsFile(t, set+" agent", pod, ag, agentFile, env, "KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE", "keyway-agent-"+set+"-credentials", secrets)
	acfg, err := config.LoadAgentBytes("agent ConfigMap", agentFile, config.WithEnv(lookup))
	if err != nil {
		t.Fatalf("the %s agent configuration does not load:\n%v", set, err)
	}
	checkAgent(t, set, acfg, gossipJoin)
	if portOf(t, acfg.Listen) != probePort(ag, "readinessProbe") || str(ag, "readinessProbe", "httpGet", "path") != "/readyz" {
		t.Errorf("%s agent readinessProbe must GET /readyz on its listen port %s", set, acfg.Listen)
	}
	if p, _ := containerPort(rep, "http"); p != portOf(t, acfg.Replica.Addr) {
		t.Errorf("%s agent replica.addr %s, but the replica listens on containerPort %d", set, acfg.Replica.Addr, p)
	}
	if !hasPort(ag, acfg.Gossip.BindPort, "TCP") || !hasPort(ag, acfg.Gossip.BindPort, "UDP") {
		t.Errorf("%s agent gossip.bind_port %d needs a TCP and a UDP containerPort", set, acfg.Gossip.BindPort)
	}
	if acfg.Gossip.Profile != proxyGossip.Profile || acfg.Gossip.Label != proxyGossip.Label {
		t.Errorf("%s agent gossip profile %q, label %q; the proxies use %q, %q: they must agree", set, acfg.Gossip.Profile, acfg.Gossip.Label, proxyGossip.Profile, proxyGossip.Label)
	}
	if acfg.Gossip.Signatures != membership.SignaturesRequired {
		t.Errorf("%s agent gossip.signatures %q: required, but for the time of a rolling upgrade from a version without signatures", set, acfg.Gossip.Signatures)
	}
	for name, c := range cs {
		if mountsSecret(pod, c, "keyway-proxy-credentials") {
			t.Errorf("StatefulSet %s: container %s mounts the proxies' credentials: only proxies may hold the proxy private key", set, name)
		}
	}
	if key := secretEnv(ag, "KEYWAY_GOSSIP_KEY"); key != proxyKey {
		t.Errorf("%s agent takes KEYWAY_GOSSIP_KEY from %q, the proxies from %q: they could not talk", set, key, proxyKey)
	}
	// The replica's preStop loops while the agent's /healthz answers.
	hook := strings.Join(strs(rep, "lifecycle", "preStop", "exec", "command"), " ")
	want := regexp.MustCompile(fmt.Sprintf(`^sh -c while wget -q (-T \d+ )?-O /dev/null http://127\.0\.0\.1:%d/healthz; do sleep 1; done$`, portOf(t, acfg.Listen)))
	if !want.MatchString(hook) {
		t.Errorf("%s replica preStop %q must loop while the agent's /healthz on port %d answers", set, hook, portOf(t, acfg.Listen))
	}
	if mapOf(ag, "lifecycle", "preStop") != nil {
		t.Errorf("%s agent has a preStop hook: SIGTERM itself starts its drain", set)
	}
	// After the drain the agent waits up to 2s for its stopped broadcast, 2s
	// to leave gossip and 5s for its HTTP server; the replica then needs
	// its own shutdown: 15s on top of the drain.
	if grace, need := time.Duration(num(pod, "terminationGracePeriodSeconds"))*time.Second, acfg.Drain.Timeout+acfg.Drain.Quiet+15*time.Second; grace < need {
		t.Errorf("%s terminationGracePeriodSeconds %s < drain.timeout + drain.quiet + 15s = %s", set, grace, need)
	}
	if rargs := strs(rep, "args"); len(rargs) > 0 && rargs[0] == "replica" {
		i := slices.Index(rargs, "--listen")
		if i < 0 || portOf(t, rargs[i+1]) != portOf(t, acfg.Replica.Addr) {
			t.Errorf("%s demo replica args %v do not listen on replica.addr's port", set, rargs)
		}
	}
}

func checkAgent(t *testing.T, set string, c agent.Config, gossipJoin string) {
	t.Helper()
	if c.Replica.Set != set {
		t.Errorf("agent replica.set %q in StatefulSet %s", c.Replica.Set, set)
	}
	if c.Replica.Addr != "10.1.2.3:"+strconv.Itoa(portOf(t, c.Replica.Addr)) || c.Gossip.AdvertiseAddr != "10.1.2.3" {
		t.Errorf("agent replica.addr %q and gossip.advertise_addr %q must come from the pod IP", c.Replica.Addr, c.Gossip.AdvertiseAddr)
	}
	if !slices.Equal(c.Gossip.Join, []string{gossipJoin}) {
		t.Errorf("agent gossip.join %v, want [%s]", c.Gossip.Join, gossipJoin)
	}
	if !strings.HasPrefix(c.Listen, ":") {
		t.Errorf("agent listen %q: the kubelet probes the pod IP", c.Listen)
	}
}

// mountsSecret reports whether a container mounts the Secret.
func mountsSecret(pod, c obj, secret string) bool {
	for _, vm := range list(c, "volumeMounts") {
		for _, v := range list(pod, "volumes") {
			if str(v, "name") == str(vm, "name") && str(v, "secret", "secretName") == secret {
				return true
			}
		}
	}
	return false
}

// secretEnv names the Secret and key an env var of a container comes from.
func secretEnv(c obj, name string) string {
	for _, e := range list(c, "env") {
		if str(e, "name") == name {
			return str(e, "valueFrom", "secretKeyRef", "name") + "/" + str(e, "valueFrom", "secretKeyRef", "key")
		}
	}
	return ""
}

// writableMount reports whether path lies in a mounted volume that is not
// a ConfigMap or Secret, mounted read-write.
func writableMount(pod, c obj, path string) bool {
	for _, vm := range list(c, "volumeMounts") {
		dir := filepath.Clean(str(vm, "mountPath"))
		if dig(vm, "readOnly") == true || (path != dir && !strings.HasPrefix(path, dir+"/")) {
			continue
		}
		for _, v := range list(pod, "volumes") {
			if str(v, "name") == str(vm, "name") && mapOf(v, "configMap") == nil && mapOf(v, "secret") == nil {
				return true
			}
		}
	}
	return false
}

// checkServices: every Service selects some pod template, and its named
// target ports exist there.
func checkServices(t *testing.T, m *manifests) {
	t.Helper()
	for _, svc := range m.objs {
		if str(svc, "kind") != "Service" {
			continue
		}
		name := str(svc, "metadata", "name")
		sel := mapOf(svc, "spec", "selector")
		matched := false
		for _, w := range m.objs {
			if k := str(w, "kind"); k != "Deployment" && k != "StatefulSet" {
				continue
			}
			labels := mapOf(w, "spec", "template", "metadata", "labels")
			ok := len(sel) > 0
			for k, v := range sel {
				if labels[k] != v {
					ok = false
				}
			}
			if !ok {
				continue
			}
			matched = true
			for _, p := range list(svc, "spec", "ports") {
				tp, isName := dig(p, "targetPort").(string)
				if !isName {
					continue
				}
				found := false
				for _, c := range containers(mapOf(w, "spec", "template", "spec")) {
					if n, proto := containerPort(c, tp); n > 0 && proto == cmpOr(str(p, "protocol"), "TCP") {
						found = true
					}
				}
				if !found {
					t.Errorf("Service %s: targetPort %q is no %s containerPort of %s", name, tp, cmpOr(str(p, "protocol"), "TCP"), str(w, "metadata", "name"))
				}
			}
		}
		if !matched {
			t.Errorf("Service %s selects no pod template", name)
		}
	}
	for _, pdb := range m.objs {
		if str(pdb, "kind") != "PodDisruptionBudget" {
			continue
		}
		sel := mapOf(pdb, "spec", "selector", "matchLabels")
		ok := false
		for _, w := range m.objs {
			if k := str(w, "kind"); k == "Deployment" || k == "StatefulSet" {
				if fmt.Sprint(mapOf(w, "spec", "selector", "matchLabels")) == fmt.Sprint(sel) {
					ok = true
				}
			}
		}
		if !ok {
			t.Errorf("PodDisruptionBudget %s selects no workload", str(pdb, "metadata", "name"))
		}
	}
}
