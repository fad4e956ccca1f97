package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

// A set deleted at run time keeps its route: its requests get 410 Gone
// naming it, not a broader set's replicas; a set that matches them at
// least as closely serves them.
func TestDeletedSetsRouteIsGone(t *testing.T) {
	orders := startReplica(t, "orders-0")
	events := startReplica(t, "events-0")
	_, addr := startProxy(t, func(c *Config) {
		sc := DefaultSetConfig()
		sc.Name, sc.Replicas = "events", 1
		sc.Match = MatchConfig{PathPrefix: "/users/events/"}
		sc.Static = []StaticReplica{{Name: "events-0", Addr: events.addr(), Weight: 1}}
		c.ReplicaSets = append(c.ReplicaSets, sc)
		c.Gone = []GoneRoute{{Set: "users", Match: MatchConfig{PathPrefix: "/users/"}}}
	}, orders)
	c := newClient(addr)
	r := c.do(t, "POST", "/users/42", "x", "X-Key", "k")
	if r.status != 410 {
		t.Fatalf("a deleted set's request: %d %s, want 410", r.status, r.body)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || !strings.Contains(body["error"].(string), `replica set "users" was deleted at run time`) ||
		!strings.Contains(body["error"].(string), "keyway runtime clear --set users") {
		t.Fatalf("410 body %s (%v)", r.body, err)
	}
	if n := orders.count.Load(); n != 0 {
		t.Fatalf("%d requests of the deleted set reached the catch-all set", n)
	}
	if r := c.do(t, "POST", "/orders/1", "x", "X-Key", "k"); r.status != 200 || r.body != "orders-0" {
		t.Fatalf("another path: %d %s", r.status, r.body)
	}
	// A live set more specific than the deleted route still serves.
	if r := c.do(t, "POST", "/users/events/1", "x", "X-Key", "k"); r.status != 200 || r.body != "events-0" {
		t.Fatalf("a more specific live set: %d %s", r.status, r.body)
	}
}
