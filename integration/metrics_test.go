package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"keyway/admin"
	"keyway/balancer"
	"keyway/config"
	"keyway/internal/poll"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/membership"
)

// metricsStack is a proxy run by serve in-process with gossip (port 0),
// active and passive health checks and the audit trail on.
type metricsStack struct {
	proxy, admin, gossip string
}

func startMetricsStack(t *testing.T, sets string) *metricsStack {
	t.Helper()
	yml := `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
audit: {dir: ` + fmt.Sprintf("%q", t.TempDir()) + `}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast}
health:
  # Probes every 30s: /healthz always passes, and probe counts stay out
  # of the comparison.
  active: {enabled: true, path: /healthz, interval: 30s, timeout: 5s}
  # Three 5xx in a row eject for a minute: longer than the test.
  passive: {enabled: true, consecutive_failures: 3, count: [5xx], base_ejection: 1m, interval: 50ms}
replica_sets:
` + sets
	cfg, err := config.LoadBytes("metrics.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	stk := stacktest.StartProxy(t, cfg, stacktest.Opts{Gossip: true})
	st := &metricsStack{proxy: stk.Proxy, admin: stk.Admin, gossip: stk.Gossip}
	return st
}

// send posts one request with an X-Key (and the given extra headers) and
// returns the status and the body.
func (st *metricsStack) send(t *testing.T, path, key string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+st.proxy+path, strings.NewReader("x"))
	req.Header.Set("X-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// keyOwnedBy returns the first key k-0, k-1, ... whose ring owner is
// replica, asking the admin API (the router decides, not a guess).
func (st *metricsStack) keyOwnedBy(t *testing.T, set, replica string) string {
	t.Helper()
	for i := range 1000 {
		key := fmt.Sprintf("k-%d", i)
		var ex admin.RouteExplain
		stacktest.GetJSON(t, "http://"+st.admin+"/v1/route?set="+set+"&key="+url.QueryEscape(key), &ex)
		if ex.Owner == replica {
			return key
		}
	}
	t.Fatalf("no key of k-0..k-999 is owned by %s", replica)
	return ""
}

func (st *metricsStack) scrape(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + st.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// waitMetric polls /metrics until it has the exact sample line.
func (st *metricsStack) waitMetric(t *testing.T, line string) {
	t.Helper()
	poll.Until(t, 30*time.Second, fmt.Sprintf("%q on /metrics", line), func() bool {
		return slices.Contains(strings.Split(st.scrape(t), "\n"), line)
	})
}

// scenarioFamilies are the metric families whose exposition the scripted
// scenario fixes exactly: every keyway family whose values do not depend
// on timing. Left out: the latency and rebuild-time histograms, the
// active probe counts (probes run on their own schedule), the gossip
// health score and event counts, and go_/process_ families.
var scenarioFamilies = strings.Fields(`
keyway_requests_total keyway_upstream_errors_total keyway_retries_total keyway_local_responses_total keyway_shed_total
keyway_all_replicas_unhealthy_total keyway_inflight_requests keyway_memory_guard_shedding
keyway_table_rebuilds_total keyway_ring_moved_partitions_total keyway_ring_replicas keyway_rotation_replicas
keyway_replica_in_rotation keyway_replica_state keyway_replica_set_phase
keyway_ejections_total keyway_ejected_replicas keyway_ejection_share_capped_total keyway_failed_holds_total keyway_health_probe_up
keyway_gossip_members keyway_gossip_replicas keyway_ring_fingerprint_disagreements keyway_ring_fingerprint_mismatches_total
keyway_audit_events_total`)

// scenarioExposition is what /metrics shows for scenarioFamilies after the
// scenario of TestMetricsScenarioAndLint ({{partitions}}: the ring's
// partition count, all of which moved when the first ring was built).
//
//   - orders-0 answered 5 + 2 requests (2xx); a sixth hung and timed out:
//     a 504 keyway answered itself (replica "none", upstream_timeout) and
//     a timeout upstream error of orders-0, not retried;
//   - orders-1 answered 3 (2xx), then 3 × 500, which ejected it (reason
//     5xx): out of rotation, still on the ring and ready, the set Degraded;
//   - two tables: the first ring (ring="true") and the ejection
//     (ring="false"); audit events for both, the two phases (Running, then
//     Degraded), the ejection and the rotation change;
//   - gossip on, no peers: the proxy alone.
const scenarioExposition = `
# HELP keyway_all_replicas_unhealthy_total Requests that found no replica of their set in rotation, by the all-down policy applied (fail_closed: 503; fail_open: routed by hash anyway).
# TYPE keyway_all_replicas_unhealthy_total counter
keyway_all_replicas_unhealthy_total{policy="fail_closed",set="orders"} 0
# HELP keyway_audit_events_total Audit events emitted, by kind (whether or not they reached a file).
# TYPE keyway_audit_events_total counter
keyway_audit_events_total{kind="ejected"} 1
keyway_audit_events_total{kind="phase_change"} 2
keyway_audit_events_total{kind="ring_rebuild"} 1
keyway_audit_events_total{kind="rotation_change"} 1
# HELP keyway_ejected_replicas Replicas of a set held out of rotation by passive checks now (ejected or in a supervision hold).
# TYPE keyway_ejected_replicas gauge
keyway_ejected_replicas{set="orders"} 1
# HELP keyway_ejection_share_capped_total Times a replica that should have been ejected stayed in rotation because passive.max_ejected_share of its set was already out.
# TYPE keyway_ejection_share_capped_total counter
keyway_ejection_share_capped_total{set="orders"} 0
# HELP keyway_ejections_total Passive ejections of replicas after consecutive failed requests, by the failure kind that tripped them (connect, timeout, reset, 5xx); includes ejections that started a supervision hold.
# TYPE keyway_ejections_total counter
keyway_ejections_total{reason="5xx",replica="orders-0",set="orders"} 0
keyway_ejections_total{reason="5xx",replica="orders-1",set="orders"} 1
keyway_ejections_total{reason="connect",replica="orders-0",set="orders"} 0
keyway_ejections_total{reason="connect",replica="orders-1",set="orders"} 0
keyway_ejections_total{reason="reset",replica="orders-0",set="orders"} 0
keyway_ejections_total{reason="reset",replica="orders-1",set="orders"} 0
keyway_ejections_total{reason="timeout",replica="orders-0",set="orders"} 0
keyway_ejections_total{reason="timeout",replica="orders-1",set="orders"} 0
# HELP keyway_failed_holds_total Supervision holds: a replica ejected supervision.max_ejections times within supervision.window, held out as failed.
# TYPE keyway_failed_holds_total counter
keyway_failed_holds_total{replica="orders-0",set="orders"} 0
keyway_failed_holds_total{replica="orders-1",set="orders"} 0
# HELP keyway_gossip_members Gossip members this node knows, by role and status (alive, dead, left), itself included.
# TYPE keyway_gossip_members gauge
keyway_gossip_members{role="proxy",status="alive"} 1
keyway_gossip_members{role="proxy",status="dead"} 0
keyway_gossip_members{role="proxy",status="left"} 0
keyway_gossip_members{role="replica",status="alive"} 0
keyway_gossip_members{role="replica",status="dead"} 0
keyway_gossip_members{role="replica",status="left"} 0
# HELP keyway_gossip_replicas Replica members alive in gossip, by the lifecycle state they advertise (starting, ready, draining, recovering, stopped, failed).
# TYPE keyway_gossip_replicas gauge
keyway_gossip_replicas{state="draining"} 0
keyway_gossip_replicas{state="failed"} 0
keyway_gossip_replicas{state="ready"} 0
keyway_gossip_replicas{state="recovering"} 0
keyway_gossip_replicas{state="starting"} 0
keyway_gossip_replicas{state="stopped"} 0
# HELP keyway_health_probe_up Active probe verdict of a ring member after rise/fall hysteresis: 1 up, 0 down (held out of rotation).
# TYPE keyway_health_probe_up gauge
keyway_health_probe_up{replica="orders-0",set="orders"} 1
keyway_health_probe_up{replica="orders-1",set="orders"} 1
# HELP keyway_inflight_requests Requests being handled by the proxy now.
# TYPE keyway_inflight_requests gauge
keyway_inflight_requests 0
# HELP keyway_local_responses_total Requests keyway answered itself without a replica's answer, by reason.
# TYPE keyway_local_responses_total counter
keyway_local_responses_total{reason="bad_key",set="orders"} 0
keyway_local_responses_total{reason="body_too_large",set="none"} 0
keyway_local_responses_total{reason="body_too_large",set="orders"} 0
keyway_local_responses_total{reason="client_body",set="orders"} 0
keyway_local_responses_total{reason="duplicate_key",set="orders"} 0
keyway_local_responses_total{reason="internal",set="orders"} 0
keyway_local_responses_total{reason="malformed",set="none"} 0
keyway_local_responses_total{reason="memory",set="orders"} 0
keyway_local_responses_total{reason="no_key",set="orders"} 0
keyway_local_responses_total{reason="no_replica",set="orders"} 0
keyway_local_responses_total{reason="no_set",set="none"} 0
keyway_local_responses_total{reason="overloaded",set="orders"} 0
keyway_local_responses_total{reason="queue_timeout",set="orders"} 0
keyway_local_responses_total{reason="replica_saturated",set="orders"} 0
keyway_local_responses_total{reason="set_deleted",set="none"} 0
keyway_local_responses_total{reason="set_overloaded",set="orders"} 0
keyway_local_responses_total{reason="set_stopped",set="orders"} 0
keyway_local_responses_total{reason="unreachable",set="orders"} 0
keyway_local_responses_total{reason="upstream_error",set="orders"} 0
keyway_local_responses_total{reason="upstream_timeout",set="orders"} 1
# HELP keyway_memory_guard_shedding 1 while the heap is above server.max_heap_bytes and new requests are shed with 503, else 0.
# TYPE keyway_memory_guard_shedding gauge
keyway_memory_guard_shedding 0
# HELP keyway_replica_in_rotation Whether a replica may receive new requests from this proxy now: 1 in rotation, 0 held out (not ready, dead in gossip, failing probes, ejected, drained or held as failed).
# TYPE keyway_replica_in_rotation gauge
keyway_replica_in_rotation{replica="orders-0",set="orders"} 1
keyway_replica_in_rotation{replica="orders-1",set="orders"} 0
# HELP keyway_replica_set_phase Phase of each replica set: 1 for the current phase (Created, Scheduling, Running, Degraded, Failed, Stopped), 0 for the others.
# TYPE keyway_replica_set_phase gauge
keyway_replica_set_phase{phase="Created",set="orders"} 0
keyway_replica_set_phase{phase="Degraded",set="orders"} 1
keyway_replica_set_phase{phase="Failed",set="orders"} 0
keyway_replica_set_phase{phase="Running",set="orders"} 0
keyway_replica_set_phase{phase="Scheduling",set="orders"} 0
keyway_replica_set_phase{phase="Stopped",set="orders"} 0
# HELP keyway_replica_state Lifecycle state a replica advertises (static replicas are ready): 1 for the current state (starting, ready, draining, recovering, stopped, failed), 0 for the others.
# TYPE keyway_replica_state gauge
keyway_replica_state{replica="orders-0",set="orders",state="draining"} 0
keyway_replica_state{replica="orders-0",set="orders",state="failed"} 0
keyway_replica_state{replica="orders-0",set="orders",state="ready"} 1
keyway_replica_state{replica="orders-0",set="orders",state="recovering"} 0
keyway_replica_state{replica="orders-0",set="orders",state="starting"} 0
keyway_replica_state{replica="orders-0",set="orders",state="stopped"} 0
keyway_replica_state{replica="orders-1",set="orders",state="draining"} 0
keyway_replica_state{replica="orders-1",set="orders",state="failed"} 0
keyway_replica_state{replica="orders-1",set="orders",state="ready"} 1
keyway_replica_state{replica="orders-1",set="orders",state="recovering"} 0
keyway_replica_state{replica="orders-1",set="orders",state="starting"} 0
keyway_replica_state{replica="orders-1",set="orders",state="stopped"} 0
# HELP keyway_requests_total Requests answered, by replica set, replica ("none" when keyway answered itself) and status class (1xx..5xx).
# TYPE keyway_requests_total counter
keyway_requests_total{code="1xx",replica="none",set="none"} 0
keyway_requests_total{code="1xx",replica="none",set="orders"} 0
keyway_requests_total{code="1xx",replica="orders-0",set="orders"} 0
keyway_requests_total{code="1xx",replica="orders-1",set="orders"} 0
keyway_requests_total{code="2xx",replica="none",set="none"} 0
keyway_requests_total{code="2xx",replica="none",set="orders"} 0
keyway_requests_total{code="2xx",replica="orders-0",set="orders"} 7
keyway_requests_total{code="2xx",replica="orders-1",set="orders"} 3
keyway_requests_total{code="3xx",replica="none",set="none"} 0
keyway_requests_total{code="3xx",replica="none",set="orders"} 0
keyway_requests_total{code="3xx",replica="orders-0",set="orders"} 0
keyway_requests_total{code="3xx",replica="orders-1",set="orders"} 0
keyway_requests_total{code="4xx",replica="none",set="none"} 0
keyway_requests_total{code="4xx",replica="none",set="orders"} 0
keyway_requests_total{code="4xx",replica="orders-0",set="orders"} 0
keyway_requests_total{code="4xx",replica="orders-1",set="orders"} 0
keyway_requests_total{code="5xx",replica="none",set="none"} 0
keyway_requests_total{code="5xx",replica="none",set="orders"} 1
keyway_requests_total{code="5xx",replica="orders-0",set="orders"} 0
keyway_requests_total{code="5xx",replica="orders-1",set="orders"} 3
# HELP keyway_retries_total Requests sent again to the next candidate after a failed attempt.
# TYPE keyway_retries_total counter
keyway_retries_total{set="orders"} 0
# HELP keyway_ring_fingerprint_disagreements Proxy/set pairs whose ring fingerprint differs from this proxy's now.
# TYPE keyway_ring_fingerprint_disagreements gauge
keyway_ring_fingerprint_disagreements 0
# HELP keyway_ring_fingerprint_mismatches_total Times another proxy was found routing a shared replica set with a different ring fingerprint.
# TYPE keyway_ring_fingerprint_mismatches_total counter
keyway_ring_fingerprint_mismatches_total 0
# HELP keyway_ring_moved_partitions_total Partitions whose ring owner changed in ring rebuilds.
# TYPE keyway_ring_moved_partitions_total counter
keyway_ring_moved_partitions_total{set="orders"} {{partitions}}
# HELP keyway_ring_replicas Replicas on the ring now.
# TYPE keyway_ring_replicas gauge
keyway_ring_replicas{set="orders"} 2
# HELP keyway_rotation_replicas Replicas in rotation now.
# TYPE keyway_rotation_replicas gauge
keyway_rotation_replicas{set="orders"} 1
# HELP keyway_table_rebuilds_total Routing tables published, by replica set and whether the ring itself changed.
# TYPE keyway_table_rebuilds_total counter
keyway_table_rebuilds_total{ring="false",set="orders"} 1
keyway_table_rebuilds_total{ring="true",set="orders"} 1
# HELP keyway_shed_total Requests shed, by replica set, replica ("none" for the set's own bounds) and reason: overloaded, replica_saturated, queue_timeout (a replica's), set_overloaded, memory (the set's and the process's).
# TYPE keyway_shed_total counter
keyway_shed_total{reason="memory",replica="none",set="orders"} 0
keyway_shed_total{reason="overloaded",replica="orders-0",set="orders"} 0
keyway_shed_total{reason="overloaded",replica="orders-1",set="orders"} 0
keyway_shed_total{reason="queue_timeout",replica="orders-0",set="orders"} 0
keyway_shed_total{reason="queue_timeout",replica="orders-1",set="orders"} 0
keyway_shed_total{reason="replica_saturated",replica="orders-0",set="orders"} 0
keyway_shed_total{reason="replica_saturated",replica="orders-1",set="orders"} 0
keyway_shed_total{reason="set_overloaded",replica="none",set="orders"} 0
# HELP keyway_upstream_errors_total Failed exchanges with a replica, by kind: dial, stale_conn, no_free_conns, timeout, reset, other, reused_closed, tls_handshake, reply_too_large.
# TYPE keyway_upstream_errors_total counter
keyway_upstream_errors_total{kind="dial",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="dial",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="no_free_conns",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="no_free_conns",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="other",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="other",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="reply_too_large",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="reply_too_large",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="reset",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="reset",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="reused_closed",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="reused_closed",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="stale_conn",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="stale_conn",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="timeout",replica="orders-0",set="orders"} 1
keyway_upstream_errors_total{kind="timeout",replica="orders-1",set="orders"} 0
keyway_upstream_errors_total{kind="tls_handshake",replica="orders-0",set="orders"} 0
keyway_upstream_errors_total{kind="tls_handshake",replica="orders-1",set="orders"} 0
`

// keywayLint are keyway's own rules on top of promlint's, for every
// family /metrics shows.
func keywayLint(mf *dto.MetricFamily) []error {
	var errs []error
	name := mf.GetName()
	if !strings.HasPrefix(name, "keyway_") && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
		errs = append(errs, fmt.Errorf("name has none of the prefixes keyway_, go_, process_"))
	}
	if mf.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
		errs = append(errs, fmt.Errorf("counter name does not end in _total"))
	}
	labels := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = true
		}
	}
	for l := range labels {
		if l == "key" || strings.HasSuffix(l, "_key") {
			errs = append(errs, fmt.Errorf("label %q: a request's key is never a label", l))
		}
	}
	return errs
}

// lintExposition runs promlint (with keywayLint) over an exposition and
// returns the families it saw.
func lintExposition(t *testing.T, body string) map[string]bool {
	t.Helper()
	l := promlint.New(strings.NewReader(body))
	seen := map[string]bool{}
	l.AddCustomValidations(keywayLint, func(mf *dto.MetricFamily) []error {
		seen[mf.GetName()] = true
		return nil
	})
	problems, err := l.Lint()
	if err != nil {
		t.Fatalf("promlint could not parse /metrics: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	return seen
}

// TestMetricsScenarioAndLint runs serve with two static replicas, gossip,
// active and passive health checks and the audit trail on, drives a
// scripted scenario through it, and then (a) lints every family /metrics
// shows and (b) compares the exposition of the deterministic families
// with the expected one.
func TestMetricsScenarioAndLint(t *testing.T) {
	slow.Skip(t)
	r0, r1 := stacktest.StartReplica(t, "orders-0"), stacktest.StartReplica(t, "orders-1")
	st := startMetricsStack(t, fmt.Sprintf(`  - name: orders
    replicas: 2
    timeouts: {connect: 200ms, request: 300ms}
    static:
      - {name: orders-0, addr: %q}
      - {name: orders-1, addr: %q}
`, r0.Addr, r1.Addr))
	st.waitMetric(t, `keyway_rotation_replicas{set="orders"} 2`)
	var set admin.SetStatus
	stacktest.GetJSON(t, "http://"+st.admin+"/v1/replica_sets/orders", &set)
	// Keys whose owners the router names, not guesses.
	keyA, keyB := st.keyOwnedBy(t, "orders", "orders-0"), st.keyOwnedBy(t, "orders", "orders-1")
	expect := func(key string, wantCode int, wantBody string, hdr ...string) {
		t.Helper()
		if code, body := st.send(t, "/ingest", key, hdr...); code != wantCode || (wantBody != "" && body != wantBody) {
			t.Fatalf("key %s: %d %q, want %d %q", key, code, body, wantCode, wantBody)
		}
	}

	for range 5 {
		expect(keyA, 200, "orders-0")
	}
	for range 3 {
		expect(keyB, 200, "orders-1")
	}
	expect(keyA, 504, "", "X-Hang", "1") // orders-0 holds it past timeouts.request
	r0.Unblock()
	r1.Failing.Store(true)
	for range 3 {
		expect(keyB, 500, "orders-1") // relayed, never retried
	}
	// The third 500 in a row ejects orders-1 (on the next sweep).
	st.waitMetric(t, `keyway_rotation_replicas{set="orders"} 1`)
	for range 2 {
		expect(keyB, 200, "orders-0") // failover: next
	}

	want := strings.ReplaceAll(scenarioExposition, "{{partitions}}", fmt.Sprint(set.Partitions))
	url := "http://" + st.admin + "/metrics"
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Audit events and the gossip snapshot may land a moment after the
		// table that the wait above saw.
		err := testutil.ScrapeAndCompare(url, strings.NewReader(want), scenarioFamilies...)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scenario's exposition differs:\n%v", err)
		}
		<-time.After(20 * time.Millisecond)
	}

	body := st.scrape(t)
	seen := lintExposition(t, body)
	for _, f := range scenarioFamilies {
		if !seen[f] {
			t.Errorf("/metrics has no %s", f)
		}
	}
	// The gossip health score: present, memberlist's 0 (healthy) up to 7.
	score := -1.0
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "keyway_gossip_health_score "); ok {
			fmt.Sscan(v, &score)
		}
	}
	if score < 0 || score > 7 {
		t.Errorf("keyway_gossip_health_score %v, want 0..7 with gossip running", score)
	}
	// Families registered with no series in this scenario cannot be
	// linted from /metrics; their names at least must follow the rules.
	n := 0
	for name := range describeMetrics(t) {
		if seen[name] {
			continue
		}
		n++
		t.Logf("registered, no series in the scenario: %s", name)
		if !strings.HasPrefix(name, "keyway_") {
			t.Errorf("%s: not a keyway_ name", name)
		}
	}
	t.Logf("linted %d families; %d registered families showed no series", len(seen), n)
}

// TestMetricsForgottenReplica: a gossip replica's series, on every family
// that has a replica label, are deleted when it leaves for good.
func TestMetricsForgottenReplica(t *testing.T) {
	slow.Skip(t)
	rep := stacktest.StartReplica(t, "users-0")
	st := startMetricsStack(t, "  - {name: users, replicas: 1}\n")

	node, leave := stacktest.StartGossipReplica(t, st.gossip, membership.Meta{Set: "users", Replica: "users-0", Addr: rep.Addr, State: balancer.StateReady})

	st.waitMetric(t, `keyway_replica_in_rotation{replica="users-0",set="users"} 1`)
	if code, body := st.send(t, "/ingest", "k"); code != 200 || body != "users-0" {
		t.Fatalf("request: %d %q", code, body)
	}
	families := func() []string {
		var fs []string
		for _, line := range strings.Split(st.scrape(t), "\n") {
			if strings.Contains(line, `replica="users-0"`) && !strings.HasPrefix(line, "#") {
				if f, _, _ := strings.Cut(line, "{"); !slices.Contains(fs, f) {
					fs = append(fs, f)
				}
			}
		}
		return fs
	}
	before := families()
	for _, f := range []string{
		"keyway_requests_total", "keyway_request_duration_seconds_bucket", "keyway_upstream_errors_total",
		"keyway_ejections_total", "keyway_health_probe_up", "keyway_health_probes_total",
		"keyway_replica_in_rotation", "keyway_replica_state",
	} {
		if !slices.Contains(before, f) {
			t.Errorf("no %s series for users-0 while it serves; it has %v", f, before)
		}
	}

	// Scale-in: stopped for good, then a graceful leave.
	if err := node.UpdateMeta(func(m *membership.Meta) { m.State, m.Remove = balancer.StateStopped, true }, time.Second); err != nil {
		t.Fatal(err)
	}
	st.waitMetric(t, `keyway_replica_state{replica="users-0",set="users",state="stopped"} 1`)
	leave()
	st.waitMetric(t, `keyway_replica_set_phase{phase="Stopped",set="users"} 1`)
	st.waitMetric(t, `keyway_gossip_members{role="replica",status="left"} 1`)
	// The proxy, health and phase tracker each drop theirs when the table
	// without users-0 is published; poll until all have.
	deadline := time.Now().Add(10 * time.Second)
	for left := families(); len(left) > 0; left = families() {
		if time.Now().After(deadline) {
			t.Fatalf("series of the forgotten replica remain in %v", left)
		}
		<-time.After(20 * time.Millisecond)
	}
}
