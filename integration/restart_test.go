package integration

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"keyway/admin"
	"keyway/internal/poll"
	"keyway/internal/slow"
)

// restartRequestTimeout is the proxies' timeouts.request in
// TestRestartsSeenByAnIdleProxy: short, so that proxy B is idle for
// longer than it while the replicas restart. fasthttp leaves a pooled
// connection's read deadline at the end of its last exchange plus this
// timeout; the stale check once skipped every connection past it.
const restartRequestTimeout = time.Second

// startRestartProxy is StartProxy with timeouts.request of
// restartRequestTimeout.
func startRestartProxy(t *testing.T, name string, join []string) *ProxyProc {
	t.Helper()
	cfg := WriteFile(t, t.TempDir(), name+".yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
gossip:
  enabled: true
  %s
replica_sets:
  - name: orders
    replicas: 3
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: %s, idle: 60s}
`, gossipYAML(join, "  "), restartRequestTimeout))
	return StartProxyFile(t, name, cfg)
}

// metricSum is the sum of the samples of a metric family whose labels
// include every given label (0 when there are none), or -1 when /metrics
// cannot be read.
func metricSum(adminAddr, name string, labels map[string]string) float64 {
	vs, err := metricSamples(adminAddr, name, labels)
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, v := range vs {
		sum += v
	}
	return sum
}

// setView is what a proxy's GET /v1/replica_sets/orders says about the
// ring and rotation, in a form two proxies can be compared by: every
// replica's address, state, liveness, slot, partitions and rotation.
func setView(p *ProxyProc) (string, admin.SetStatus, error) {
	s, _, err := (&admin.Client{Addr: p.Admin}).Set("orders")
	if err != nil {
		return "", s, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ring %d, in rotation %d, %s;", s.RingSize, s.InRotation, s.Fingerprint)
	for _, r := range s.Replicas {
		fmt.Fprintf(&b, " %s@%s %s down=%v slot=%d parts=%d in=%v;", r.Name, r.Addr, r.State, r.Down, r.Slot, r.Partitions, r.InRotation)
	}
	return b.String(), s, nil
}

// aliveNodes returns the gossip members a proxy lists alive for a
// replica, with their advertised states.
func aliveNodes(p *ProxyProc, replica string) map[string]string {
	ms, _, err := (&admin.Client{Addr: p.Admin}).Members()
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, m := range ms {
		if m.Replica == replica && m.Status == "alive" {
			out[m.Node] = m.State
		}
	}
	return out
}

// restarted says how a proxy must see a restarted replica: at addr, its
// new incarnation (a gossip node other than old) alive and ready.
type restarted struct {
	name, addr, old string
}

// settled reports whether a proxy's view has all three replicas in
// rotation and every restarted replica's new incarnation ready at its
// address; view is the comparable view.
func settled(p *ProxyProc, rs []restarted) (view string, ok bool) {
	view, s, err := setView(p)
	if err != nil || s.InRotation != 3 || s.RingSize != 3 || len(s.Replicas) != 3 {
		return view, false
	}
	for _, r := range s.Replicas {
		if r.State != "ready" || r.Down || !r.InRotation {
			return view, false
		}
	}
	for _, want := range rs {
		i := slices.IndexFunc(s.Replicas, func(r admin.ReplicaStatus) bool { return r.Name == want.name })
		if i < 0 || s.Replicas[i].Addr != want.addr {
			return view, false
		}
		nodes := aliveNodes(p, want.name)
		if _, oldAlive := nodes[want.old]; oldAlive || len(nodes) != 1 {
			return view, false
		}
		for _, state := range nodes {
			if state != "ready" {
				return view, false
			}
		}
	}
	return view, true
}

// TestRestartsSeenByAnIdleProxy: two proxies, three replicas behind
// agents. B routes some traffic, then none while, under load through A,
// one replica is drained (its agent's SIGTERM) and restarted and another
// is killed and restarted — at the same addresses, or at new ones. B was
// idle for longer than its request timeout: its pooled connections to the
// old processes are dead and carry a passed read deadline. B's first
// requests afterwards must all succeed, B must eject nothing, and A and B
// must route every key to the same replica.
func TestRestartsSeenByAnIdleProxy(t *testing.T) {
	slow.Skip(t)
	for _, tc := range []struct {
		name     string
		sameAddr bool
	}{{"same address", true}, {"new address", false}} {
		t.Run(tc.name, func(t *testing.T) { restartsSeenByAnIdleProxy(t, tc.sameAddr) })
	}
}

func restartsSeenByAnIdleProxy(t *testing.T, sameAddr bool) {
	skipShort(t)
	a := startRestartProxy(t, "proxy-a", nil)
	var reps []*ReplicaProc
	for i := 0; i < 3; i++ {
		reps = append(reps, StartReplica(t, fmt.Sprintf("orders-%d", i), []string{a.Gossip}))
	}
	a.WaitRotation(t, 3, 60*time.Second)
	b := startRestartProxy(t, "proxy-b", []string{a.Gossip})
	b.WaitRotation(t, 3, 60*time.Second)

	keys := Keys(2000)
	c := NewClient()
	c.Owners(t, b.Addr, keys, 8) // B's pools to every replica are warm
	bIdleSince := time.Now()

	// Load through A until B has sent its first requests.
	var stop atomic.Bool
	var sentA, failedA atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lc := NewClient()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; !stop.Load() && i < 200000; i++ {
			code, _, err := lc.Send(a.Addr, keys[i%len(keys)])
			sentA.Add(1)
			if err != nil || code != 200 {
				failedA.Add(1)
			}
			<-tick.C
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	oldNode := func(name string) string {
		nodes := aliveNodes(a, name)
		if len(nodes) != 1 {
			t.Fatalf("proxy A lists %d alive gossip members for %s, want 1: %v", len(nodes), name, nodes)
		}
		for node := range nodes {
			return node
		}
		return ""
	}
	restart := func(r *ReplicaProc, old string) restarted {
		if sameAddr {
			p := Start(t, r.Name+"-2", "replica", "--name", r.Name, "--listen", r.Addr)
			p.WaitLine(t, regexp.MustCompile(`listening on`), 20*time.Second)
			r.Replica = p
			r.Agent = StartAgent(t, r.Name, r.Addr, []string{a.Gossip})
		} else {
			*r = *StartReplica(t, r.Name, []string{a.Gossip})
		}
		return restarted{name: r.Name, addr: r.Addr, old: old}
	}

	// orders-0: drained (its agent's SIGTERM), stopped, restarted.
	drained := reps[0]
	old0 := oldNode(drained.Name)
	drained.Agent.Term(t, 30*time.Second)
	drained.Replica.Term(t, 10*time.Second)
	r0 := restart(drained, old0)
	poll.Until(t, 60*time.Second, "proxy A routing with the drained replica's new incarnation", func() bool {
		_, ok := settled(a, []restarted{r0})
		return ok
	})
	// orders-1: killed, no goodbye, restarted.
	killed := reps[1]
	old1 := oldNode(killed.Name)
	killed.Agent.Kill(t)
	killed.Replica.Kill(t)
	r1 := restart(killed, old1)
	restartedAt := time.Now()
	rs := []restarted{r0, r1}

	// Both proxies settle: three in rotation, both new incarnations ready.
	// Right after a restart the new incarnation advertises starting, and
	// each proxy takes it out of rotation for a moment, at its own time.
	var viewA, viewB string
	var aAt, bAt time.Duration
	poll.Until(t, 60*time.Second, "proxies A and B: 3 in rotation, both restarted incarnations ready, the same view", func() bool {
		va, okA := settled(a, rs)
		vb, okB := settled(b, rs)
		if okA && aAt == 0 {
			aAt = time.Since(restartedAt)
		}
		if okA && okB && va == vb && bAt == 0 {
			bAt = time.Since(restartedAt)
		}
		viewA, viewB = va, vb
		return okA && okB && va == vb
	})
	t.Logf("after orders-1's restart, proxy A settled in %s and proxy B's view matched A's in %s (B %s behind): %s",
		aAt.Round(time.Millisecond), bAt.Round(time.Millisecond), (bAt - aAt).Round(time.Millisecond), viewB)
	// The scenario needs B idle for longer than its request timeout (this
	// is normally long past; it is checked, not assumed).
	poll.Until(t, 60*time.Second, "proxy B idle for longer than its request timeout", func() bool {
		return time.Since(bIdleSince) > restartRequestTimeout+500*time.Millisecond
	})
	t.Logf("proxy B was idle for %s (request timeout %s)", time.Since(bIdleSince).Round(time.Millisecond), restartRequestTimeout)

	// B's first requests since the restarts: every key once.
	var failures []string
	ownersB := map[string]string{}
	for _, k := range keys {
		code, rep, err := c.Send(b.Addr, k)
		if err != nil || code != 200 {
			failures = append(failures, fmt.Sprintf("%s: %d %v", k, code, err))
		}
		ownersB[k] = rep
	}
	if len(failures) > 0 {
		t.Errorf("%d of B's first %d requests failed, e.g. %v; B's upstream errors: %v", len(failures), len(keys), failures[0], nonZeroSeries(b.Admin, "keyway_upstream_errors_total"))
	}
	if got := metricSum(b.Admin, "keyway_ejections_total", nil); got != 0 {
		t.Errorf("proxy B ejected %v times", got)
	}
	for _, kind := range []string{"reset", "reused_closed"} {
		if got := metricSum(b.Admin, "keyway_upstream_errors_total", map[string]string{"kind": kind}); got != 0 {
			t.Errorf("proxy B counted %v upstream errors of kind %s", got, kind)
		}
	}
	t.Logf("proxy B: %d first requests, %d failed; upstream errors %v", len(keys), len(failures), nonZeroSeries(b.Admin, "keyway_upstream_errors_total"))
	stop.Store(true)
	wg.Wait()
	t.Logf("proxy A under load: %d requests, %d failed during the restarts", sentA.Load(), failedA.Load())

	// Still settled on both (nothing was ejected meanwhile), A and B send
	// every key to the same replica.
	if v, ok := settled(a, rs); !ok || v != viewA {
		t.Fatalf("proxy A's view changed: %s", v)
	}
	if v, ok := settled(b, rs); !ok || v != viewA {
		t.Fatalf("proxy B's view no longer matches A's: %s", v)
	}
	ownersA := c.Owners(t, a.Addr, keys, 8)
	diff := 0
	for _, k := range keys {
		if ownersA[k] == "" || ownersA[k] != ownersB[k] {
			if diff < 3 {
				t.Errorf("key %s: proxy A sent it to %q, proxy B to %q", k, ownersA[k], ownersB[k])
			}
			diff++
		}
	}
	if diff > 0 {
		t.Fatalf("%d of %d keys routed differently by A and B", diff, len(keys))
	}
}

// nonZeroSeries lists a metric family's samples that are not 0.
func nonZeroSeries(adminAddr, name string) []string {
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, name+"{") && !strings.HasSuffix(l, " 0") {
			out = append(out, l)
		}
	}
	return out
}
