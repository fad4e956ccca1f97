package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/internal/poll"
)

// gossipYAML is the gossip section shared by test proxies and agents:
// loopback, free ports, the fast failure-detection profile.
func gossipYAML(join []string, indent string) string {
	j := "[]"
	if len(join) > 0 {
		j = `["` + strings.Join(join, `", "`) + `"]`
	}
	return strings.ReplaceAll(fmt.Sprintf(`bind_addr: 127.0.0.1
bind_port: 0
join: %s
profile: fast
push_pull_interval: 2s
forget_after: 1m
rejoin_interval: 5s
`, j), "\n", "\n"+indent)
}

// ProxyProc is a running `keyway proxy` with gossip on.
type ProxyProc struct {
	*Proc
	Addr, Admin, Gossip string
}

// StartProxy starts a proxy serving the set "orders" (key header X-Key,
// declared replicas) that joins the given gossip addresses.
func StartProxy(t testing.TB, name string, join []string, replicas int) *ProxyProc {
	t.Helper()
	return StartProxyWith(t, name, join, replicas, "")
}

// StartProxyWith is StartProxy with extra top-level YAML appended to its
// configuration (e.g. an audit: section).
func StartProxyWith(t testing.TB, name string, join []string, replicas int, extra string) *ProxyProc {
	t.Helper()
	return StartProxyFile(t, name, WriteFile(t, t.TempDir(), name+".yaml", proxyYAML(join, replicas, extra)))
}

// proxyYAML is the configuration StartProxyWith writes.
func proxyYAML(join []string, replicas int, extra string) string {
	return fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
gossip:
  enabled: true
  %s
replica_sets:
  - name: orders
    replicas: %d
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 5s, idle: 30s}
%s`, gossipYAML(join, "  "), replicas, extra)
}

// StartProxyFile starts a proxy with the configuration file cfg (gossip
// on, admin and proxy listeners on) and waits for its three addresses.
func StartProxyFile(t testing.TB, name, cfg string) *ProxyProc {
	t.Helper()
	p := Start(t, name, "proxy", "-c", cfg)
	pp := &ProxyProc{Proc: p}
	pp.Addr = p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	pp.Admin = p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	pp.Gossip = p.WaitLine(t, logField("gossip started", "addr"), 20*time.Second)[1]
	return pp
}

// InRotation returns the proxy's keyway_rotation_replicas for "orders".
func (p *ProxyProc) InRotation() float64 {
	return Metric(p.Admin, "keyway_rotation_replicas", map[string]string{"set": "orders"})
}

// WaitRotation waits until n replicas of "orders" are in rotation.
func (p *ProxyProc) WaitRotation(t testing.TB, n int, d time.Duration) {
	t.Helper()
	poll.Until(t, d, fmt.Sprintf("%s: %d replicas in rotation", p.Name, n), func() bool { return p.InRotation() == float64(n) })
}

// ReplicaProc is a demo replica process with its agent.
type ReplicaProc struct {
	Name    string
	Replica *Proc
	Agent   *Proc
	Addr    string
}

var replicaLine = regexp.MustCompile(`replica \S+ listening on (\S+)`)

// StartReplicaProcess starts only the demo replica process of a replica.
func StartReplicaProcess(t testing.TB, name string) (*Proc, string) {
	t.Helper()
	p := Start(t, name, "replica", "--name", name, "--listen", "127.0.0.1:0")
	return p, p.WaitLine(t, replicaLine, 20*time.Second)[1]
}

// StartAgent starts an agent for the replica of orders called name at
// addr.
func StartAgent(t testing.TB, name, addr string, join []string) *Proc {
	t.Helper()
	return StartAgentOf(t, "orders", name, addr, join)
}

// StartAgentOf starts an agent for the replica of set called name at
// addr.
func StartAgentOf(t testing.TB, set, name, addr string, join []string) *Proc {
	t.Helper()
	cfg := WriteFile(t, t.TempDir(), name+"-agent.yaml", fmt.Sprintf(`replica: {set: %s, name: %s, addr: "%s"}
probe: {path: /readyz, interval: 100ms, timeout: 500ms, rise: 2, fall: 2}
drain: {timeout: 10s}
listen: "127.0.0.1:0"
log: {level: info, format: json}
gossip:
  %s`, set, name, addr, gossipYAML(join, "  ")))
	return Start(t, name+"-agent", "agent", "-c", cfg)
}

// StartReplica starts a demo replica and its agent.
func StartReplica(t testing.TB, name string, join []string) *ReplicaProc {
	t.Helper()
	rp, addr := StartReplicaProcess(t, name)
	return &ReplicaProc{Name: name, Replica: rp, Addr: addr, Agent: StartAgent(t, name, addr, join)}
}

// Answer is what a demo replica answers.
type Answer struct {
	Replica string `json:"replica"`
	Key     string `json:"key"`
}

// Client sends keyed requests to a proxy.
type Client struct {
	hc *http.Client
}

// NewClient returns a client with a keep-alive pool.
func NewClient() *Client {
	return &Client{hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// Send POSTs a body with X-Key to the proxy and returns the status and the
// replica that answered ("" when keyway answered itself).
func (c *Client) Send(proxyAddr, key string) (int, string, error) {
	req, _ := http.NewRequest("POST", "http://"+proxyAddr+"/ingest", strings.NewReader("payload"))
	req.Header.Set("X-Key", key)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var a Answer
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &a); err != nil {
			return resp.StatusCode, "", fmt.Errorf("answer %q: %w", body, err)
		}
	}
	return resp.StatusCode, a.Replica, nil
}

// Owners sends every key once through the proxy, from workers goroutines,
// and returns the replica that answered each. A non-200 fails the test.
func (c *Client) Owners(t testing.TB, proxyAddr string, keys []string, workers int) map[string]string {
	t.Helper()
	out := make(map[string]string, len(keys))
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(keys); i += workers {
				code, rep, err := c.Send(proxyAddr, keys[i])
				mu.Lock()
				if err == nil && code != 200 {
					err = fmt.Errorf("key %s: status %d", keys[i], code)
				}
				if err != nil && firstErr == nil {
					firstErr = err
				}
				out[keys[i]] = rep
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	return out
}

// Keys returns n distinct test keys.
func Keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("order-%05d", i)
	}
	return out
}

// Stats returns a demo replica's per-key request counts.
func Stats(t testing.TB, addr string) map[string]int64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/_stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		Keys map[string]int64 `json:"keys"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s.Keys
}
