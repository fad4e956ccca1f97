package demo_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"keyway/config"
	"keyway/demo"
	"keyway/internal/stacktest"
)

// Behind a real proxy whose set is keyed on X-User, then the second path
// segment, a demo replica reports the key keyway routed by (the route
// context's), not its guess from X-Key or the path; a request that comes
// without route context still gets the guess.
func TestReplicaReportsTheRoutedKey(t *testing.T) {
	r, err := demo.Listen("users-0", "127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	cfg, err := config.LoadBytes("users.yaml", []byte(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
replica_sets:
  - name: users
    key: [{header: X-User}, {path_segment: 2}]
    route_context: {header: `+demo.RouteHeader+`}
    replicas: 1
    static: [{name: users-0, addr: "`+r.Addr()+`"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	st := stacktest.StartProxy(t, cfg, stacktest.Opts{})
	stacktest.WaitRotation(t, st.Admin, "users", 1)

	ask := func(base, path string, hdrs ...string) demo.Answer {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+base+path, strings.NewReader("x"))
		req.Close = true // no idle connection for the replica's shutdown to wait for
		for i := 0; i+1 < len(hdrs); i += 2 {
			req.Header.Set(hdrs[i], hdrs[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a demo.Answer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != 200 {
			t.Fatalf("POST %s: %d, %v", path, resp.StatusCode, err)
		}
		return a
	}
	for _, c := range []struct {
		path string
		hdrs []string
		want string
	}{
		{"/ingest/x", []string{"X-User", "alice"}, "alice"},                 // not the path's x
		{"/ingest/x", []string{"X-User", "bob", "X-Key", "k"}, "bob"},       // not X-Key's k
		{"/ingest/order%2D42/items", nil, "order-42"},                       // decoded, as hashed
		{"/ingest/x", []string{"X-User", "tenant 7;a=b%"}, "tenant 7;a=b%"}, // any bytes
		{"/ingest", nil, ""}, // routed without a key
	} {
		if a := ask(st.Proxy, c.path, c.hdrs...); a.Key != c.want || a.Replica != "users-0" {
			t.Errorf("POST %s %q through keyway: key %q from %s, want %q", c.path, c.hdrs, a.Key, a.Replica, c.want)
		}
	}
	// Straight to the replica: no route context, so a guess.
	if a := ask(r.Addr(), "/ingest/x", "X-User", "alice"); a.Key != "x" {
		t.Errorf("POST /ingest/x straight to the replica: key %q, want its guess x", a.Key)
	}
	if a := ask(r.Addr(), "/ingest/x", "X-Key", "k"); a.Key != "k" {
		t.Errorf("POST /ingest/x with X-Key straight to the replica: key %q, want k", a.Key)
	}
}
