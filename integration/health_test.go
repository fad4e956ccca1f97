package integration

// Whole-system tests of health and rotation: passive ejection on
// 500s and on hanging replicas, the share cap, failover strict vs next,
// the all-down policy, and active probes — each with a real `keyway
// proxy` process over static demo replicas (no gossip), the failures
// injected through the demo replica's /_mode and /_ready switches.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/internal/poll"
)

// healthReplica is a demo replica process the proxy knows from its static
// list.
type healthReplica struct {
	Name, Addr string
	Proc       *Proc
}

// startHealthReplicas starts n demo replicas called prefix-0..prefix-(n-1).
func startHealthReplicas(t *testing.T, prefix string, n int) []*healthReplica {
	t.Helper()
	out := make([]*healthReplica, n)
	for i := range out {
		name := fmt.Sprintf("%s-%d", prefix, i)
		p, addr := StartReplicaProcess(t, name)
		out[i] = &healthReplica{Name: name, Addr: addr, Proc: p}
	}
	return out
}

// healthSet is one replica set of a test proxy: every set routes on X-Key
// with short timeouts (a hanging replica costs 500ms, not 15s).
type healthSet struct {
	name, prefix, failover string
	reps                   []*healthReplica
}

// healthProxyYAML is a proxy config without gossip. health is the body of
// the health section, indented by two spaces.
func healthProxyYAML(health string, sets ...healthSet) string {
	var b strings.Builder
	b.WriteString(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
health:
` + health + `
replica_sets:
`)
	for _, s := range sets {
		fmt.Fprintf(&b, `  - name: %s
    replicas: %d
    match: {path_prefix: %s}
    failover: %s
    key: [{header: X-Key}]
    timeouts: {connect: 200ms, request: 500ms}
    static:
`, s.name, len(s.reps), s.prefix, s.failover)
		for _, r := range s.reps {
			fmt.Fprintf(&b, "      - {name: %s, addr: %q}\n", r.Name, r.Addr)
		}
	}
	return b.String()
}

// passiveHealth is a fast passive detector: 3 failures in a row eject,
// swept every 50ms, no supervision holds.
func passiveHealth(base, max time.Duration, share float64) string {
	return fmt.Sprintf(`  passive: {consecutive_failures: 3, base_ejection: %s, max_ejection: %s, interval: 50ms, max_ejected_share: %v}
  supervision: {max_ejections: 0}
`, base, max, share)
}

// startHealthProxy writes cfg and starts a proxy on it, reading its
// addresses from its log as StartProxy does.
func startHealthProxy(t *testing.T, name, cfg string) *ProxyProc {
	t.Helper()
	path := WriteFile(t, t.TempDir(), name+".yaml", cfg)
	p := Start(t, name, "proxy", "-c", path)
	pp := &ProxyProc{Proc: p}
	pp.Addr = p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	pp.Admin = p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	return pp
}

// control POSTs to a demo replica's test switch (/_mode or /_ready).
func replicaSwitch(t *testing.T, r *healthReplica, path, v string) {
	t.Helper()
	resp, err := http.Post("http://"+r.Addr+path+"?v="+v, "text/plain", nil)
	if err != nil {
		t.Fatalf("%s %s?v=%s: %v", r.Name, path, v, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s?v=%s: status %d", r.Name, path, v, resp.StatusCode)
	}
}

// servedBy is the number of requests a demo replica has served
// (failed and hanging ones included, /_stats and probes excluded).
func servedBy(t *testing.T, r *healthReplica) int64 {
	t.Helper()
	resp, err := http.Get("http://" + r.Addr + "/_stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		Requests int64 `json:"requests"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s.Requests
}

// healthReply is one answer through the proxy.
type healthReply struct {
	code       int
	replica    string // the demo replica's name, from a 200
	retryAfter string
	body       string
	kw         keywayError // keyway's own error body, when it answered itself
	took       time.Duration
}

// keywayError is the body of an answer keyway gives itself.
type keywayError struct {
	Error      string `json:"error"`
	ReplicaSet string `json:"replica_set"`
	Replica    string `json:"replica"`
}

// fromKeyway reports whether the answer is keyway's own error body.
func (r healthReply) fromKeyway() bool { return r.kw.ReplicaSet != "" }

// demoFailureBody is what a demo replica in v=500 mode answers.
const demoFailureBody = "demo replica in failure mode"

var healthClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// post POSTs a keyed request to the proxy at path (not replayable).
func healthPost(t *testing.T, proxyAddr, path, key string) healthReply {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+proxyAddr+path, strings.NewReader("payload"))
	req.Header.Set("X-Key", key)
	start := time.Now()
	resp, err := healthClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s key %s: %v", path, key, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	r := healthReply{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(body), took: time.Since(start)}
	if resp.StatusCode == 200 {
		var a Answer
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatalf("POST %s key %s: answer %q: %v", path, key, body, err)
		}
		r.replica = a.Replica
	} else {
		_ = json.Unmarshal(body, &r.kw)
	}
	return r
}

// healthOwners sends every key once to path and returns who answered each; a
// non-200 fails the test.
func healthOwners(t *testing.T, proxyAddr, path string, keys []string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(keys))
	var mu sync.Mutex
	var wg sync.WaitGroup
	var bad []string
	const workers = 8
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(keys); i += workers {
				req, _ := http.NewRequest("POST", "http://"+proxyAddr+path, strings.NewReader("payload"))
				req.Header.Set("X-Key", keys[i])
				resp, err := healthClient.Do(req)
				var a Answer
				status := 0
				if err == nil {
					status = resp.StatusCode
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if status == 200 {
						err = json.Unmarshal(body, &a)
					}
				}
				mu.Lock()
				if err != nil || status != 200 {
					bad = append(bad, fmt.Sprintf("key %s: status %d, %v", keys[i], status, err))
				}
				out[keys[i]] = a.Replica
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of %d requests to %s failed, e.g. %s", len(bad), len(keys), path, bad[0])
	}
	return out
}

// keysOwnedBy returns the keys owners maps to replica, in keys' order.
func keysOwnedBy(keys []string, owners map[string]string, replica string) []string {
	var out []string
	for _, k := range keys {
		if owners[k] == replica {
			out = append(out, k)
		}
	}
	return out
}

// healthMetricSum sums every sample of name whose labels include the given ones.
func healthMetricSum(t *testing.T, adminAddr, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for k, v := range labels {
			if !strings.Contains(l, k+`="`+v+`"`) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil {
			sum += f
		}
	}
	return sum
}

func setLabels(s string, kv ...string) map[string]string {
	m := map[string]string{"set": s}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// rotation is keyway_rotation_replicas of a set.
func rotationOf(admin, setName string) float64 {
	return Metric(admin, "keyway_rotation_replicas", setLabels(setName))
}

// checkStandIns checks a routing during an outage against the healthy one:
// keys of the replicas in out answered by someone else, every other key by
// its owner.
func checkStandIns(t *testing.T, keys []string, before, during map[string]string, out ...string) (moved int) {
	t.Helper()
	isOut := map[string]bool{}
	for _, o := range out {
		isOut[o] = true
	}
	for _, k := range keys {
		switch {
		case isOut[before[k]]:
			if isOut[during[k]] || during[k] == "" {
				t.Fatalf("key %s of %s answered by %q while its owner is out of rotation", k, before[k], during[k])
			}
			moved++
		case during[k] != before[k]:
			t.Fatalf("key %s of in-rotation %s answered by %s: a key that did not have to move moved", k, before[k], during[k])
		}
	}
	return moved
}

// TestHealthFiveHundredsEjectAndReadmitWithoutRingRebuild: a replica that
// answers 500 is ejected by the consecutive_failures-th, its 500s relayed
// as they are; its keys go to their stand-ins from the next request on; after the backoff it comes
// back with its keys; and the flap rebuilds rotation, never the ring.
func TestHealthFiveHundredsEjectAndReadmitWithoutRingRebuild(t *testing.T) {
	skipShort(t)
	reps := startHealthReplicas(t, "flap", 3)
	px := startHealthProxy(t, "proxy-flap", healthProxyYAML(passiveHealth(2*time.Second, 8*time.Second, 0.5),
		healthSet{"orders", "/", "next", reps}))
	poll.Until(t, 10*time.Second, "3 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 3 })

	keys := Keys(300)
	before := healthOwners(t, px.Addr, "/ingest", keys)
	victim := reps[1]
	vkeys := keysOwnedBy(keys, before, victim.Name)
	if len(vkeys) < 10 {
		t.Fatalf("only %d of %d keys owned by %s", len(vkeys), len(keys), victim.Name)
	}
	ringRebuilds := Metric(px.Admin, "keyway_table_rebuilds_total", setLabels("orders", "ring", "true"))
	rotRebuilds := max(Metric(px.Admin, "keyway_table_rebuilds_total", setLabels("orders", "ring", "false")), 0)
	moved0 := Metric(px.Admin, "keyway_ring_moved_partitions_total", setLabels("orders"))
	if ringRebuilds < 1 {
		t.Fatalf("keyway_table_rebuilds_total{ring=\"true\"} = %v before any failure, want the initial build", ringRebuilds)
	}
	ejections := setLabels("orders", "replica", victim.Name, "reason", "5xx")
	if got := Metric(px.Admin, "keyway_ejections_total", ejections); got != 0 {
		t.Fatalf("keyway_ejections_total%v = %v before any failure", ejections, got)
	}

	// v=500: the first consecutive_failures requests get the replica's own
	// 500, relayed — never a made-up 2xx, never a retry elsewhere.
	replicaSwitch(t, victim, "/_mode", "500")
	served := servedBy(t, victim)
	firstFail := time.Now()
	for _, k := range vkeys[:3] {
		r := healthPost(t, px.Addr, "/ingest", k)
		if r.code != 500 || r.fromKeyway() || !strings.Contains(r.body, demoFailureBody) {
			t.Fatalf("key %s of failing %s: status %d body %q, want the replica's own 500 relayed", k, victim.Name, r.code, r.body)
		}
	}
	if got := servedBy(t, victim) - served; got != 3 {
		t.Fatalf("%s served %d requests for 3 sends", victim.Name, got)
	}
	// The third 500 ejected the replica before it was relayed, without
	// waiting for a passive sweep: it is out already, and the
	// very next request for one of its keys goes to a stand-in.
	if got := Metric(px.Admin, "keyway_ejections_total", ejections); got != 1 {
		t.Fatalf("keyway_ejections_total%v = %v once the third 500 was relayed, want 1", ejections, got)
	}
	ejectedAt := time.Now()
	if got := rotationOf(px.Admin, "orders"); got != 2 {
		t.Fatalf("%v replicas in rotation once the third 500 was relayed, want 2", got)
	}
	if r := healthPost(t, px.Addr, "/ingest", vkeys[3]); r.code != 200 || r.replica == victim.Name {
		t.Fatalf("the request after the third 500 (key %s): %d from %q, want a stand-in's 200", vkeys[3], r.code, r.replica)
	}
	if got := servedBy(t, victim) - served; got != 3 {
		t.Fatalf("%s served %d requests, want the 3 that ejected it", victim.Name, got)
	}
	if got := Metric(px.Admin, "keyway_ejected_replicas", setLabels("orders")); got != 1 {
		t.Fatalf("keyway_ejected_replicas = %v, want 1", got)
	}
	t.Logf("3 consecutive 500s relayed as they were; ejection (reason 5xx) observed %s after the first 500, the fourth request on a stand-in",
		ejectedAt.Sub(firstFail).Round(time.Millisecond))

	// Its keys go to their stand-ins with 200, the same stand-in each time;
	// no other key moves; the ejected replica gets nothing.
	served = servedBy(t, victim)
	during := healthOwners(t, px.Addr, "/ingest", keys)
	again := healthOwners(t, px.Addr, "/ingest", vkeys)
	moved := checkStandIns(t, keys, before, during, victim.Name)
	for _, k := range vkeys {
		if again[k] != during[k] {
			t.Fatalf("key %s: stand-in %s, then %s", k, during[k], again[k])
		}
	}
	if got := servedBy(t, victim) - served; got != 0 {
		t.Fatalf("ejected %s received %d requests", victim.Name, got)
	}

	// v=ok: after base_ejection it is readmitted and its keys come back.
	replicaSwitch(t, victim, "/_mode", "ok")
	okAt := time.Now()
	poll.Until(t, 10*time.Second, victim.Name+" readmitted", func() bool { return rotationOf(px.Admin, "orders") == 3 })
	backAt := time.Now()
	if backAt.Sub(firstFail) < 2*time.Second {
		t.Fatalf("readmitted %s after the first 500, before base_ejection (2s) could have elapsed", backAt.Sub(firstFail))
	}
	after := healthOwners(t, px.Addr, "/ingest", keys)
	for _, k := range keys {
		if after[k] != before[k] {
			t.Fatalf("key %s: %s before the ejection, %s after the readmission", k, before[k], after[k])
		}
	}
	if got := Metric(px.Admin, "keyway_ejections_total", ejections); got != 1 {
		t.Fatalf("keyway_ejections_total = %v after readmission, want 1", got)
	}
	if got := Metric(px.Admin, "keyway_ejected_replicas", setLabels("orders")); got != 0 {
		t.Fatalf("keyway_ejected_replicas = %v after readmission, want 0", got)
	}
	t.Logf("%d keys of %s went to stand-ins (200, stable), 0 others moved; readmitted %s after v=ok, %s after the ejection was observed (base_ejection 2s)",
		moved, victim.Name, backAt.Sub(okAt).Round(time.Millisecond), backAt.Sub(ejectedAt).Round(time.Millisecond))

	// A health flap never rebuilds the ring.
	ringNow := Metric(px.Admin, "keyway_table_rebuilds_total", setLabels("orders", "ring", "true"))
	rotNow := Metric(px.Admin, "keyway_table_rebuilds_total", setLabels("orders", "ring", "false"))
	if ringNow != ringRebuilds {
		t.Fatalf("ring rebuilds went from %v to %v across an ejection and a readmission", ringRebuilds, ringNow)
	}
	if rotNow < rotRebuilds+2 {
		t.Fatalf("rotation-only rebuilds went from %v to %v, want at least 2 more (out, back in)", rotRebuilds, rotNow)
	}
	if got := Metric(px.Admin, "keyway_ring_moved_partitions_total", setLabels("orders")); got != moved0 {
		t.Fatalf("keyway_ring_moved_partitions_total went from %v to %v", moved0, got)
	}
	t.Logf("table rebuilds: ring=true %v → %v, ring=false %v → %v", ringRebuilds, ringNow, rotRebuilds, rotNow)
}

// TestHealthHangingReplicaEjectedByTimeouts: a replica that accepts
// connections and never answers costs each POST a 504 (not replayed
// elsewhere), and consecutive_failures timeouts eject it.
func TestHealthHangingReplicaEjectedByTimeouts(t *testing.T) {
	skipShort(t)
	reps := startHealthReplicas(t, "hang", 3)
	px := startHealthProxy(t, "proxy-hang", healthProxyYAML(passiveHealth(10*time.Second, 20*time.Second, 0.5),
		healthSet{"orders", "/", "next", reps}))
	poll.Until(t, 10*time.Second, "3 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 3 })

	keys := Keys(300)
	before := healthOwners(t, px.Addr, "/ingest", keys)
	victim, others := reps[1], []*healthReplica{reps[0], reps[2]}
	vkeys := keysOwnedBy(keys, before, victim.Name)
	if len(vkeys) < 10 {
		t.Fatalf("only %d of %d keys owned by %s", len(vkeys), len(keys), victim.Name)
	}
	othersServed := map[string]int64{}
	for _, o := range others {
		othersServed[o.Name] = servedBy(t, o)
	}
	retries0 := Metric(px.Admin, "keyway_retries_total", setLabels("orders"))

	replicaSwitch(t, victim, "/_mode", "hang")
	defer replicaSwitch(t, victim, "/_mode", "ok") // let the hanging handlers return
	first := time.Now()
	for _, k := range vkeys[:3] {
		r := healthPost(t, px.Addr, "/ingest", k)
		if r.code != 504 || r.kw.Replica != victim.Name {
			t.Fatalf("key %s of hanging %s: status %d body %q, want keyway's 504 naming the replica", k, victim.Name, r.code, r.body)
		}
		if r.took < 400*time.Millisecond {
			t.Fatalf("key %s: 504 after %s, before timeouts.request (500ms)", k, r.took)
		}
		t.Logf("key %s: 504 after %s", k, r.took.Round(time.Millisecond))
	}
	// POST is not replayable: nothing went to another replica.
	for _, o := range others {
		if got := servedBy(t, o) - othersServed[o.Name]; got != 0 {
			t.Fatalf("%s received %d requests while %s hung: a non-replayable POST was retried", o.Name, got, victim.Name)
		}
		st := Stats(t, o.Addr)
		for _, k := range vkeys[:3] {
			if st[k] != 0 {
				t.Fatalf("%s saw key %s %d times", o.Name, k, st[k])
			}
		}
	}
	if got := Metric(px.Admin, "keyway_retries_total", setLabels("orders")); got != retries0 {
		t.Fatalf("keyway_retries_total went from %v to %v", retries0, got)
	}
	if got := Metric(px.Admin, "keyway_upstream_errors_total", setLabels("orders", "replica", victim.Name, "kind", "timeout")); got != 3 {
		t.Fatalf("keyway_upstream_errors_total{kind=timeout} = %v, want 3", got)
	}

	ejections := setLabels("orders", "replica", victim.Name, "reason", "timeout")
	poll.Until(t, 5*time.Second, victim.Name+" ejected for timeouts", func() bool { return Metric(px.Admin, "keyway_ejections_total", ejections) == 1 })
	ejectedAt := time.Now()
	poll.Until(t, 5*time.Second, "2 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 2 })
	for _, reason := range []string{"5xx", "reset", "connect"} {
		if got := Metric(px.Admin, "keyway_ejections_total", setLabels("orders", "replica", victim.Name, "reason", reason)); got != 0 {
			t.Fatalf("keyway_ejections_total{reason=%s} = %v, want 0", reason, got)
		}
	}
	during := healthOwners(t, px.Addr, "/ingest", keys)
	moved := checkStandIns(t, keys, before, during, victim.Name)
	t.Logf("3 timeouts of 500ms; ejection (reason timeout) observed %s after the first request was sent; then %d keys of %s answered 200 by stand-ins, 0 others moved",
		ejectedAt.Sub(first).Round(time.Millisecond), moved, victim.Name)
}

// TestHealthShareCapHoldsWhenAllFail: with every replica answering 500,
// no more than max_ejected_share of the set is ejected, and the replicas
// the cap keeps in are counted.
func TestHealthShareCapHoldsWhenAllFail(t *testing.T) {
	skipShort(t)
	reps := startHealthReplicas(t, "cap", 4)
	px := startHealthProxy(t, "proxy-cap", healthProxyYAML(passiveHealth(10*time.Second, 20*time.Second, 0.5),
		healthSet{"orders", "/", "next", reps}))
	poll.Until(t, 10*time.Second, "4 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 4 })
	for _, r := range reps {
		replicaSwitch(t, r, "/_mode", "500")
	}

	keys := Keys(40)
	sent := 0
	send := func() {
		for _, k := range keys {
			r := healthPost(t, px.Addr, "/ingest", k)
			sent++
			if r.code != 500 || r.fromKeyway() || !strings.Contains(r.body, demoFailureBody) {
				t.Fatalf("request %d (key %s): status %d body %q, want a replica's 500 relayed", sent, k, r.code, r.body)
			}
		}
	}
	start := time.Now()
	poll.Until(t, 10*time.Second, "2 ejected and 2 capped", func() bool {
		send()
		return Metric(px.Admin, "keyway_ejected_replicas", setLabels("orders")) >= 2 &&
			Metric(px.Admin, "keyway_ejection_share_capped_total", setLabels("orders")) >= 2
	})
	t.Logf("cap reached %s after the first request, %d requests (all 500s relayed)", time.Since(start).Round(time.Millisecond), sent)

	// More failing traffic changes nothing: still exactly half out.
	for range 5 {
		send()
	}
	ejected := Metric(px.Admin, "keyway_ejected_replicas", setLabels("orders"))
	inRotation := rotationOf(px.Admin, "orders")
	total := healthMetricSum(t, px.Admin, "keyway_ejections_total", setLabels("orders"))
	capped := Metric(px.Admin, "keyway_ejection_share_capped_total", setLabels("orders"))
	var who []string
	for _, r := range reps {
		n := Metric(px.Admin, "keyway_ejections_total", setLabels("orders", "replica", r.Name, "reason", "5xx"))
		if n > 1 {
			t.Fatalf("%s ejected %v times within its 10s backoff", r.Name, n)
		}
		if n == 1 {
			who = append(who, r.Name)
		}
	}
	if ejected != 2 || inRotation != 2 || total != 2 || len(who) != 2 {
		t.Fatalf("4 failing replicas, max_ejected_share 0.5: ejected_replicas %v, in rotation %v, ejections %v (%v); want 2, 2, 2", ejected, inRotation, total, who)
	}
	if capped != 2 {
		t.Fatalf("keyway_ejection_share_capped_total = %v, want 2 (each replica kept in counted once)", capped)
	}
	t.Logf("after %d requests: ejected %v, 2 in rotation, capped_total %v", sent, who, capped)
}

// TestHealthFailoverStrictVersusNext: with the owner of a key ejected,
// failover next sends it to its stand-in and failover strict refuses it
// with 503 + Retry-After naming the owner; other keys are unaffected.
func TestHealthFailoverStrictVersusNext(t *testing.T) {
	skipShort(t)
	reps := startHealthReplicas(t, "fo", 3)
	px := startHealthProxy(t, "proxy-fo", healthProxyYAML(passiveHealth(10*time.Second, 20*time.Second, 0.5),
		healthSet{"next", "/next", "next", reps}, healthSet{"strict", "/strict", "strict", reps}))
	poll.Until(t, 10*time.Second, "3 replicas in rotation in both sets", func() bool {
		return rotationOf(px.Admin, "next") == 3 && rotationOf(px.Admin, "strict") == 3
	})

	keys := Keys(300)
	before := healthOwners(t, px.Addr, "/next/ingest", keys)
	beforeStrict := healthOwners(t, px.Addr, "/strict/ingest", keys)
	for _, k := range keys {
		if before[k] != beforeStrict[k] {
			t.Fatalf("key %s: %s in set next, %s in set strict over the same replicas", k, before[k], beforeStrict[k])
		}
	}
	victim := reps[1]
	vkeys := keysOwnedBy(keys, before, victim.Name)
	if len(vkeys) < 10 {
		t.Fatalf("only %d of %d keys owned by %s", len(vkeys), len(keys), victim.Name)
	}

	// Eject it in both sets (each set has its own detector), then heal it:
	// anything still sent to it would be answered 200 by it.
	replicaSwitch(t, victim, "/_mode", "500")
	for _, path := range []string{"/next/ingest", "/strict/ingest"} {
		for _, k := range vkeys[:3] {
			if r := healthPost(t, px.Addr, path, k); r.code != 500 || r.fromKeyway() {
				t.Fatalf("%s key %s: status %d body %q, want the replica's 500", path, k, r.code, r.body)
			}
		}
	}
	poll.Until(t, 5*time.Second, victim.Name+" ejected in both sets", func() bool {
		return rotationOf(px.Admin, "next") == 2 && rotationOf(px.Admin, "strict") == 2
	})
	replicaSwitch(t, victim, "/_mode", "ok")
	served := servedBy(t, victim)
	noReplica0 := Metric(px.Admin, "keyway_local_responses_total", setLabels("strict", "reason", "no_replica"))

	during := healthOwners(t, px.Addr, "/next/ingest", keys)
	moved := checkStandIns(t, keys, before, during, victim.Name)
	for _, k := range vkeys {
		r := healthPost(t, px.Addr, "/strict/ingest", k)
		ra, err := strconv.Atoi(r.retryAfter)
		if r.code != 503 || err != nil || ra < 1 {
			t.Fatalf("strict, key %s of ejected %s: status %d Retry-After %q body %q, want 503 with Retry-After", k, victim.Name, r.code, r.retryAfter, r.body)
		}
		if r.kw.Replica != victim.Name || r.kw.ReplicaSet != "strict" || r.kw.Error == "" {
			t.Fatalf("strict, key %s: error body %q, want JSON naming set strict and replica %s", k, r.body, victim.Name)
		}
	}
	strictOthers := healthOwners(t, px.Addr, "/strict/ingest", keysOwnedBy(keys, before, reps[0].Name))
	for k, o := range healthOwners(t, px.Addr, "/strict/ingest", keysOwnedBy(keys, before, reps[2].Name)) {
		strictOthers[k] = o
	}
	for k, o := range strictOthers {
		if o != before[k] {
			t.Fatalf("strict, key %s of in-rotation %s answered by %s", k, before[k], o)
		}
	}
	if got := servedBy(t, victim) - served; got != 0 {
		t.Fatalf("ejected %s received %d requests", victim.Name, got)
	}
	if got := Metric(px.Admin, "keyway_local_responses_total", setLabels("strict", "reason", "no_replica")) - noReplica0; got != float64(len(vkeys)) {
		t.Fatalf("local_responses_total{set=strict,reason=no_replica} grew by %v, want %d", got, len(vkeys))
	}
	r := healthPost(t, px.Addr, "/strict/ingest", vkeys[0])
	t.Logf("owner %s ejected: next → %d keys to stand-ins with 200; strict → %d × 503 Retry-After %s, body %s; %d other keys 200 from their owners on both",
		victim.Name, moved, len(vkeys), r.retryAfter, strings.TrimSpace(r.body), len(strictOthers))
}

// TestHealthAllDownFailClosedVersusFailOpen: with every replica failing
// its active probe (while still answering requests), a fail_closed proxy
// answers 503 itself and a fail_open one routes by hash to the ring owner;
// both count it.
func TestHealthAllDownFailClosedVersusFailOpen(t *testing.T) {
	skipShort(t)
	reps := startHealthReplicas(t, "down", 3)
	probes := `  active: {enabled: true, path: /readyz, interval: 300ms, timeout: 250ms, rise: 1, fall: 2}
`
	closed := startHealthProxy(t, "proxy-closed", healthProxyYAML(probes+"  all_down: fail_closed\n", healthSet{"orders", "/", "next", reps}))
	open := startHealthProxy(t, "proxy-open", healthProxyYAML(probes+"  all_down: fail_open\n", healthSet{"orders", "/", "next", reps}))
	for _, px := range []*ProxyProc{closed, open} {
		poll.Until(t, 10*time.Second, px.Name+": 3 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 3 })
	}
	keys := Keys(60)
	owners := healthOwners(t, closed.Addr, "/ingest", keys)
	for k, o := range healthOwners(t, open.Addr, "/ingest", keys) {
		if owners[k] != o {
			t.Fatalf("key %s: %s on one proxy, %s on the other", k, owners[k], o)
		}
	}
	closedAll := setLabels("orders", "policy", "fail_closed")
	openAll := setLabels("orders", "policy", "fail_open")
	if a, b := Metric(closed.Admin, "keyway_all_replicas_unhealthy_total", closedAll), Metric(open.Admin, "keyway_all_replicas_unhealthy_total", openAll); a != 0 || b != 0 {
		t.Fatalf("all_replicas_unhealthy_total before the outage: fail_closed %v, fail_open %v; want 0, 0", a, b)
	}

	for _, r := range reps {
		replicaSwitch(t, r, "/_ready", "false")
	}
	unready := time.Now()
	for _, px := range []*ProxyProc{closed, open} {
		poll.Until(t, 10*time.Second, px.Name+": no replica in rotation", func() bool { return rotationOf(px.Admin, "orders") == 0 })
	}
	t.Logf("every /readyz failing: both proxies had 0 replicas in rotation %s later", time.Since(unready).Round(time.Millisecond))

	// fail_closed: keyway answers 503 itself; no replica gets a request.
	served := map[string]int64{}
	for _, r := range reps {
		served[r.Name] = servedBy(t, r)
	}
	var sample healthReply
	for _, k := range keys {
		r := healthPost(t, closed.Addr, "/ingest", k)
		ra, err := strconv.Atoi(r.retryAfter)
		if r.code != 503 || err != nil || ra < 1 || !r.fromKeyway() {
			t.Fatalf("fail_closed, key %s: status %d Retry-After %q body %q, want keyway's 503 with Retry-After", k, r.code, r.retryAfter, r.body)
		}
		sample = r
	}
	for _, r := range reps {
		if got := servedBy(t, r) - served[r.Name]; got != 0 {
			t.Fatalf("fail_closed: %s received %d requests", r.Name, got)
		}
	}
	if got := Metric(closed.Admin, "keyway_all_replicas_unhealthy_total", closedAll); got != float64(len(keys)) {
		t.Fatalf("fail_closed: all_replicas_unhealthy_total = %v, want %d", got, len(keys))
	}

	// fail_open: routed by hash to the ring owner anyway.
	for _, k := range keys {
		if r := healthPost(t, open.Addr, "/ingest", k); r.code != 200 || r.replica != owners[k] {
			t.Fatalf("fail_open, key %s: status %d from %q body %q, want 200 from its owner %s", k, r.code, r.replica, r.body, owners[k])
		}
	}
	if got := Metric(open.Admin, "keyway_all_replicas_unhealthy_total", openAll); got != float64(len(keys)) {
		t.Fatalf("fail_open: all_replicas_unhealthy_total = %v, want %d", got, len(keys))
	}
	t.Logf("all down: fail_closed → %d × 503 (Retry-After %s, %s), no replica reached; fail_open → %d × 200 from the ring owner; each counted %d",
		len(keys), sample.retryAfter, strings.TrimSpace(sample.body), len(keys), len(keys))

	// Recovery: the probes pass again and the replicas come back.
	for _, r := range reps {
		replicaSwitch(t, r, "/_ready", "true")
	}
	ready := time.Now()
	for _, px := range []*ProxyProc{closed, open} {
		poll.Until(t, 10*time.Second, px.Name+": 3 replicas back in rotation", func() bool { return rotationOf(px.Admin, "orders") == 3 })
	}
	t.Logf("/readyz passing again: 3 in rotation on both proxies %s later", time.Since(ready).Round(time.Millisecond))
	healthOwners(t, closed.Addr, "/ingest", keys)
}

// TestHealthActiveProbeTakesOutAndBringsBack: a static replica whose
// /readyz fails leaves rotation after `fall` failed probes and returns
// after `rise` passes, keyway_health_probe_up following, the ring intact.
func TestHealthActiveProbeTakesOutAndBringsBack(t *testing.T) {
	skipShort(t)
	const rise, fall = 2, 3
	reps := startHealthReplicas(t, "probe", 3)
	px := startHealthProxy(t, "proxy-probe", healthProxyYAML(
		fmt.Sprintf("  active: {enabled: true, path: /readyz, interval: 300ms, timeout: 250ms, rise: %d, fall: %d}\n", rise, fall),
		healthSet{"orders", "/", "next", reps}))
	poll.Until(t, 10*time.Second, "3 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 3 })

	keys := Keys(300)
	before := healthOwners(t, px.Addr, "/ingest", keys)
	victim := reps[1]
	up := func(r *healthReplica) float64 {
		return Metric(px.Admin, "keyway_health_probe_up", setLabels("orders", "replica", r.Name))
	}
	probes := func(result string) float64 {
		return Metric(px.Admin, "keyway_health_probes_total", setLabels("orders", "replica", victim.Name, "result", result))
	}
	poll.Until(t, 5*time.Second, "a first probe of "+victim.Name, func() bool { return probes("pass") >= 1 })
	for _, r := range reps {
		if got := up(r); got != 1 {
			t.Fatalf("keyway_health_probe_up{%s} = %v with /readyz passing", r.Name, got)
		}
	}
	ringRebuilds := Metric(px.Admin, "keyway_table_rebuilds_total", setLabels("orders", "ring", "true"))
	bad0 := probes("bad_status")

	replicaSwitch(t, victim, "/_ready", "false")
	unready := time.Now()
	poll.Until(t, 5*time.Second, victim.Name+" probe down", func() bool { return up(victim) == 0 })
	downAfter := time.Since(unready)
	// The failure counter is bumped before the verdict flips, so a later
	// read shows every failure that took it out.
	if bad := probes("bad_status") - bad0; bad < fall {
		t.Fatalf("%s went down after %v failed probes, want at least fall=%d", victim.Name, bad, fall)
	}
	poll.Until(t, 5*time.Second, "2 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 2 })
	for _, r := range []*healthReplica{reps[0], reps[2]} {
		if got := up(r); got != 1 {
			t.Fatalf("keyway_health_probe_up{%s} = %v, want 1", r.Name, got)
		}
	}
	during := healthOwners(t, px.Addr, "/ingest", keys)
	moved := checkStandIns(t, keys, before, during, victim.Name)

	pass0 := probes("pass")
	replicaSwitch(t, victim, "/_ready", "true")
	ready := time.Now()
	poll.Until(t, 5*time.Second, victim.Name+" probe up", func() bool { return up(victim) == 1 })
	upAfter := time.Since(ready)
	if pass := probes("pass") - pass0; pass < rise {
		t.Fatalf("%s came back after %v passing probes, want at least rise=%d", victim.Name, pass, rise)
	}
	poll.Until(t, 5*time.Second, "3 replicas in rotation", func() bool { return rotationOf(px.Admin, "orders") == 3 })
	after := healthOwners(t, px.Addr, "/ingest", keys)
	for _, k := range keys {
		if after[k] != before[k] {
			t.Fatalf("key %s: %s before, %s after the probe flap", k, before[k], after[k])
		}
	}
	if got := Metric(px.Admin, "keyway_table_rebuilds_total", setLabels("orders", "ring", "true")); got != ringRebuilds {
		t.Fatalf("ring rebuilds went from %v to %v across a probe flap", ringRebuilds, got)
	}
	if got := healthMetricSum(t, px.Admin, "keyway_ejections_total", setLabels("orders")); got != 0 {
		t.Fatalf("%v passive ejections while the replicas answered every request", got)
	}
	t.Logf("probe interval 100ms, fall %d, rise %d: probe_up 0 %s after /readyz failed (%d keys to stand-ins, 0 others moved); probe_up 1 %s after it passed again; keys back, ring not rebuilt",
		fall, rise, downAfter.Round(time.Millisecond), moved, upAfter.Round(time.Millisecond))
}
