package server_test

import (
	"net/http"
	"testing"
)

// admin.allowed_hosts changes on a reload: a name refused with 421 is
// answered once the file lists it.
func TestReloadAllowedHosts(t *testing.T) {
	const base = `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:1"}]
`
	n := startReloadable(t, base)
	status := func() int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+n.AdminAddr()+"/v1/replica_sets", nil)
		req.Host = "keyway-admin.example.test:9901"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(); got != http.StatusMisdirectedRequest {
		t.Fatalf("Host keyway-admin.example.test before the reload: %d, want 421", got)
	}
	n.SetFile(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, allowed_hosts: ["*.example.test"]}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:1"}]
`)
	if res, err := n.Reload("test"); err != nil {
		t.Fatalf("reload: %v", err)
	} else if len(res.Keys) != 1 || res.Keys[0] != "admin.allowed_hosts" {
		t.Errorf("reload changed %v, want admin.allowed_hosts", res.Keys)
	}
	if got := status(); got != http.StatusOK {
		t.Fatalf("Host keyway-admin.example.test after the reload: %d, want 200", got)
	}
}
