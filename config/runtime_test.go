package config

import (
	"strings"
	"testing"

	"keyway/proxy"
	"keyway/runstate"
)

func TestDecodeSet(t *testing.T) {
	sc, err := DecodeSet("body", []byte(`{"name": "users", "match": {"path_prefix": "/users"}, "replicas": 3, "key": [{"header": "X-User"}], "timeouts": {"request": "5s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	def := proxy.DefaultSetConfig()
	if sc.Name != "users" || sc.Replicas != 3 || sc.Match.PathPrefix != "/users" || sc.Key[0].Header != "X-User" ||
		sc.Timeouts.Request.String() != "5s" || sc.Timeouts.Connect != def.Timeouts.Connect || sc.MaxBodyBytes != def.MaxBodyBytes {
		t.Fatalf("decoded %+v", sc)
	}
	for name, tc := range map[string]struct{ body, want string }{
		"not JSON":      {`name: users`, "want one JSON object"},
		"array":         {`[{"name": "users"}]`, "want one JSON object"},
		"unknown key":   {`{"name": "users", "replica": 3}`, `unknown key "replica"`},
		"bad value":     {`{"name": "users", "timeouts": {"request": "soon"}}`, `timeouts.request: "soon" is not a duration`},
		"invalid name":  {`{"name": "Users!"}`, `name: "Users!" is not a valid set name`},
		"out of range":  {`{"name": "users", "replicas": 0}`, "replicas: must be between 1 and"},
		"missing name":  {`{"replicas": 2}`, `name: "" is not a valid set name`},
		"truncated":     {`{"name": "users"`, "want one JSON object"},
		"empty":         {``, "want one JSON object"},
		"wrong type":    {`{"name": "users", "replicas": "three"}`, "replicas"},
		"stopped wrong": {`{"name": "users", "stopped": "yes please"}`, "stopped"},
		// encoding/json would stop after the first object, and keep the
		// last of two values of a key: both are refused, as in PATCH.
		"trailing data":  {`{"name": "users"}{"name": "evil"} junk`, `unexpected data after the JSON object, at byte 17: "{\"name\": \"evil\"} junk"`},
		"duplicate key":  {`{"name": "users", "replicas": 2, "replicas": 9}`, `key "replicas" is given twice: write each key once`},
		"duplicate deep": {`{"name": "users", "match": {"path_prefix": "/a", "path_prefix": "/b"}}`, `key "match.path_prefix" is given twice`},
	} {
		_, err := DecodeSet("body", []byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "body") {
			t.Errorf("%s: %v; want a problem of body containing %q", name, err, tc.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestApplyRuntime(t *testing.T) {
	file, err := LoadBytes("f.yaml", []byte(`replica_sets:
  - name: orders
    match: {path_prefix: /orders}
    replicas: 3
    static: [{name: orders-0, addr: "127.0.0.1:9001"}]
  - name: events
    match: {path_prefix: /events}
    static: [{name: events-0, addr: "127.0.0.1:9002"}]
  - name: legacy
    match: {path_prefix: /legacy}
    static: [{name: legacy-0, addr: "127.0.0.1:9003"}]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	recs := []runstate.Record{
		{Set: "orders", Version: 4, Stopped: ptr(true), Replicas: ptr(5)},
		{Set: "legacy", Version: 5, Deleted: true},
		{Set: "users", Version: 6, Spec: []byte(`{"name": "users", "match": {"path_prefix": "/users"}, "replicas": 2}`)},
		{Set: "zebra", Version: 7, Spec: []byte(`{"name": "zebra", "match": {"path_prefix": "/users"}}`)}, // the same match as users: the first by name wins
		{Set: "alpha", Version: 8, Spec: []byte(`{"name": "alpha", "match": {"path_prefix": "/alpha"}}`), Stopped: ptr(true)},
		{Set: "ghost", Version: 9, Deleted: true},
		{Set: "events", Version: 10}, // cleared: the file decides
	}
	eff, probs := ApplyRuntime(file, recs)
	var names []string
	for _, sc := range eff.ReplicaSets {
		names = append(names, sc.Name)
	}
	if got := strings.Join(names, ","); got != "orders,events,alpha,users" {
		t.Fatalf("sets %s", got)
	}
	o := eff.ReplicaSets[0]
	if !o.Stopped || o.Replicas != 5 || len(o.Static) != 1 {
		t.Fatalf("orders %+v", o)
	}
	if e := eff.ReplicaSets[1]; e.Stopped || e.Replicas != 1 {
		t.Fatalf("events %+v", e)
	}
	if a := eff.ReplicaSets[2]; !a.Stopped || a.Match.PathPrefix != "/alpha" {
		t.Fatalf("alpha %+v", a)
	}
	if len(probs) != 1 || probs[0].Set != "zebra" || !strings.Contains(probs[0].Problem, "path_prefix") {
		t.Fatalf("problems %+v", probs)
	}
	if err := eff.Validate(); err != nil {
		t.Fatalf("the effective configuration does not validate: %v", err)
	}
	// The file is untouched.
	if len(file.ReplicaSets) != 3 || file.ReplicaSets[0].Stopped || file.ReplicaSets[0].Replicas != 3 {
		t.Fatalf("file changed: %+v", file.ReplicaSets)
	}
	// A set created at run time replaces the file's entry of that name.
	eff, probs = ApplyRuntime(file, []runstate.Record{{Set: "events", Version: 1,
		Spec: []byte(`{"name": "events", "match": {"path_prefix": "/ev"}, "replicas": 4}`)}})
	if len(probs) != 0 || len(eff.ReplicaSets) != 3 || eff.ReplicaSets[2].Name != "events" || eff.ReplicaSets[2].Replicas != 4 {
		t.Fatalf("replaced: %+v %+v", eff.ReplicaSets, probs)
	}
}
