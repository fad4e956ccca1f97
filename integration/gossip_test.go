package integration

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"keyway/internal/poll"
)

// cluster starts one seed proxy and n replicas with agents joined to it.
func cluster(t *testing.T, n int) (*ProxyProc, []*ReplicaProc) {
	t.Helper()
	seed := StartProxy(t, "proxy-a", nil, n)
	var reps []*ReplicaProc
	for i := 0; i < n; i++ {
		reps = append(reps, StartReplica(t, fmt.Sprintf("orders-%d", i), []string{seed.Gossip}))
	}
	seed.WaitRotation(t, n, 30*time.Second)
	return seed, reps
}

func TestTwoProxiesRouteEveryKeyIdentically(t *testing.T) {
	skipShort(t)
	a, reps := cluster(t, 3)
	b := StartProxy(t, "proxy-b", []string{reps[1].Agent.cmdGossip(t)}, 3)
	b.WaitRotation(t, 3, 30*time.Second)

	keys := Keys(10000)
	c := NewClient()
	ownersA := c.Owners(t, a.Addr, keys, 8)
	ownersB := c.Owners(t, b.Addr, keys, 8)
	perReplica := map[string]int{}
	for _, k := range keys {
		if ownersA[k] == "" || ownersA[k] != ownersB[k] {
			t.Fatalf("key %s: proxy A sent it to %q, proxy B to %q", k, ownersA[k], ownersB[k])
		}
		perReplica[ownersA[k]]++
	}
	if len(perReplica) != 3 {
		t.Fatalf("10,000 keys reached %d replicas: %v", len(perReplica), perReplica)
	}
	t.Logf("10,000 keys, same owner on both proxies; per replica: %v", perReplica)
	// Both proxies gossip the same ring fingerprint: no disagreement.
	if got := Metric(a.Admin, "keyway_ring_fingerprint_disagreements", nil); got != 0 {
		t.Fatalf("proxy A sees %v fingerprint disagreements", got)
	}
}

// cmdGossip returns the gossip address an agent logged.
func (p *Proc) cmdGossip(t testing.TB) string {
	return p.WaitLine(t, logField("gossip started", "addr"), 20*time.Second)[1]
}

func TestCrashedReplicaKeepsItsPartitions(t *testing.T) {
	skipShort(t)
	px, reps := cluster(t, 3)
	keys := Keys(3000)
	c := NewClient()
	before := c.Owners(t, px.Addr, keys, 8)

	// Crash orders-1: SIGKILL the replica and its agent, no graceful leave.
	victim := reps[1]
	killedAt := time.Now()
	victim.Agent.Kill(t)
	victim.Replica.Kill(t)

	// Every request still succeeds; the first refused connection takes the
	// replica out of rotation on this proxy at once.
	after := c.Owners(t, px.Addr, keys, 1)
	dial := Metric(px.Admin, "keyway_upstream_errors_total", map[string]string{"replica": "orders-1", "kind": "dial"})
	if dial != 1 {
		t.Fatalf("%v refused attempts to the crashed replica, want exactly 1 (then it is out of rotation)", dial)
	}
	moved, movedOther := 0, 0
	for _, k := range keys {
		if before[k] == victim.Name {
			moved++
			if after[k] == victim.Name {
				t.Fatalf("key %s still answered by the crashed replica", k)
			}
		} else if after[k] != before[k] {
			movedOther++
		}
	}
	if movedOther != 0 {
		t.Fatalf("%d keys of live replicas changed owner", movedOther)
	}
	t.Logf("crash: all %d requests after the kill answered 200; the first request for a key of the crashed replica met a refused connection, was retried on the next candidate and ejected the replica (1 dial error in all); %d keys of the crashed replica moved, 0 others", len(keys), moved)

	// Gossip confirms: the member is dead (still on the ring, down).
	poll.Until(t, 30*time.Second, "gossip marks the replica dead", func() bool {
		return Metric(px.Admin, "keyway_gossip_members", map[string]string{"role": "replica", "status": "dead"}) == 1
	})
	t.Logf("gossip marked the crashed replica dead %s after the kill", time.Since(killedAt))
	if got := Metric(px.Admin, "keyway_ring_replicas", map[string]string{"set": "orders"}); got != 3 {
		t.Fatalf("ring has %v replicas after the crash, want 3 (a dead replica keeps its partitions until forget_after)", got)
	}

	// Restart under the same name on a new port: its keys come back.
	restarted := StartReplica(t, victim.Name, []string{px.Gossip})
	if restarted.Addr == victim.Addr {
		t.Logf("restarted on the same address %s", restarted.Addr)
	}
	px.WaitRotation(t, 3, 30*time.Second)
	back := c.Owners(t, px.Addr, keys, 8)
	for _, k := range keys {
		if back[k] != before[k] {
			t.Fatalf("key %s: %s before the crash, %s after the restart", k, before[k], back[k])
		}
	}
}

func TestRollingRestartLosesNothing(t *testing.T) {
	skipShort(t)
	px, reps := cluster(t, 3)
	c := NewClient()

	// A bounded client loop: unique keys, 4 workers, until the restarts
	// are done (at most 2 minutes or 200,000 requests).
	var (
		stop     atomic.Bool
		sent     atomic.Int64
		mu       sync.Mutex
		acked    []string
		failures []string
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(2 * time.Minute)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load() && time.Now().Before(deadline) && sent.Load() < 200000; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				sent.Add(1)
				code, _, err := c.Send(px.Addr, key)
				mu.Lock()
				if err != nil || code != 200 {
					failures = append(failures, fmt.Sprintf("%s: %d %v", key, code, err))
				} else {
					acked = append(acked, key)
				}
				mu.Unlock()
			}
		}()
	}

	received := map[string]bool{}
	collect := func(addr string) {
		for k := range Stats(t, addr) {
			received[k] = true
		}
	}
	for i, r := range reps {
		// SIGTERM the agent: it drains (proxies stop sending, in-flight
		// requests finish), advertises stopped and leaves.
		r.Agent.Term(t, 30*time.Second)
		collect(r.Addr)
		r.Replica.Term(t, 10*time.Second)
		reps[i] = StartReplica(t, r.Name, []string{px.Gossip})
		px.WaitRotation(t, 3, 30*time.Second)
	}
	stop.Store(true)
	wg.Wait()
	for _, r := range reps {
		collect(r.Addr)
	}
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed during the rolling restart, e.g. %v", len(failures), sent.Load(), failures[:min(5, len(failures))])
	}
	lost := 0
	for _, k := range acked {
		if !received[k] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d acknowledged requests were never received by a replica", lost)
	}
	t.Logf("rolling restart of 3 replicas: %d requests, all 2xx, all %d acknowledged ones received", sent.Load(), len(acked))
}

func TestStartingAndRecoveringReplicasGetNoRequests(t *testing.T) {
	skipShort(t)
	px, reps := cluster(t, 3)
	c := NewClient()
	keys := Keys(2000)

	// An agent whose replica is not up yet: starting, not on the ring.
	rp4addr := "127.0.0.1:1" // nothing listens: the probe fails
	agent4 := StartAgent(t, "orders-3", rp4addr, []string{px.Gossip})
	agent4.WaitLine(t, logField("gossip started", "addr"), 20*time.Second)
	poll.Until(t, 20*time.Second, "the proxy sees the starting replica", func() bool {
		return Metric(px.Admin, "keyway_gossip_members", map[string]string{"role": "replica", "status": "alive"}) == 4
	})
	owners := c.Owners(t, px.Addr, keys, 8)
	for k, o := range owners {
		if o == "orders-3" {
			t.Fatalf("key %s reached the starting replica", k)
		}
	}
	if got := Metric(px.Admin, "keyway_ring_replicas", map[string]string{"set": "orders"}); got != 3 {
		t.Fatalf("ring has %v replicas with one starting, want 3", got)
	}

	// Recovering: orders-0 loses readiness; its keys go to their next
	// owners and it gets no request until it is ready again.
	postReady(t, reps[0].Addr, false)
	px.WaitRotation(t, 2, 20*time.Second)
	before := Stats(t, reps[0].Addr)
	during := c.Owners(t, px.Addr, keys, 8)
	for k, o := range during {
		if o == reps[0].Name {
			t.Fatalf("key %s reached the recovering replica", k)
		}
		if owners[k] != reps[0].Name && o != owners[k] {
			t.Fatalf("key %s of a healthy replica moved from %s to %s", k, owners[k], o)
		}
	}
	if after := Stats(t, reps[0].Addr); len(after) != len(before) {
		t.Fatalf("the recovering replica received requests: %d keys before, %d after", len(before), len(after))
	}
	postReady(t, reps[0].Addr, true)
	px.WaitRotation(t, 3, 20*time.Second)
	for k, o := range c.Owners(t, px.Addr, keys, 8) {
		if o != owners[k] {
			t.Fatalf("key %s did not return: %s, was %s", k, o, owners[k])
		}
	}

	// Scale out 3 → 4: the starting replica's process comes up.
	agent4.Kill(t)
	r4 := StartReplica(t, "orders-3", []string{px.Gossip})
	px.WaitRotation(t, 4, 30*time.Second)
	var moved float64
	poll.Until(t, 10*time.Second, "the ring rebuild log line", func() bool {
		for _, l := range px.Logs("ring rebuilt") {
			if j, ok := l["joined"].([]any); ok && len(j) == 1 && j[0] == "orders-3" {
				moved = l["moved_partitions"].(float64)
				return true
			}
		}
		return false
	})
	share := moved / 7919
	if share < 0.15 || share > 0.35 {
		t.Fatalf("scale-out 3→4 moved %.0f partitions (%.1f%%), want about a quarter", moved, 100*share)
	}
	t.Logf("scale-out 3→4 moved %.0f of 7919 partitions (%.1f%%, ideal 25%%), logged", moved, 100*share)
	_ = r4
}

func postReady(t *testing.T, addr string, ready bool) {
	t.Helper()
	resp, err := NewClient().hc.Post(fmt.Sprintf("http://%s/_ready?v=%t", addr, ready), "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}
