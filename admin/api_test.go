package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeView serves fixed sets and records the event query it was asked.
type fakeView struct {
	sets []SetStatus

	mu     sync.Mutex
	since  time.Time
	kinds  []string
	limit  int
	query  EventQuery
	events []any
}

func (f *fakeView) Sets() []SetStatus {
	out := slices.Clone(f.sets)
	for i := range out {
		out[i].Replicas = slices.Clone(out[i].Replicas)
	}
	return out
}

func (f *fakeView) Set(name string) (SetStatus, bool) {
	for _, s := range f.Sets() {
		if s.Name == name {
			return s, true
		}
	}
	return SetStatus{}, false
}

func (f *fakeView) Route(set, key string) (RouteExplain, error) {
	if _, ok := f.Set(set); !ok {
		return RouteExplain{}, fmt.Errorf("%w %q", ErrUnknownSet, set)
	}
	return RouteExplain{Set: set, Key: key, Owner: "orders-0", Pick: "orders-1", Candidates: []RouteCandidate{
		{Name: "orders-0", State: "draining", Skipped: "state draining"},
		{Name: "orders-1", State: "ready", InRotation: true, Picked: true},
	}}, nil
}

func (f *fakeView) Members() []MemberInfo { return nil }

func (f *fakeView) Events(q EventQuery) ([]any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.since, f.kinds, f.limit, f.query = q.Since, q.Kinds, q.Limit, q
	if q.Partition >= 0 && len(q.Sets) != 1 {
		return nil, errors.New("set: a partition is one set's")
	}
	return f.events, nil
}

func (f *fakeView) Config() any { return map[string]any{"listen": ":8080"} }

func startAPI(t *testing.T, opts Options) string {
	t.Helper()
	opts.Gatherer = prometheus.NewPedanticRegistry()
	s, err := New(Config{Listen: "127.0.0.1:0"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return "http://" + s.Addr().String()
}

// call does a request and decodes the JSON answer into a generic value,
// failing unless the content type is JSON.
func call(t *testing.T, method, url string) (int, map[string]any) {
	t.Helper()
	return do(t, method, url, "")
}

func testView() *fakeView {
	return &fakeView{sets: []SetStatus{
		{Name: "orders", Phase: "Degraded", Declared: 2, Ready: 1, InRotation: 1, RingSize: 2, Fingerprint: "fp", Replicas: []ReplicaStatus{
			{Name: "orders-0", State: "draining", Reason: "state draining", Partitions: 100, Share: 0.5},
			{Name: "orders-1", State: "ready", InRotation: true, Partitions: 100, Share: 0.5},
		}},
		{Name: "billing", Phase: "Created", Declared: 1},
	}}
}

func TestAPIReplicaSets(t *testing.T) {
	v := testView()
	base := startAPI(t, Options{Sets: v, Members: v, Events: v, Config: v})

	code, body := call(t, "GET", base+"/v1/replica_sets")
	sets, _ := body["replica_sets"].([]any)
	if code != 200 || len(sets) != 2 {
		t.Fatalf("list: %d %v", code, body)
	}
	first := sets[0].(map[string]any)
	if first["name"] != "orders" || first["phase"] != "Degraded" || first["declared"] != 2.0 || first["ready"] != 1.0 ||
		first["in_rotation"] != 1.0 || first["ring_size"] != 2.0 || first["fingerprint"] != "fp" {
		t.Fatalf("list entry: %v", first)
	}
	if _, ok := first["replicas"]; ok {
		t.Fatalf("the list must leave replicas out: %v", first)
	}

	code, body = call(t, "GET", base+"/v1/replica_sets/orders")
	reps, _ := body["replicas"].([]any)
	if code != 200 || body["name"] != "orders" || len(reps) != 2 {
		t.Fatalf("one set: %d %v", code, body)
	}
	r0 := reps[0].(map[string]any)
	if r0["name"] != "orders-0" || r0["reason"] != "state draining" || r0["share"] != 0.5 || r0["in_rotation"] != false {
		t.Fatalf("replica: %v", r0)
	}
	// A set without replicas lists [] (not null, not left out), in both views.
	code, body = call(t, "GET", base+"/v1/replica_sets/billing")
	if l, ok := body["replicas"].([]any); code != 200 || !ok || len(l) != 0 || body["name"] != "billing" {
		t.Fatalf("an empty set: %d %v", code, body)
	}
	code, body = call(t, "GET", base+"/v1/replica_sets/billing/replicas")
	if l, ok := body["replicas"].([]any); code != 200 || !ok || len(l) != 0 || body["set"] != "billing" {
		t.Fatalf("replicas of an empty set: %d %v", code, body)
	}
	code, body = call(t, "GET", base+"/v1/replica_sets/orders/replicas")
	if l, _ := body["replicas"].([]any); code != 200 || len(l) != 2 {
		t.Fatalf("replicas: %d %v", code, body)
	}

	for _, u := range []string{"/v1/replica_sets/nope", "/v1/replica_sets/nope/replicas", "/v1/route?set=nope&key=k"} {
		code, body = call(t, "GET", base+u)
		msg, _ := body["error"].(string)
		if code != 404 || !strings.Contains(msg, `"nope"`) || !strings.Contains(msg, "orders, billing") {
			t.Errorf("%s: %d %v, want 404 naming the set and listing the known ones", u, code, body)
		}
	}
}

func TestAPIRoute(t *testing.T) {
	v := testView()
	base := startAPI(t, Options{Sets: v})
	code, body := call(t, "GET", base+"/v1/route?set=orders&key=a%2Fb")
	cands, _ := body["candidates"].([]any)
	if code != 200 || body["key"] != "a/b" || body["owner"] != "orders-0" || body["pick"] != "orders-1" || len(cands) != 2 {
		t.Fatalf("route: %d %v", code, body)
	}
	for _, c := range []struct{ q, param string }{
		{"", "set"}, {"?key=k", "set"}, {"?set=orders", "key"}, {"?set=orders&key=", "key"},
	} {
		code, body := call(t, "GET", base+"/v1/route"+c.q)
		msg, _ := body["error"].(string)
		if code != 400 || !strings.Contains(msg, "query parameter "+c.param) {
			t.Errorf("route%s: %d %v, want 400 naming %s", c.q, code, body, c.param)
		}
	}
}

func TestAPIEvents(t *testing.T) {
	v := testView()
	v.events = []any{map[string]any{"kind": "ring_rebuild"}}
	base := startAPI(t, Options{Events: v})

	code, body := call(t, "GET", base+"/v1/events")
	if l, _ := body["events"].([]any); code != 200 || len(l) != 1 {
		t.Fatalf("events: %d %v", code, body)
	}
	v.mu.Lock()
	if !v.since.IsZero() || v.kinds != nil || v.limit != defaultEventLimit {
		t.Fatalf("defaults: since %v kinds %v limit %d", v.since, v.kinds, v.limit)
	}
	v.mu.Unlock()

	code, _ = call(t, "GET", base+"/v1/events?since=2026-01-02T03:04:05Z&kind=ring_rebuild,%20phase_change&limit=7")
	v.mu.Lock()
	want := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if code != 200 || !v.since.Equal(want) || !slices.Equal(v.kinds, []string{"ring_rebuild", "phase_change"}) || v.limit != 7 {
		t.Fatalf("query: %d since %v kinds %q limit %d", code, v.since, v.kinds, v.limit)
	}
	if v.query.Partition != -1 || v.query.Sets != nil || v.query.Replica != "" || v.query.Key != "" || !v.query.Until.IsZero() {
		t.Fatalf("unset filters: %+v", v.query)
	}
	v.mu.Unlock()

	code, _ = call(t, "GET", base+"/v1/events?set=orders,-&replica=orders-1&until=2026-01-02T04:00:00Z")
	v.mu.Lock()
	if code != 200 || !slices.Equal(v.query.Sets, []string{"orders", ""}) || v.query.Replica != "orders-1" || !v.query.Until.Equal(want.Add(55*time.Minute+55*time.Second)) {
		t.Fatalf("set, replica, until: %d %+v", code, v.query)
	}
	v.mu.Unlock()
	code, _ = call(t, "GET", base+"/v1/events?set=orders&partition=17")
	v.mu.Lock()
	if code != 200 || v.query.Partition != 17 {
		t.Fatalf("partition: %d %+v", code, v.query)
	}
	v.mu.Unlock()
	code, body = call(t, "GET", base+"/v1/events?partition=17")
	if msg, _ := body["error"].(string); code != 400 || !strings.Contains(msg, "set: a partition is one set's") {
		t.Fatalf("partition without set: %d %v", code, body)
	}

	v.mu.Lock()
	v.events = nil
	v.mu.Unlock()
	code, body = call(t, "GET", base+"/v1/events?kind=nothing")
	if l, ok := body["events"].([]any); code != 200 || !ok || len(l) != 0 {
		t.Fatalf("no events must be []: %d %v", code, body)
	}

	for _, c := range []struct{ q, param string }{
		{"since=yesterday", "since"}, {"until=soon", "until"}, {"partition=-1", "partition"}, {"partition=x", "partition"}, {"limit=0", "limit"}, {"limit=x", "limit"}, {"limit=-3", "limit"},
	} {
		code, body := call(t, "GET", base+"/v1/events?"+c.q)
		msg, _ := body["error"].(string)
		if code != 400 || !strings.Contains(msg, "query parameter "+c.param) {
			t.Errorf("events?%s: %d %v, want 400 naming %s", c.q, code, body, c.param)
		}
	}
}

func TestAPIMembersConfigAndErrors(t *testing.T) {
	v := testView()
	base := startAPI(t, Options{Sets: v, Members: v, Events: v, Config: v})

	code, body := call(t, "GET", base+"/v1/members")
	if l, ok := body["members"].([]any); code != 200 || !ok || len(l) != 0 {
		t.Fatalf("members with gossip off must be []: %d %v", code, body)
	}
	if code, body := call(t, "GET", base+"/v1/config"); code != 200 || body["listen"] != ":8080" {
		t.Fatalf("config: %d %v", code, body)
	}
	for _, u := range []string{"/v1/replica_sets", "/v1/replica_sets/orders", "/v1/route?set=orders&key=k", "/v1/config"} {
		for _, m := range []string{"POST", "DELETE", "PATCH"} {
			if (m == "PATCH" || m == "DELETE") && u == "/v1/replica_sets/orders" || m == "POST" && u == "/v1/replica_sets" {
				continue // run-time changes (operate_test.go)
			}
			code, body := call(t, m, base+u)
			if msg, _ := body["error"].(string); code != 405 || !strings.Contains(msg, m) {
				t.Errorf("%s %s: %d %v, want a JSON 405", m, u, code, body)
			}
		}
	}
	if code, body := call(t, "GET", base+"/v1/nothing"); code != 404 || body["error"] == nil {
		t.Errorf("unknown path: %d %v", code, body)
	}

	// A process without sources says so instead of answering empty.
	bare := startAPI(t, Options{})
	for _, u := range []string{"/v1/replica_sets", "/v1/replica_sets/orders", "/v1/route?set=a&key=b", "/v1/members", "/v1/events", "/v1/config"} {
		if code, body := call(t, "GET", bare+u); code != 501 || body["error"] == nil {
			t.Errorf("%s without a source: %d %v, want 501", u, code, body)
		}
	}
}
