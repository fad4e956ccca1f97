package membership_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"keyway/balancer"
	"keyway/internal/slow"
	"keyway/membership"
)

// recorder is a Sink keeping the latest snapshot.
type recorder struct {
	mu   sync.Mutex
	last []membership.Member
	ch   chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) SetMembers(ms []membership.Member) {
	r.mu.Lock()
	r.last = ms
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

func (r *recorder) snapshot() []membership.Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// waitFor polls cond on every snapshot until it holds or the deadline passes.
func (r *recorder) waitFor(t *testing.T, what string, d time.Duration, cond func([]membership.Member) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond(r.snapshot()) {
			return
		}
		select {
		case <-r.ch:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s; last snapshot: %+v", d, what, r.snapshot())
		}
	}
}

func testConfig() membership.Config {
	c := membership.DefaultConfig()
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.Profile = "fast"
	c.ForgetAfter = time.Minute
	c.PushPullInterval = 2 * time.Second
	return c
}

type testNode struct {
	*membership.Node
	rec    *recorder
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startNode(t *testing.T, cfg membership.Config, meta membership.Meta, env map[string]string) *testNode {
	t.Helper()
	rec := newRecorder()
	n, err := membership.New(cfg, meta, membership.Options{
		Logger: testLogger(t).Named(meta.Replica),
		Sink:   rec,
		Env:    func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn := &testNode{Node: n, rec: rec, cancel: cancel, done: make(chan error, 1)}
	go func() { tn.done <- n.Run(ctx) }()
	select {
	case <-n.Started():
	case err := <-tn.done:
		t.Fatalf("node %s did not start: %v", meta.Replica, err)
	}
	t.Cleanup(tn.stop)
	return tn
}

func (n *testNode) stop() {
	n.once.Do(func() {
		n.cancel()
		<-n.done
	})
}

func replicaMeta(name string) membership.Meta {
	return membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: name, Addr: "127.0.0.1:1", State: balancer.StateReady}
}

func alive(ms []membership.Member) map[string]membership.Member {
	out := map[string]membership.Member{}
	for _, m := range ms {
		if m.Status == membership.StatusAlive {
			out[m.Meta.Replica] = m
		}
	}
	return out
}

func TestClusterConvergesAndPropagatesMeta(t *testing.T) {
	seed := startNode(t, testConfig(), replicaMeta("r0"), nil)
	cfg := testConfig()
	cfg.Join = []string{seed.GossipAddr()}
	nodes := []*testNode{seed}
	for i := 1; i < 4; i++ {
		nodes = append(nodes, startNode(t, cfg, replicaMeta(fmt.Sprintf("r%d", i)), nil))
	}
	for _, n := range nodes {
		n.rec.waitFor(t, "4 alive members", 10*time.Second, func(ms []membership.Member) bool { return len(alive(ms)) == 4 })
	}
	start := time.Now()
	if err := nodes[2].UpdateMeta(func(m *membership.Meta) { m.State = balancer.StateDraining }, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.rec.waitFor(t, "r2 draining", 10*time.Second, func(ms []membership.Member) bool {
			return alive(ms)["r2"].Meta.State == balancer.StateDraining
		})
	}
	t.Logf("state change reached all 4 nodes in %s", time.Since(start))

	// Graceful leave: advertise stopped, then leave: peers see Left.
	nodes[3].UpdateMeta(func(m *membership.Meta) { m.State = balancer.StateStopped }, time.Second)
	nodes[3].stop()
	nodes[0].rec.waitFor(t, "r3 left", 10*time.Second, func(ms []membership.Member) bool {
		for _, m := range ms {
			if m.Meta.Replica == "r3" {
				return m.Status == membership.StatusLeft
			}
		}
		return false
	})
}

func TestForeignLabelAndKeyNeverJoin(t *testing.T) {
	slow.Skip(t)
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	other := base64.StdEncoding.EncodeToString([]byte("fedcba9876543210fedcba9876543210"))
	env := map[string]string{"KEYWAY_GOSSIP_KEY": key}
	seed := startNode(t, testConfig(), replicaMeta("r0"), env)

	cases := map[string]struct {
		label string
		env   map[string]string
	}{
		"other label":     {"other", env},
		"no key":          {"keyway", nil},
		"wrong key":       {"keyway", map[string]string{"KEYWAY_GOSSIP_KEY": other}},
		"other label+key": {"x", map[string]string{"KEYWAY_GOSSIP_KEY": other}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Label = tc.label
			cfg.Join = []string{seed.GossipAddr()}
			cfg.RejoinInterval = 0
			n := startNode(t, cfg, replicaMeta("intruder"), tc.env)
			// The joiner keeps retrying with backoff; it must never appear.
			// Bounded: 2 s of snapshots on both sides.
			deadline := time.Now().Add(2 * time.Second)
			for time.Now().Before(deadline) {
				if _, ok := alive(seed.rec.snapshot())["intruder"]; ok {
					t.Fatal("intruder joined the cluster")
				}
				if _, ok := alive(n.rec.snapshot())["r0"]; ok {
					t.Fatal("intruder sees the cluster")
				}
				select {
				case <-seed.rec.ch:
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	// A node with the right label and key does join.
	cfg := testConfig()
	cfg.Join = []string{seed.GossipAddr()}
	startNode(t, cfg, replicaMeta("friend"), env)
	seed.rec.waitFor(t, "friend joined", 10*time.Second, func(ms []membership.Member) bool { _, ok := alive(ms)["friend"]; return ok })
}

// A raw memberlist peer with garbage metadata is ignored and counted; the
// cluster keeps working.
func TestGarbageMetadataIgnored(t *testing.T) {
	seed := startNode(t, testConfig(), replicaMeta("r0"), nil)
	c := memberlist.DefaultLANConfig()
	c.Name = "garbage"
	c.BindAddr, c.BindPort = "127.0.0.1", 0
	c.Label = "keyway"
	c.LogOutput = io.Discard
	c.Delegate = garbage{}
	ml, err := memberlist.Create(c)
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Shutdown()
	_, _ = ml.Join([]string{seed.GossipAddr()}) // rejected by the alive delegate
	cfg := testConfig()
	cfg.Join = []string{seed.GossipAddr()}
	startNode(t, cfg, replicaMeta("r1"), nil)
	seed.rec.waitFor(t, "r1 joined", 10*time.Second, func(ms []membership.Member) bool { _, ok := alive(ms)["r1"]; return ok })
	for _, m := range seed.Members() {
		if m.Node == "garbage" {
			t.Fatalf("garbage peer listed: %+v", m)
		}
	}
}

type garbage struct{}

func (garbage) NodeMeta(int) []byte             { return []byte{0xff, 0x00, 0x13, 0x37, 0xde, 0xad, 0xbe, 0xef} }
func (garbage) NotifyMsg([]byte)                {}
func (garbage) GetBroadcasts(int, int) [][]byte { return nil }
func (garbage) LocalState(bool) []byte          { return nil }
func (garbage) MergeRemoteState([]byte, bool)   {}

// testLogger logs to t until the test ends, then drops entries: memberlist's
// goroutines may still log while shutting down, after the test returned.
func testLogger(t *testing.T) *zap.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	enc := zap.NewDevelopmentEncoderConfig()
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(w), zapcore.InfoLevel))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// A fixed bind port with an explicit address is advertised as that port,
// not as 0 (memberlist advertises AdvertisePort verbatim).
func TestFixedPortAdvertised(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := testConfig()
	cfg.BindPort = port
	cfg.AdvertiseAddr = "127.0.0.1"
	n := startNode(t, cfg, replicaMeta("fixed"), nil)
	if got, want := n.GossipAddr(), fmt.Sprintf("127.0.0.1:%d", port); got != want {
		t.Fatalf("advertised %s, want %s", got, want)
	}
}
