package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/config"
	"keyway/internal/gossipfault"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// partitionProxy runs an in-process proxy for "orders" (3 gossip
// replicas) with the test gossip settings, joining join.
func partitionProxy(t *testing.T, join []string, extraGossip string, o stacktest.Opts) *stacktest.Stack {
	t.Helper()
	yml := fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
gossip:
  enabled: true
  %s%s
health:
  active: {enabled: true, path: /healthz, interval: 2s, timeout: 1s}
  passive: {enabled: true, consecutive_failures: 1, count: [connect, 5xx]}
replica_sets:
  - name: orders
    replicas: 3
    retries: {attempts: 2}
`, gossipYAML(join, "  "), extraGossip)
	cfg, err := config.LoadBytes("partition.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	o.Gossip = true
	return stacktest.StartProxy(t, cfg, o)
}

func readyz(admin string) int {
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A proxy whose gossip is cut off from everyone, under load, keeps every
// key on its owner: its gossip marks every peer dead, but it detects that
// it is the one isolated, keeps routing to the replicas it cannot hear
// (they still answer on the data path), reports the isolation, and after
// the heal routes by gossip again, agreeing with the other proxy.
func TestCutProxyKeepsRoutingUnderLoad(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	a := partitionProxy(t, nil, "", stacktest.Opts{})
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		addr, _ := stacktest.StartDemoReplica(t, name)
		stacktest.StartGossipReplica(t, a.Gossip, membership.Meta{Set: "orders", Replica: name, Addr: addr, State: balancer.StateReady})
	}
	sw := gossipfault.New()
	b := partitionProxy(t, []string{a.Gossip}, "isolated_not_ready: true\n", stacktest.Opts{GossipTransport: sw.Wrap})
	stacktest.WaitRotation(t, a.Admin, "orders", 3)
	stacktest.WaitRotation(t, b.Admin, "orders", 3)

	keys := Keys(300)
	c := NewClient()
	owners := c.Owners(t, b.Proxy, keys, 8)
	ownersA := c.Owners(t, a.Proxy, keys, 8)
	for _, k := range keys {
		if owners[k] != ownersA[k] {
			t.Fatalf("before the cut, key %s: proxy A sends it to %s, proxy B to %s", k, ownersA[k], owners[k])
		}
	}

	// A bounded client loop through proxy B: 4 workers over the keys
	// until stopped (at most 90 s).
	var (
		stop              atomic.Bool
		cutOn             atomic.Bool
		sent, sentDuring  atomic.Int64
		mu                sync.Mutex
		failures, misrout []string
		wg                sync.WaitGroup
	)
	deadline := time.Now().Add(90 * time.Second)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; !stop.Load() && time.Now().Before(deadline); i += 4 {
				k := keys[i%len(keys)]
				during := cutOn.Load()
				code, rep, err := c.Send(b.Proxy, k)
				sent.Add(1)
				if during {
					sentDuring.Add(1)
				}
				mu.Lock()
				switch {
				case err != nil || code != 200:
					failures = append(failures, fmt.Sprintf("%s: %d %v", k, code, err))
				case rep != owners[k]:
					misrout = append(misrout, fmt.Sprintf("%s: %s, owner %s (during the cut: %v)", k, rep, owners[k], during))
				}
				mu.Unlock()
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { stop.Store(true); wg.Wait() })
	t.Cleanup(stopLoad)
	isolated := func() bool {
		return Metric(b.Admin, "keyway_gossip_isolated", nil) == 1
	}
	dead := func(role string) float64 {
		return Metric(b.Admin, "keyway_gossip_members", map[string]string{"role": role, "status": "dead"})
	}

	// The cut: long enough for B's gossip to mark all 4 peers dead.
	poll.Until(t, 10*time.Second, "load flowing", func() bool { return sent.Load() > 100 })
	cutOn.Store(true)
	sw.Cut()
	cutAt := time.Now()
	poll.Until(t, 30*time.Second, "proxy B reports its isolation", isolated)
	detected := time.Since(cutAt)
	if code := readyz(b.Admin); code != http.StatusServiceUnavailable {
		t.Fatalf("B's /readyz answers %d while isolated with isolated_not_ready, want 503", code)
	}
	if fb := fleetOf(t, b.Admin); !fb.Isolated || fb.IsolatedSince.IsZero() {
		t.Fatalf("B's /v1/fleet does not say it is isolated: %+v", fb)
	}
	poll.Until(t, 45*time.Second, "proxy B's gossip marks 3 replicas and proxy A dead", func() bool {
		return dead("replica") == 3 && dead("proxy") == 1
	})
	allDead := time.Since(cutAt)
	// Hold the cut 5 s more, checking all along that B stays isolated
	// with all 3 replicas in rotation.
	for hold := time.Now().Add(5 * time.Second); time.Now().Before(hold); <-time.After(poll.Interval) {
		if !isolated() || Metric(b.Admin, "keyway_rotation_replicas", map[string]string{"set": "orders"}) != 3 {
			t.Fatalf("during the cut: isolated %v, rotation %v", isolated(), Metric(b.Admin, "keyway_rotation_replicas", map[string]string{"set": "orders"}))
		}
	}
	if got := Metric(b.Admin, "keyway_gossip_isolation_held_members", nil); got != 4 {
		t.Fatalf("B holds %v members as last seen alive, want 4", got)
	}
	// Proxy A, on the other side, routes every key as before too.
	for k, o := range c.Owners(t, a.Proxy, keys, 8) {
		if o != owners[k] {
			t.Fatalf("during the cut, proxy A sends key %s to %s, owner %s", k, o, owners[k])
		}
	}

	// The heal.
	sw.Heal()
	cutOn.Store(false)
	healAt := time.Now()
	cutFor := healAt.Sub(cutAt)
	poll.Until(t, 30*time.Second, "proxy B's isolation ends", func() bool { return !isolated() })
	healed := time.Since(healAt)
	poll.Until(t, 10*time.Second, "B's /readyz ready again", func() bool { return readyz(b.Admin) == http.StatusOK })
	poll.Until(t, 10*time.Second, "B's gossip sees every peer alive", func() bool { return dead("replica") == 0 && dead("proxy") == 0 })
	// The two proxies agree on every key within rejoin_interval (5 s)
	// plus 2 s of the heal.
	agree := poll.Within(7*time.Second-time.Since(healAt), func() bool {
		oa, ob := c.Owners(t, a.Proxy, keys, 8), c.Owners(t, b.Proxy, keys, 8)
		for _, k := range keys {
			if oa[k] != ob[k] || ob[k] != owners[k] {
				return false
			}
		}
		return true
	})
	agreed := time.Since(healAt)
	if !agree {
		t.Fatalf("the proxies do not agree on every key %s after the heal", agreed)
	}
	stopLoad()

	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed, e.g. %v", len(failures), sent.Load(), failures[:min(5, len(failures))])
	}
	if len(misrout) > 0 {
		t.Fatalf("%d of %d requests answered by a replica other than the key's owner, e.g. %v", len(misrout), sent.Load(), misrout[:min(5, len(misrout))])
	}
	if got := Metric(b.Admin, "keyway_gossip_isolations_total", nil); got != 1 {
		t.Fatalf("keyway_gossip_isolations_total = %v, want 1", got)
	}
	if !strings.Contains(b.Stderr.String(), "gossip contact lost") || !strings.Contains(b.Stderr.String(), "gossip contact restored") {
		t.Fatalf("B did not log the isolation; stderr: %s", b.Stderr.String())
	}
	t.Logf("cut of %s: isolation detected after %s; all 4 peers dead in B's gossip after %s; %d requests during the cut (%d in all), 0 failed, 0 to another replica; heal: isolation over after %s, both proxies agree on all %d keys %s after the heal",
		cutFor.Round(time.Millisecond), detected.Round(time.Millisecond), allDead.Round(time.Millisecond), sentDuring.Load(), sent.Load(),
		healed.Round(time.Millisecond), len(keys), agreed.Round(time.Millisecond))
}
