package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// previousVersion is the commit before the fleet's gossip was signed: the
// version a running fleet upgrades from.
const previousVersion = "3b7b5d701296c7a07794d57a81d106451464f3bb"

// previousBinary builds keyway at previousVersion (a git worktree of this
// repository's history, removed after) into the user's cache directory,
// once, and returns its path. The test skips without git or without that
// commit (a shallow clone).
func previousBinary(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no cache directory for the previous version's binary: %v", err)
	}
	bin := filepath.Join(cache, "keyway-test", "keyway-"+previousVersion[:12])
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git to check out the previous version")
	}
	if out, err := exec.Command("git", "-C", "..", "cat-file", "-e", previousVersion+"^{commit}").CombinedOutput(); err != nil {
		t.Skipf("the previous version %s is not in this clone's history (shallow?): %v %s", previousVersion[:12], err, out)
	}
	src := filepath.Join(t.TempDir(), "keyway-previous")
	if out, err := exec.Command("git", "-C", "..", "worktree", "add", "--detach", src, previousVersion).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add: %v\n%s", err, out)
	}
	defer func() {
		if out, err := exec.Command("git", "-C", "..", "worktree", "remove", "--force", src).CombinedOutput(); err != nil {
			t.Logf("git worktree remove: %v\n%s", err, out)
		}
	}()
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := bin + fmt.Sprintf(".%d.tmp", os.Getpid())
	build := exec.Command("go", "build", "-o", tmp, "./cmd/keyway")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the previous version: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// upgradeProxyYAML is a proxy's configuration for the mixed-version test:
// orders, with signatures (new versions only) as given ("" for the
// previous version, which does not know the key).
func upgradeProxyYAML(join []string, signatures string) string {
	g := gossipYAML(join, "  ")
	if signatures != "" {
		g += "\n  signatures: " + signatures
	}
	return fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
gossip:
  enabled: true
  %s
replica_sets:
  - name: orders
    replicas: 3
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 5s, idle: 30s}
`, g)
}

func startVersionProxy(t *testing.T, bin, name, cfg string) *ProxyProc {
	t.Helper()
	p := StartBinary(t, bin, name, "proxy", "-c", cfg)
	pp := &ProxyProc{Proc: p}
	pp.Addr = p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	pp.Admin = p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	pp.Gossip = p.WaitLine(t, logField("gossip started", "addr"), 20*time.Second)[1]
	return pp
}

func startVersionAgent(t *testing.T, bin, name, addr, join, signatures string) *Proc {
	t.Helper()
	g := gossipYAML([]string{join}, "  ")
	if signatures != "" {
		g += "\n  signatures: " + signatures
	}
	cfg := WriteFile(t, t.TempDir(), name+"-agent.yaml", fmt.Sprintf(`replica: {set: orders, name: %s, addr: "%s"}
probe: {path: /readyz, interval: 100ms, timeout: 500ms, rise: 2, fall: 2}
drain: {timeout: 10s}
listen: "127.0.0.1:0"
log: {level: info, format: json}
gossip:
  %s`, name, addr, g))
	return StartBinary(t, bin, name+"-agent", "agent", "-c", cfg)
}

// A running fleet of the previous version upgrades one member at a time:
// proxies and agents of both versions route as one, the previous
// version's commands and run-time writes reach the new members and the
// new ones' reach the previous version's, with gossip.signatures:
// optional on the new ones. Once the previous version is gone, one
// configuration change (signatures: required, a reload of the proxies and
// a restart of the agents) makes the credentials required, and an
// unsigned member is refused.
func TestRollingUpgradeFromThePreviousVersion(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	old := previousBinary(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	dir := t.TempDir()

	// The previous version's fleet.
	aFile := WriteFile(t, dir, "a.yaml", upgradeProxyYAML(nil, ""))
	a := startVersionProxy(t, old, "proxy-a-old", aFile)
	join := a.Gossip
	bFile := WriteFile(t, dir, "b.yaml", upgradeProxyYAML([]string{join}, ""))
	b := startVersionProxy(t, old, "proxy-b-old", bFile)
	type rep struct {
		name, addr string
		agent      *Proc
	}
	var reps []rep
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		_, addr := StartReplicaProcess(t, name)
		reps = append(reps, rep{name, addr, startVersionAgent(t, old, name, addr, join, "")})
	}
	keys := Keys(300)
	c := NewClient()
	agree := func(step string, ps ...*ProxyProc) {
		t.Helper()
		for _, p := range ps {
			p.WaitRotation(t, 3, 30*time.Second)
		}
		first := c.Owners(t, ps[0].Addr, keys, 4)
		for _, p := range ps[1:] {
			for k, o := range c.Owners(t, p.Addr, keys, 4) {
				if o != first[k] {
					t.Fatalf("%s: key %s goes to %s through %s, to %s through %s", step, k, o, p.Name, first[k], ps[0].Name)
				}
			}
		}
	}
	drain := "/v1/replica_sets/orders/replicas/orders-1/"
	// operate drains orders-1 through one proxy and undrains it through
	// the other, and scales the set through each: the commands reach the
	// agents and the run-time writes every proxy, whatever their versions.
	operate := func(step string, via, other *ProxyProc) {
		t.Helper()
		if code, body := adminPost(t, via.Admin, drain+"drain", "s3cret"); code != 202 {
			t.Fatalf("%s: drain through %s: %d %v", step, via.Name, code, body)
		}
		for _, p := range []*ProxyProc{via, other} {
			p.WaitRotation(t, 2, 15*time.Second)
		}
		if code, body := adminPost(t, other.Admin, drain+"undrain", "s3cret"); code != 202 {
			t.Fatalf("%s: undrain through %s: %d %v", step, other.Name, code, body)
		}
		for _, p := range []*ProxyProc{via, other} {
			p.WaitRotation(t, 3, 15*time.Second)
		}
		for i, p := range []*ProxyProc{via, other} {
			n := 4 + i
			patchSet(t, p.Admin, "orders", fmt.Sprintf(`{"replicas":%d}`, n))
			for _, q := range []*ProxyProc{via, other} {
				poll.Until(t, 15*time.Second, fmt.Sprintf("%s: %s to see orders declared %d (written through %s)", step, q.Name, n, p.Name), func() bool {
					return declared(t, q.Admin, "orders") == n
				})
			}
		}
		patchSet(t, via.Admin, "orders", `{"replicas":3}`)
	}
	agree("the previous version", a, b)

	// 1. Proxy B is upgraded (signatures optional while old members run).
	b.Term(t, 30*time.Second)
	bFile = WriteFile(t, dir, "b-new.yaml", upgradeProxyYAML([]string{join}, "optional"))
	b = startVersionProxy(t, Binary, "proxy-b-new", bFile)
	agree("a new proxy beside a previous one", a, b)
	operate("a new proxy beside a previous one", b, a)

	// 2. The agents, one at a time.
	for i := range reps {
		reps[i].agent.Term(t, 30*time.Second)
		reps[i].agent = startVersionAgent(t, Binary, reps[i].name, reps[i].addr, join, "optional")
		agree(fmt.Sprintf("%s upgraded", reps[i].name), a, b)
	}
	operate("new agents, a previous proxy", a, b)

	// 3. Proxy A, the seed.
	a.Term(t, 30*time.Second)
	aFile = WriteFile(t, dir, "a-new.yaml", upgradeProxyYAML([]string{b.Gossip}, "optional"))
	a = startVersionProxy(t, Binary, "proxy-a-new", aFile)
	agree("every member upgraded", a, b)
	operate("every member upgraded", a, b)

	// 4. The switch: signatures required, one key: a reload of each proxy
	// (SIGHUP), a restart of each agent.
	for _, p := range []struct {
		proc *ProxyProc
		file string
	}{{a, aFile}, {b, bFile}} {
		writeAtomic(t, p.file, strings.Replace(mustRead(t, p.file), "signatures: optional", "signatures: required", 1))
		if err := p.proc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		p.proc.WaitLine(t, logField("configuration reloaded", "source"), 15*time.Second)
	}
	for i := range reps {
		reps[i].agent.Term(t, 30*time.Second)
		reps[i].agent = startVersionAgent(t, Binary, reps[i].name, reps[i].addr, b.Gossip, "required")
		agree(fmt.Sprintf("%s restarted with signatures required", reps[i].name), a, b)
	}
	operate("signatures required", a, b)
	// Now an unsigned member is refused: its claim to role proxy and its
	// drain of orders-1.
	rogue := startRogue(t, "unsigned", membership.Meta{Role: membership.RoleProxy, ID: "proxy-old"}, nil, a.Gossip)
	agentNode := ""
	poll.Until(t, 15*time.Second, "the unsigned member to see orders-1's agent", func() bool {
		for _, m := range rogue.Members() {
			if m.Meta.Addr == reps[1].addr && m.Status == membership.StatusAlive {
				agentNode = m.Node
			}
		}
		return agentNode != ""
	})
	if err := rogue.SendReliable(agentNode, []byte(`{"kind":"admin_drain","set":"orders","replica":"orders-1","drain":true,"by":"old"}`)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "both proxies to refuse the unsigned member's claim", func() bool {
		return members(t, a.Admin)[rogue.Name()] == membership.RejectUnsigned && members(t, b.Admin)[rogue.Name()] == membership.RejectUnsigned
	})
	poll.Until(t, 15*time.Second, "orders-1's agent to refuse the unsigned drain", func() bool {
		return len(reps[1].agent.Logs("gossip: refused a message or claim that is not authenticated for its role")) > 0
	})
	for _, p := range []*ProxyProc{a, b} {
		if n := p.InRotation(); n != 3 {
			t.Fatalf("%s: %v replicas in rotation after an unsigned drain, want 3", p.Name, n)
		}
	}
}

// declared is a set's declared replica count on a proxy.
func declared(t *testing.T, adminAddr, set string) int {
	t.Helper()
	var s struct {
		Declared int `json:"declared"`
	}
	stacktest.GetJSON(t, "http://"+adminAddr+"/v1/replica_sets/"+set, &s)
	return s.Declared
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: missing", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
