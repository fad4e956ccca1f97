package integration

import (
	"crypto/ed25519"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"keyway/fleetauth"
	"keyway/internal/poll"
	"keyway/membership"
)

// The credentials change while the fleet runs (docs/membership.md, "Keys
// and their rotation"): a set's new agent key reaches the proxy by a
// reload, and the proxy key rotates in stages (the new public key
// everywhere, then the new private key first, then the old one dropped)
// without a command lost.
func TestCredentialsChangeAtRunTime(t *testing.T) {
	skipShort(t)
	t.Setenv("KEYWAY_ADMIN_TOKEN", "s3cret")
	dir := t.TempDir()
	creds := fleetauth.Generate([]string{"orders"})
	proxyFile, agentFile := filepath.Join(dir, "proxy.yaml"), filepath.Join(dir, "agent-orders.yaml")
	write := func(path string, c fleetauth.Credentials) {
		t.Helper()
		writeAtomic(t, path, string(c.Marshal("test credentials")))
	}
	write(proxyFile, creds.ForProxy())
	write(agentFile, creds.ForAgent("orders"))
	// This test's credentials, not the harness's: the variables win over
	// the files, and every process inherits them.
	t.Setenv("KEYWAY_GOSSIP_CREDENTIALS_FILE", proxyFile)
	t.Setenv("KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE", agentFile)
	usersSet := `  - name: users
    replicas: 1
    match: {path_prefix: /users/}
    key: [{header: X-Key}]
`
	p := StartProxyWith(t, "proxy", nil, 1, usersSet)
	orders0 := StartReplica(t, "orders-0", []string{p.Gossip})
	p.WaitRotation(t, 1, 30*time.Second)

	// A set whose agents hold a key the proxy does not know yet: its
	// replica's claim is refused (unknown_key) until the proxy's file
	// lists the key and the proxy reloads it.
	users := creds
	users.Agents = map[string]fleetauth.KeyList{"orders": creds.Agents["orders"]}
	pub, priv := fleetauth.NewKey()
	users.Agents["users"] = fleetauth.KeyList{Public: []ed25519.PublicKey{pub}, Private: []ed25519.PrivateKey{priv}}
	usersFile := filepath.Join(dir, "agent-users.yaml")
	write(usersFile, users.ForAgent("users"))
	t.Setenv("KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE", usersFile)
	_, usersAddr := StartReplicaProcess(t, "users-0")
	usersAgent := StartAgentOf(t, "users", "users-0", usersAddr, []string{p.Gossip})
	usersNode := usersAgent.WaitLine(t, logField("agent started", "node"), 10*time.Second)[1]
	poll.Until(t, 15*time.Second, "the proxy to refuse users-0's claim by an unknown key", func() bool {
		return members(t, p.Admin)[usersNode] == membership.RejectUnknownKey
	})
	if n := rotationOf(p.Admin, "users"); n != 0 {
		t.Fatalf("users has %v replicas in rotation with an unknown key", n)
	}
	write(proxyFile, users.ForProxy())
	reload(t, p)
	poll.Until(t, 15*time.Second, "users-0 in rotation once the proxy reloaded the key", func() bool { return rotationOf(p.Admin, "users") == 1 })

	// The proxy key rotates. Stage 1: the new public key everywhere (the
	// agents restart to read it), the old key signs.
	next := fleetauth.Generate(nil).Proxy
	stage := users
	stage.Proxy = fleetauth.KeyList{Public: append(append([]ed25519.PublicKey{}, users.Proxy.Public...), next.Public...), Private: users.Proxy.Private}
	write(proxyFile, stage.ForProxy())
	write(agentFile, stage.ForAgent("orders"))
	t.Setenv("KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE", agentFile)
	reload(t, p)
	orders0.Agent.Term(t, 30*time.Second)
	orders0.Agent = StartAgent(t, "orders-0", orders0.Addr, []string{p.Gossip})
	p.WaitRotation(t, 1, 30*time.Second)
	// Stage 2: the new private key first: the proxy signs with it, and
	// the agent (stage 1) obeys.
	stage.Proxy.Private = append(append([]ed25519.PrivateKey{}, next.Private...), users.Proxy.Private...)
	write(proxyFile, stage.ForProxy())
	reload(t, p)
	drainUndrain := func(step string) {
		t.Helper()
		path := "/v1/replica_sets/orders/replicas/orders-0/"
		for _, c := range []struct {
			op   string
			want float64
		}{{"drain", 0}, {"undrain", 1}} {
			if code, body := adminPost(t, p.Admin, path+c.op, "s3cret"); code != 202 {
				t.Fatalf("%s: %s: %d %v", step, c.op, code, body)
			}
			poll.Until(t, 15*time.Second, fmt.Sprintf("%s: orders-0 %sed", step, c.op), func() bool { return p.InRotation() == c.want })
		}
	}
	drainUndrain("the new proxy key signing")
	if n := len(orders0.Agent.Logs("gossip: refused a message or claim that is not authenticated for its role")); n != 0 {
		t.Fatalf("the agent refused %d messages during the rotation", n)
	}
	// Stage 3: the old key goes, on the proxy first, then the agents.
	stage.Proxy = next
	write(proxyFile, stage.ForProxy())
	reload(t, p)
	write(agentFile, stage.ForAgent("orders"))
	orders0.Agent.Term(t, 30*time.Second)
	orders0.Agent = StartAgent(t, "orders-0", orders0.Addr, []string{p.Gossip})
	p.WaitRotation(t, 1, 30*time.Second)
	drainUndrain("the old proxy key retired")
}

// reload makes the proxy read its configuration again (SIGHUP) and waits
// for the reload to succeed.
func reload(t *testing.T, p *ProxyProc) {
	t.Helper()
	ok := func() float64 {
		return Metric(p.Admin, "keyway_config_reloads_total", map[string]string{"result": "success"})
	}
	before := ok()
	kill(t, p.Pid(), syscall.SIGHUP)
	poll.Until(t, 10*time.Second, p.Name+" to reload", func() bool { return ok() == before+1 })
}
