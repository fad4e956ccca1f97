package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"keyway/admin"
	"keyway/config"
	"keyway/demo"
)

// getJSON decodes a 200 JSON answer of the admin API into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestAdminAPIMatchesRouting runs serve with three static demo replicas and
// checks the read API against what the proxy really does: the replica
// /v1/route names as owner and pick is the one that answers a request
// carrying that X-Key.
func TestAdminAPIMatchesRouting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var static strings.Builder
	stopReplica := map[string]func(){}
	for i := range 3 {
		r, err := demo.Listen(fmt.Sprintf("orders-%d", i), "127.0.0.1:0", "")
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		stop := sync.OnceFunc(func() { rcancel(); <-done })
		stopReplica[r.Name()] = stop
		t.Cleanup(stop)
		fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", r.Name(), r.Addr())
	}
	yml := "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nlog: {level: warn}\nreplica_sets:\n  - name: orders\n    replicas: 3\n    static:\n" + static.String()
	cfg, err := config.LoadBytes("test.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [2]string, 1)
	served := make(chan error, 1)
	errb := &syncBuffer{}
	go func() {
		served <- serve(ctx, cfg, &syncBuffer{}, errb, func(p, a string) { addrs <- [2]string{p, a} }, nil)
	}()
	var proxyAddr, adminAddr string
	select {
	case a := <-addrs:
		proxyAddr, adminAddr = a[0], a[1]
	case err := <-served:
		t.Fatalf("serve ended before listening: %v; stderr: %s", err, errb.String())
	}
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	waitRotation(t, adminAddr, 3)
	base := "http://" + adminAddr

	var list struct {
		ReplicaSets []admin.SetStatus `json:"replica_sets"`
	}
	getJSON(t, base+"/v1/replica_sets", &list)
	if len(list.ReplicaSets) != 1 {
		t.Fatalf("sets: %+v", list)
	}
	s := list.ReplicaSets[0]
	if s.Name != "orders" || s.Phase != "Running" || s.Declared != 3 || s.Ready != 3 || s.InRotation != 3 || s.RingSize != 3 ||
		!strings.HasPrefix(s.Fingerprint, "v1-") || s.Replicas != nil {
		t.Fatalf("set: %+v", s)
	}

	var one admin.SetStatus
	getJSON(t, base+"/v1/replica_sets/orders", &one)
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
		getJSON(t, base+"/v1/route?set=orders&key="+url.QueryEscape(key), &ex)
		return ex
	}
	send := func(key string) string {
		req, _ := http.NewRequest("POST", "http://"+proxyAddr+"/ingest", strings.NewReader("x"))
		req.Header.Set("X-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var a demo.Answer
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil || a.Key != key {
			t.Fatalf("key %q: status %d, answer %+v, %v", key, resp.StatusCode, a, err)
		}
		return a.Replica
	}
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
	getJSON(t, base+"/v1/replica_sets/orders", &one)
	if r := one.Replicas[0]; r.Name != "orders-0" || r.InRotation || !strings.Contains(r.Reason, "refused") || one.InRotation != 2 {
		t.Errorf("after stopping orders-0: %+v", one)
	}

	var members struct{ Members []admin.MemberInfo }
	getJSON(t, base+"/v1/members", &members)
	if members.Members == nil || len(members.Members) != 0 {
		t.Errorf("members with gossip off: %+v, want []", members)
	}
	var conf map[string]any
	getJSON(t, base+"/v1/config", &conf)
	if sets, _ := conf["replica_sets"].([]any); len(sets) != 1 || conf["listen"] != "127.0.0.1:0" {
		t.Errorf("config under its YAML names: %v", conf)
	}
	var evs struct{ Events []map[string]any }
	getJSON(t, base+"/v1/events?kind=ring_rebuild&limit=1", &evs)
	if len(evs.Events) != 1 || evs.Events[0]["kind"] != "ring_rebuild" || evs.Events[0]["set"] != "orders" {
		t.Errorf("events: %+v", evs)
	}
}
