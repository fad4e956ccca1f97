// Package stacktest runs keyway nodes in-process for tests: a proxy node
// built by package server from a configuration value, demo replicas and
// bare gossip replicas, each stopped when its test ends. The whole-stack
// tests in integration/ and the CLI tests in cmd/keyway share it.
package stacktest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"keyway/config"
	"keyway/demo"
	"keyway/internal/poll"
	"keyway/membership"
	"keyway/server"
)

// SyncBuffer is a bytes.Buffer safe for concurrent writers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Stack is a proxy node run in-process until its test ends.
type Stack struct {
	Node         *server.ProxyNode
	Proxy, Admin string      // bound addresses
	Gossip       string      // "" unless started with Opts.Gossip
	Stderr       *SyncBuffer // the node's application logs
}

// Opts are StartProxy's options. The zero value runs cfg without a file
// (no reload) and does not wait for gossip.
type Opts struct {
	File   string
	Load   func() (config.Config, error)
	Gossip bool // wait for the gossip node and record its address
	// Stdout receives the access log; nil discards it.
	Stdout io.Writer
	// GossipTransport wraps the node's gossip transport
	// (server.Options.GossipTransport), e.g. a gossipfault.Switch's Wrap.
	GossipTransport func(*memberlist.NetTransport) memberlist.NodeAwareTransport
}

// StartProxy builds a proxy node from cfg and runs it until the test ends,
// when it stops it and fails the test if Run returned an error. It returns
// once the listeners (and with o.Gossip the gossip node) are up.
func StartProxy(t testing.TB, cfg config.Config, o Opts) *Stack {
	t.Helper()
	st := &Stack{Stderr: &SyncBuffer{}}
	n, err := server.NewProxy(cfg, server.Options{Stdout: o.Stdout, Stderr: st.Stderr, File: o.File, Load: o.Load, Version: "test", GossipTransport: o.GossipTransport})
	if err != nil {
		t.Fatalf("server.NewProxy: %v", err)
	}
	st.Node, st.Proxy, st.Admin = n, n.ProxyAddr(), n.AdminAddr()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("proxy node: %v", err)
		}
	})
	if o.Gossip {
		select {
		case <-n.GossipStarted():
			st.Gossip = n.GossipAddr()
		case err := <-served:
			t.Fatalf("proxy node stopped before gossip started: %v; stderr: %s", err, st.Stderr.String())
		case <-time.After(10 * time.Second):
			t.Fatal("gossip did not start within 10s")
		}
	}
	return st
}

// StartDemoReplica runs a demo replica on 127.0.0.1:0 until the test ends
// or stop (idempotent) is called.
func StartDemoReplica(t testing.TB, name string) (addr string, stop func()) {
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

// StartGossipReplica joins a replica's gossip member (no agent: its
// metadata is fixed) to a proxy's gossip address, until the test ends or
// leave (idempotent) is called. It signs with the credentials file
// KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE names, as an agent started in the
// test's environment would, when it is set (the integration tests set
// it for every keyway they start).
func StartGossipReplica(t testing.TB, join string, meta membership.Meta) (node *membership.Node, leave func()) {
	t.Helper()
	cfg := membership.DefaultConfig()
	cfg.BindAddr, cfg.BindPort, cfg.Profile = "127.0.0.1", 0, "fast"
	cfg.Join = []string{join}
	cfg.CredentialsFile = os.Getenv("KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE")
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

// Demo is a demo (server.NewDemo) run in-process until its test ends.
type Demo struct {
	Proxy, Admin string
	Stderr       *SyncBuffer
}

// StartDemo runs the demo of cfg and returns once every replica of set is
// in rotation (within 30 s).
func StartDemo(t testing.TB, cfg config.Config, set string, replicas int) *Demo {
	t.Helper()
	d := &Demo{Stderr: &SyncBuffer{}}
	dm, err := server.NewDemo(cfg, server.Options{Stderr: d.Stderr, Version: "test"})
	if err != nil {
		t.Fatalf("server.NewDemo: %v", err)
	}
	d.Proxy, d.Admin = dm.Proxy.ProxyAddr(), dm.Proxy.AdminAddr()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- dm.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("demo: %v", err)
		}
	})
	WaitRotation(t, d.Admin, set, replicas)
	return d
}

// WaitRotation polls the admin /metrics until n replicas of set are in
// rotation (within 30 s).
func WaitRotation(t testing.TB, admin, set string, n int) {
	t.Helper()
	want := `keyway_rotation_replicas{set="` + set + `"} ` + strconv.Itoa(n) + "\n"
	poll.Until(t, 30*time.Second, strings.TrimSpace(want), func() bool {
		return strings.Contains(Get("http://"+admin+"/metrics"), want)
	})
}

// Get returns the body of GET url, or "" on a transport error.
func Get(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// GetJSON decodes GET url into v, failing the test on a transport
// error, a status other than 200 or a body that does not decode.
func GetJSON(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}
