package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"keyway/config"
	"keyway/demo"
	"keyway/membership"
)

// stack is a keyway proxy run in-process by serveFile, until its test ends.
type stack struct {
	proxy, admin string
	gossip       string // "" unless started with gossip
	stderr       *syncBuffer
}

// stackOpts are startStack's options. The zero value runs cfg without a
// file (no reload) and does not wait for gossip.
type stackOpts struct {
	file   string
	load   func() (config.Config, error)
	gossip bool // wait for the gossip node and record its address
}

// startStack runs serveFile with cfg in-process and returns once the
// proxy and admin listeners (and with o.gossip the gossip node) are up.
// The stack stops at the test's cleanup, which fails the test if serve
// returned an error.
func startStack(t *testing.T, cfg config.Config, o stackOpts) *stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := &stack{stderr: &syncBuffer{}}
	addrs := make(chan [2]string, 1)
	gossip := make(chan string, 1)
	var onGossip gossipStarted
	if o.gossip {
		onGossip = func(g string) { gossip <- g }
	}
	served := make(chan error, 1)
	go func() {
		served <- serveFile(ctx, cfg, o.file, o.load, &syncBuffer{}, st.stderr, func(p, a string) { addrs <- [2]string{p, a} }, onGossip)
	}()
	select {
	case a := <-addrs:
		st.proxy, st.admin = a[0], a[1]
	case err := <-served:
		cancel()
		t.Fatalf("serve ended before listening: %v; stderr: %s", err, st.stderr.String())
	}
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	if o.gossip {
		select {
		case st.gossip = <-gossip:
		case <-time.After(10 * time.Second):
			t.Fatal("gossip did not start within 10s")
		}
	}
	return st
}

// startDemoReplica runs a demo replica on 127.0.0.1:0 until the test ends
// or stop (idempotent) is called.
func startDemoReplica(t *testing.T, name string) (addr string, stop func()) {
	t.Helper()
	r, err := demo.Listen(name, "127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return r.Addr(), stop
}

// startGossipReplica joins a replica's gossip member (no agent: its
// metadata is fixed) to a proxy's gossip address, until the test ends or
// leave (idempotent) is called.
func startGossipReplica(t *testing.T, join string, meta membership.Meta) (node *membership.Node, leave func()) {
	t.Helper()
	cfg := membership.DefaultConfig()
	cfg.BindAddr, cfg.BindPort, cfg.Profile = "127.0.0.1", 0, "fast"
	cfg.Join = []string{join}
	meta.Role = membership.RoleReplica
	node, err := membership.New(cfg, meta, membership.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx) }()
	leave = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica gossip: %v", err)
		}
	})
	t.Cleanup(leave)
	return node, leave
}
