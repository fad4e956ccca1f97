package stacktest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"keyway/config"
	"keyway/demo"
)

// Orders is a proxy node run in-process, with three static demo
// replicas of "orders", gossip on (port 0, no peers) and active and passive
// health checks on.
type Orders struct {
	Proxy, Admin string
	// StopReplica stops a demo replica by name (idempotent).
	StopReplica map[string]func()
}

// StartOrders runs Orders until the test ends and returns once its three
// replicas are in rotation.
func StartOrders(t testing.TB) *Orders {
	t.Helper()
	var static strings.Builder
	st := &Orders{StopReplica: map[string]func(){}}
	for i := range 3 {
		name := fmt.Sprintf("orders-%d", i)
		addr, stop := StartDemoReplica(t, name)
		st.StopReplica[name] = stop
		fmt.Fprintf(&static, "      - {name: %s, addr: %q}\n", name, addr)
	}
	yml := `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
log: {level: warn}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0, profile: fast}
health:
  active: {enabled: true, path: /healthz, interval: 2s, timeout: 1s} # generous: a loaded CI machine must not fail healthy replicas
  passive: {enabled: true, consecutive_failures: 1, count: [connect, 5xx]}
replica_sets:
  - name: orders
    replicas: 3
    retries: {attempts: 2}
    static:
` + static.String()
	cfg, err := config.LoadBytes("test.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	s := StartProxy(t, cfg, Opts{})
	st.Proxy, st.Admin = s.Proxy, s.Admin
	WaitRotation(t, st.Admin, "orders", 3)
	return st
}

// Send posts one request with an X-Key through the proxy and returns the
// replica that answered (see SendKey).
func (st *Orders) Send(t testing.TB, key string) string {
	t.Helper()
	return SendKey(t, st.Proxy, key)
}

// SendKey posts one request with an X-Key to the proxy at addr, path
// /ingest, and returns the demo replica that answered (it names itself),
// failing the test on anything but a demo replica's answer for that key.
func SendKey(t testing.TB, addr, key string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/ingest", strings.NewReader("x"))
	req.Header.Set("X-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a demo.Answer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || a.Key != key {
		t.Fatalf("key %q: status %d, answer %+v, %v", key, resp.StatusCode, a, err)
	}
	return a.Replica
}
