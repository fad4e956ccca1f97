package server_test

import (
	"context"
	"sync"
	"testing"

	"keyway/config"
	"keyway/server"
)

// reloadableNode runs a proxy node built from the YAML file text holds,
// which reloads read again (SetFile changes it), until the test ends.
type reloadableNode struct {
	*server.ProxyNode
	mu   sync.Mutex
	file string
}

func startReloadable(t *testing.T, file string) *reloadableNode {
	t.Helper()
	r := &reloadableNode{file: file}
	load := func() (config.Config, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return config.LoadBytes("proxy.yaml", []byte(r.file), config.WithEnv(nil))
	}
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	if r.ProxyNode, err = server.NewProxy(cfg, server.Options{File: "proxy.yaml", Load: load}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return r
}

// SetFile changes what the next reload reads.
func (r *reloadableNode) SetFile(s string) {
	r.mu.Lock()
	r.file = s
	r.mu.Unlock()
}
