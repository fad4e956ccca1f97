package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"keyway/admin"
	"keyway/config"
	"keyway/demo"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/internal/testnet"
)

// TestAdminAPIMatchesRouting runs serve with three static demo replicas and
// checks the read API against what the proxy really does: the replica
// /v1/route names as owner and pick is the one that answers a request
// carrying that X-Key.
func TestAdminAPIMatchesRouting(t *testing.T) {
	var static strings.Builder
	stopReplica := map[string]func(){}
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		addr, stop := stacktest.StartDemoReplica(t, name)
		stopReplica[name] = stop
		fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", name, addr)
	}
	yml := "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nlog: {level: warn}\nreplica_sets:\n  - name: orders\n    replicas: 3\n    static:\n" + static.String()
	cfg, err := config.LoadBytes("test.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	stk := stacktest.StartProxy(t, cfg, stacktest.Opts{})
	proxyAddr, adminAddr := stk.Proxy, stk.Admin
	stacktest.WaitRotation(t, adminAddr, "orders", 3)
	base := "http://" + adminAddr

	var list struct {
		ReplicaSets []admin.SetStatus `json:"replica_sets"`
	}
	stacktest.GetJSON(t, base+"/v1/replica_sets", &list)
	if len(list.ReplicaSets) != 1 {
		t.Fatalf("sets: %+v", list)
	}
	s := list.ReplicaSets[0]
	if s.Name != "orders" || s.Phase != "Running" || s.Declared != 3 || s.Ready != 3 || s.InRotation != 3 || s.RingSize != 3 ||
		!strings.HasPrefix(s.Fingerprint, "v1-") || s.Replicas != nil {
		t.Fatalf("set: %+v", s)
	}

	var one admin.SetStatus
	stacktest.GetJSON(t, base+"/v1/replica_sets/orders", &one)
	total := 0
	for _, r := range one.Replicas {
		total += r.Partitions
		if !r.InRotation || r.State != "ready" || r.Slot < 0 || r.Share != float64(r.Partitions)/float64(one.Partitions) {
			t.Errorf("replica: %+v", r)
		}
	}
	if len(one.Replicas) != 3 || total != one.Partitions {
		t.Fatalf("replicas own %d of %d partitions: %+v", total, one.Partitions, one.Replicas)
	}

	route := func(key string) admin.RouteExplain {
		var ex admin.RouteExplain
		stacktest.GetJSON(t, base+"/v1/route?set=orders&key="+url.QueryEscape(key), &ex)
		return ex
	}
	send := func(key string) string { return stacktest.SendKey(t, proxyAddr, key) }
	owners := map[string]bool{}
	ownedBy := map[string]string{}
	for i := range 40 {
		key := fmt.Sprintf("order/%d ü", i) // escaped in the query, sent raw as a header
		ex := route(key)
		if ex.Key != key || ex.Owner == "" || ex.Pick != ex.Owner || len(ex.Candidates) == 0 ||
			ex.Candidates[0].Name != ex.Owner || !ex.Candidates[0].Picked {
			t.Fatalf("route %q: %+v", key, ex)
		}
		if got := send(key); got != ex.Pick {
			t.Errorf("key %q: /v1/route says %s, the proxy sent it to %s", key, ex.Pick, got)
		}
		owners[ex.Owner] = true
		ownedBy[ex.Owner] = key
	}
	if len(owners) != 3 {
		t.Errorf("40 keys reached %d replicas, want 3 (the comparison would be weak): %v", len(owners), owners)
	}

	// Stop orders-0: the proxy's next request for one of its keys is
	// refused, ejects it and fails over. The route endpoint then says
	// why the owner is skipped and picks the replica that answers.
	key := ownedBy["orders-0"]
	stopReplica["orders-0"]()
	got := send(key)
	ex := route(key)
	if ex.Owner != "orders-0" || ex.Pick == "orders-0" || ex.Pick != got || len(ex.Candidates) < 2 ||
		ex.Candidates[0].InRotation || !strings.Contains(ex.Candidates[0].Skipped, "refused") {
		t.Fatalf("after stopping orders-0, key %q went to %s; route: %+v", key, got, ex)
	}
	if got2 := send(key); got2 != ex.Pick {
		t.Errorf("key %q: /v1/route says %s, the proxy sent it to %s", key, ex.Pick, got2)
	}
	stacktest.GetJSON(t, base+"/v1/replica_sets/orders", &one)
	if r := one.Replicas[0]; r.Name != "orders-0" || r.InRotation || !strings.Contains(r.Reason, "refused") || one.InRotation != 2 {
		t.Errorf("after stopping orders-0: %+v", one)
	}

	var members struct{ Members []admin.MemberInfo }
	stacktest.GetJSON(t, base+"/v1/members", &members)
	if members.Members == nil || len(members.Members) != 0 {
		t.Errorf("members with gossip off: %+v, want []", members)
	}
	var conf map[string]any
	stacktest.GetJSON(t, base+"/v1/config", &conf)
	if sets, _ := conf["replica_sets"].([]any); len(sets) != 1 || conf["listen"] != "127.0.0.1:0" {
		t.Errorf("config under its YAML names: %v", conf)
	}
	var evs struct{ Events []map[string]any }
	stacktest.GetJSON(t, base+"/v1/events?kind=ring_rebuild&limit=1", &evs)
	if len(evs.Events) != 1 || evs.Events[0]["kind"] != "ring_rebuild" || evs.Events[0]["set"] != "orders" {
		t.Errorf("events: %+v", evs)
	}
}

// TestAdminTrafficCounts sends requests through a real proxy to four static
// replicas — two demo replicas, one answering every request 500 and one
// address that refuses connections — and checks the set view's traffic
// against what the clients saw.
func TestAdminTrafficCounts(t *testing.T) {
	slow.Skip(t)
	var static strings.Builder
	for i := range 2 {
		name := fmt.Sprintf("orders-%d", i)
		addr, _ := stacktest.StartDemoReplica(t, name)
		fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", name, addr)
	}
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintln(w, `{"replica": "orders-2"}`)
	}))
	t.Cleanup(failing.Close)
	fmt.Fprintf(&static, "      - {name: orders-2, addr: %q}\n", failing.Listener.Addr().String())
	refusing := testnet.RefusedAddr(t)
	fmt.Fprintf(&static, "      - {name: orders-3, addr: %q}\n", refusing)

	yml := `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: error}
health:
  active: {enabled: false}
  passive: {enabled: true, consecutive_failures: 1, count: [connect, 5xx], base_ejection: 1m, max_ejection: 1m}
replica_sets:
  - name: orders
    replicas: 4
    retries: {attempts: 3}
    static:
` + static.String()
	cfg, err := config.LoadBytes("test.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	stk := stacktest.StartProxy(t, cfg, stacktest.Opts{})
	proxyAddr, adminAddr := stk.Proxy, stk.Admin
	stacktest.WaitRotation(t, adminAddr, "orders", 4)
	setURL := "http://" + adminAddr + "/v1/replica_sets/orders"
	byName := func(st admin.SetStatus) map[string]*admin.ReplicaTraffic {
		out := map[string]*admin.ReplicaTraffic{}
		for _, r := range st.Replicas {
			if r.Traffic == nil {
				t.Fatalf("%s has no traffic: %+v", r.Name, r)
			}
			out[r.Name] = r.Traffic
		}
		return out
	}

	// The first read: nothing sent, no rate known yet (null, with a note),
	// not a measured 0.
	var st admin.SetStatus
	stacktest.GetJSON(t, setURL, &st)
	if st.Traffic == nil || st.Traffic.RequestsPerSecond != nil || st.Traffic.WindowSeconds != nil || st.Traffic.RateNote == "" || st.Traffic.RequestsTotal != 0 {
		t.Fatalf("first read: traffic %+v", st.Traffic)
	}
	for name, tr := range byName(st) {
		if tr.RequestsTotal != 0 || tr.ErrorsTotal != 0 || tr.RequestsPerSecond != nil {
			t.Errorf("%s before any request: %+v", name, tr)
		}
	}

	const n = 80
	answered := map[string]uint64{}
	for i := range n {
		req, _ := http.NewRequest("POST", "http://"+proxyAddr+"/ingest", strings.NewReader("x"))
		req.Header.Set("X-Key", fmt.Sprintf("order-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var a demo.Answer
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil || a.Replica == "" || (resp.StatusCode == 500) != (a.Replica == "orders-2") {
			t.Fatalf("request %d: status %d, answer %+v, %v", i, resp.StatusCode, a, err)
		}
		answered[a.Replica]++
	}
	t.Logf("answers by replica: %v", answered)
	if answered["orders-2"] == 0 {
		t.Fatalf("no key reached orders-2 (the 500 replica): %v", answered)
	}

	st = admin.SetStatus{}
	stacktest.GetJSON(t, setURL, &st)
	trs := byName(st)
	for _, name := range []string{"orders-0", "orders-1", "orders-2", "orders-3"} {
		if got := trs[name].RequestsTotal; got != answered[name] {
			t.Errorf("%s: requests_total %d, the clients saw %d answers from it", name, got, answered[name])
		}
	}
	if st.Traffic.RequestsTotal != n || st.Traffic.LocalAnswersTotal != 0 {
		t.Errorf("set: requests_total %d (want %d), local_answers_total %d (want 0)", st.Traffic.RequestsTotal, n, st.Traffic.LocalAnswersTotal)
	}
	if tr := trs["orders-2"]; tr.Responses5xxTotal != answered["orders-2"] || tr.ErrorsTotal != tr.Responses5xxTotal || tr.TransportErrorsTotal != 0 {
		t.Errorf("orders-2 (answers 500): %+v", tr)
	}
	if tr := trs["orders-3"]; tr.TransportErrors["dial"] == 0 || tr.TransportErrorsTotal != tr.TransportErrors["dial"] || tr.ErrorsTotal != tr.TransportErrorsTotal || tr.Responses5xxTotal != 0 {
		t.Errorf("orders-3 (refuses): %+v", tr)
	}
	for _, name := range []string{"orders-0", "orders-1"} {
		if tr := trs[name]; tr.ErrorsTotal != 0 || tr.Ejections != 0 {
			t.Errorf("%s (healthy): %+v", name, tr)
		}
	}

	// The passive checker ejected orders-2 on its first 500, before it was
	// relayed; rates need a reading 1 s after the first: poll with a
	// deadline.
	deadline := time.Now().Add(15 * time.Second)
	for {
		st = admin.SetStatus{}
		stacktest.GetJSON(t, setURL, &st)
		trs = byName(st)
		if trs["orders-2"].Ejections >= 1 && trs["orders-2"].EjectionsTotal >= 1 && st.Traffic.RequestsPerSecond != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ejection of orders-2 or no rate within 15 s: set %+v, orders-2 %+v", st.Traffic, trs["orders-2"])
		}
		<-time.After(50 * time.Millisecond)
	}
	// The rates compare with the first reading, taken before the requests:
	// rate × window is the number sent.
	if st.Traffic.RateNote != "" {
		t.Errorf("a rate with a note: %+v", st.Traffic)
	}
	w := fl(st.Traffic.WindowSeconds)
	if sent := fl(st.Traffic.RequestsPerSecond) * w; w < 1 || sent < n*0.99 || sent > n*1.01 {
		t.Errorf("set rate %v/s over %v s = %v requests, want %d", fl(st.Traffic.RequestsPerSecond), w, sent, n)
	}
	if fl(trs["orders-3"].ErrorsPerSecond) <= 0 || fl(trs["orders-2"].ErrorsPerSecond) <= 0 || fl(trs["orders-0"].ErrorsPerSecond) != 0 {
		t.Errorf("error rates: orders-0 %v, orders-2 %v, orders-3 %v", fl(trs["orders-0"].ErrorsPerSecond), fl(trs["orders-2"].ErrorsPerSecond), fl(trs["orders-3"].ErrorsPerSecond))
	}
	// Latency over the same window: for the replicas that answered, none
	// for the one that refused every connection.
	for _, name := range []string{"orders-0", "orders-1", "orders-2"} {
		if answered[name] > 0 && (fl(trs[name].MeanLatencySeconds) <= 0 || fl(trs[name].P99LatencySeconds) <= 0) {
			t.Errorf("%s answered %d: mean latency %v, p99 %v, want both measured", name, answered[name], fl(trs[name].MeanLatencySeconds), fl(trs[name].P99LatencySeconds))
		}
	}
	if tr := trs["orders-3"]; tr.MeanLatencySeconds != nil || tr.P99LatencySeconds != nil {
		t.Errorf("orders-3 answered nothing: mean latency %v, p99 %v, want null", fl(tr.MeanLatencySeconds), fl(tr.P99LatencySeconds))
	}
	// How long each replica has been in its state and in or out of
	// rotation: orders-2 left rotation at its ejection, after every
	// replica became ready.
	reps := map[string]admin.ReplicaStatus{}
	for _, r := range st.Replicas {
		reps[r.Name] = r
		if r.StateSince == nil || r.StateSeconds == nil || r.RotationSince == nil || r.RotationSeconds == nil || *r.StateSeconds < 0 {
			t.Errorf("%s: state_since %v (%v s), rotation_since %v (%v s), want all set", r.Name, r.StateSince, fl(r.StateSeconds), r.RotationSince, fl(r.RotationSeconds))
		}
	}
	if r2, r0 := reps["orders-2"], reps["orders-0"]; r2.InRotation || r2.RotationSince == nil || r0.RotationSince == nil || !r2.RotationSince.After(*r0.RotationSince) ||
		fl(r2.RotationSeconds) > fl(r0.RotationSeconds) {
		t.Errorf("orders-2 (ejected) rotation since %v (%v s), orders-0 (in) since %v (%v s): want orders-2 out since later", r2.RotationSince, fl(r2.RotationSeconds), r0.RotationSince, fl(r0.RotationSeconds))
	}
	raw, _ := json.MarshalIndent(st.Traffic, "", "  ")
	t.Logf("set traffic: %s", raw)
	for _, name := range []string{"orders-0", "orders-2", "orders-3"} {
		raw, _ := json.Marshal(trs[name])
		t.Logf("%s traffic: %s", name, raw)
	}
	raw, _ = json.Marshal(reps["orders-2"])
	t.Logf("orders-2: %s", raw)
}

// fl reads a rate: -1 for null.
func fl(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}
