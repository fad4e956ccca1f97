package server_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"keyway/admin"
	"keyway/config"
	"keyway/server"
)

func loadCfg(t *testing.T, yml string) config.Config {
	t.Helper()
	cfg, err := config.LoadBytes("test.yaml", []byte(yml), config.WithEnv(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A node that cannot be built releases what it opened: the proxy's port
// is free again when the admin port is taken.
func TestNewProxyFailsCleanly(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := free.Addr().String()
	free.Close()

	cfg := loadCfg(t, `listen: "`+proxyAddr+`"
admin: {listen: "`+taken.Addr().String()+`"}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:1"}]
`)
	if _, err := server.NewProxy(cfg, server.Options{}); err == nil || !strings.Contains(err.Error(), "admin listen") {
		t.Fatalf("NewProxy with a taken admin port: %v", err)
	}
	ln, err := net.Listen("tcp", proxyAddr)
	if err != nil {
		t.Fatalf("the proxy's port is still held after NewProxy failed: %v", err)
	}
	ln.Close()
}

// Run stops when its context ends, and a node built without a file
// refuses to reload.
func TestProxyNodeRunAndReloadWithoutFile(t *testing.T) {
	cfg := loadCfg(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:1"}]
`)
	n, err := server.NewProxy(cfg, server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n.ProxyAddr() == "" || n.AdminAddr() == "" || n.GossipStarted() != nil || n.GossipAddr() != "" {
		t.Fatalf("addresses: proxy %q admin %q gossip %q", n.ProxyAddr(), n.AdminAddr(), n.GossipAddr())
	}
	_, err = n.Reload("test")
	var re *admin.ReloadError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "did not come from a file") {
		t.Fatalf("Reload without a file: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A reload that removes a set whose requests then go to another set says
// so: in its answer and in the log.
func TestReloadWarnsOfFallThrough(t *testing.T) {
	const orders = "listen: 127.0.0.1:0\nreplica_sets:\n  - name: orders\n    static: [{name: orders-0, addr: \"127.0.0.1:1\"}]\n"
	n := startReloadable(t, orders+"  - name: users\n    match: {path_prefix: /users/}\n    static: [{name: users-0, addr: \"127.0.0.1:1\"}]\n")
	n.SetFile(orders)
	res, err := n.Reload("test")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], `replica set "users" is removed: its requests (path /users/) go to replica set "orders"`) {
		t.Fatalf("reload warnings: %v", res.Warnings)
	}
}
