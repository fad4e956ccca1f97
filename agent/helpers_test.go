package agent_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"keyway/agent"
	"keyway/balancer"
	"keyway/membership"
)

// testLogger logs to t until the test ends, then drops entries (gossip
// goroutines may log while shutting down after the test returned), and
// also records every entry for assertions.
func testLogger(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	enc := zap.NewDevelopmentEncoderConfig()
	obsCore, logs := observer.New(zapcore.DebugLevel)
	core := zapcore.NewTee(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(w), zapcore.InfoLevel), obsCore)
	return zap.New(core), logs
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

// replica is a scripted replica: it answers every request according to
// its current mode, and counts requests.
type replica struct {
	addr     string
	mode     atomic.Value // "ok", "fail" (503) or "hang" (no answer until the client gives up)
	requests atomic.Int64
}

func startReplica(t *testing.T, mode string) *replica {
	t.Helper()
	r := &replica{}
	r.mode.Store(mode)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	done := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		switch r.mode.Load() {
		case "ok":
			io.WriteString(w, "ready")
		case "fail":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "hang":
			select {
			case <-req.Context().Done():
			case <-done:
			}
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { close(done); _ = srv.Close() })
	return r
}

// testConfig is an agent configuration for loopback tests: fast probes,
// fast gossip, HTTP on a free port.
func testConfig(replicaAddr string, join ...string) agent.Config {
	c := agent.DefaultConfig()
	c.Replica.Set = "orders"
	c.Replica.Name = "orders-0"
	c.Replica.Addr = replicaAddr
	c.Probe.Interval = 20 * time.Millisecond
	c.Probe.Timeout = 50 * time.Millisecond
	c.Probe.Rise, c.Probe.Fall = 2, 3
	c.Listen = "127.0.0.1:0"
	c.Drain.Timeout = 10 * time.Second
	c.Gossip = gossipConfig(join...)
	return c
}

func gossipConfig(join ...string) membership.Config {
	g := membership.DefaultConfig()
	g.BindAddr, g.BindPort = "127.0.0.1", 0
	g.Profile = "fast"
	g.PushPullInterval = 2 * time.Second
	g.Join = join
	return g
}

// running is an agent started by startAgent.
type running struct {
	*agent.Agent
	reg    *prometheus.Registry
	logs   *observer.ObservedLogs
	cancel context.CancelFunc
	done   chan error
	base   string // http://ADDR of the agent's listener
}

func startAgent(t *testing.T, cfg agent.Config) *running {
	t.Helper()
	r := runAgent(t, cfg, nil)
	select {
	case <-r.Started():
	case err := <-r.done:
		t.Fatalf("agent did not start: %v", err)
	}
	return r
}

// runAgent builds an agent as server.NewAgent wires one: the runtime,
// with a command a supervisor (starting its processes with start, jitter
// seed 1), and a gossip member bound to the agent; with the test's logger
// and registry. (The agent's tests stay below server, which imports every
// component.) It runs the agent until the test ends; it does not wait for
// it to start.
func runAgent(t *testing.T, cfg agent.Config, start agent.StartFunc) *running {
	t.Helper()
	log, logs := testLogger(t)
	reg := prometheus.NewPedanticRegistry()
	a, err := agent.New(cfg, agent.Options{Logger: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Command) > 0 {
		sup, err := agent.NewSupervisor(cfg.Command, cfg.Supervise, agent.SupervisorOptions{
			Start: start, Seed: 1, Logger: log.Named("supervisor"), Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		a.Supervise(sup)
	}
	node, err := membership.New(cfg.Gossip, a.Meta(), membership.Options{Logger: log.Named("gossip"), Registerer: reg, Sink: a})
	if err != nil {
		t.Fatal(err)
	}
	a.Attach(node)
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Agent: a, reg: reg, logs: logs, cancel: cancel, done: make(chan error, 1), base: "http://" + a.Addr().String()}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop within 30s")
		}
	})
	return r
}

// stop cancels Run and waits for it to return, failing after d.
func (r *running) stop(t *testing.T, d time.Duration) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(d):
		t.Fatalf("Run did not return within %s of cancel", d)
		return nil
	}
}

// get returns the status and body of GET base+path.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of the series name{label=value} in reg, or -1.
func metric(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if m.Gauge != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// transitions lists the "from>to" of every "replica state changed" entry.
func transitions(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.FilterMessage("replica state changed").All() {
		m := e.ContextMap()
		out = append(out, m["from"].(string)+">"+m["to"].(string))
	}
	return out
}

// gossipNode is a plain membership node standing in for a proxy (role
// proxy) or another replica.
type gossipNode struct {
	*membership.Node
	cancel context.CancelFunc
	done   chan error
}

func startNode(t *testing.T, meta membership.Meta, join ...string) *gossipNode {
	t.Helper()
	log, _ := testLogger(t)
	n, err := membership.New(gossipConfig(join...), meta, membership.Options{Logger: log.Named(meta.Role.String())})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gossipNode{Node: n, cancel: cancel, done: make(chan error, 1)}
	go func() { g.done <- n.Run(ctx) }()
	select {
	case <-n.Started():
	case err := <-g.done:
		t.Fatalf("gossip node did not start: %v", err)
	}
	t.Cleanup(func() { cancel(); <-g.done })
	return g
}

// member returns this node's view of the member with gossip name node.
func (g *gossipNode) member(node string) (membership.Member, bool) {
	for _, m := range g.Members() {
		if m.Node == node {
			return m, true
		}
	}
	return membership.Member{}, false
}

// fakeProxy is a gossip member with role proxy that, like a real proxy's
// discovery, sends a drain report every 50ms to the agent of every replica
// it sees draining, with an in-flight count the test controls. A silent
// fake proxy never reports.
//
// Unlike a real proxy it goes quiet towards a replica once it has reported
// 0 in flight: membership.Node.Send reads the member's entry after
// releasing the node's lock, which races with the gossip update that
// follows (the agent's stopped state) under the race detector; see the
// note in the agent's report. Going quiet keeps Send and that update apart,
// and the agent only ever needs each proxy's latest report.
type fakeProxy struct {
	*gossipNode
	inflight atomic.Int64
	silent   atomic.Bool
	sent     atomic.Int64
}

func startFakeProxy(t *testing.T, name string, join ...string) *fakeProxy {
	t.Helper()
	p := &fakeProxy{gossipNode: startNode(t, membership.Meta{Role: membership.RoleProxy, Addr: name}, join...)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		finished, stopped := map[string]bool{}, map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if p.silent.Load() {
				continue
			}
			for _, m := range p.Members() {
				if m.Meta.Role != membership.RoleReplica || m.Status != membership.StatusAlive {
					continue
				}
				if m.Meta.State == balancer.StateStopped && !stopped[m.Node] {
					// One confirmation that it sees the replica stopped.
					rep := membership.DrainReport{Set: m.Meta.Set, Replica: m.Meta.Replica, Boot: m.Meta.Boot, DrainingSeen: true, StoppedSeen: true}
					if p.Send(m.Node, rep.Encode()) == nil {
						stopped[m.Node] = true
					}
					_ = p.Members()
					continue
				}
				if m.Meta.State != balancer.StateDraining || finished[m.Node] {
					continue
				}
				rep := membership.DrainReport{Set: m.Meta.Set, Replica: m.Meta.Replica, Boot: m.Meta.Boot, DrainingSeen: true, Inflight: p.inflight.Load()}
				err := p.Send(m.Node, rep.Encode())
				// Take the node's lock at once: it orders Send's unlocked
				// reads before the gossip update the report may trigger.
				_ = p.Members()
				if err == nil {
					p.sent.Add(1)
					finished[m.Node] = rep.Inflight == 0
				}
			}
		}
	}()
	// Registered after startNode's cleanup, so it runs first: the report
	// loop stops before the node does.
	t.Cleanup(func() { cancel(); <-done })
	return p
}
