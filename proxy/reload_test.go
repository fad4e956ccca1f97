package proxy

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"keyway/balancer"
	"keyway/internal/poll"
)

// declRecorder remembers the declared count of every table and the sets
// removed.
type declRecorder struct {
	mu       sync.Mutex
	declared map[string]int
	removed  []string
}

func (r *declRecorder) TableChanged(set string, declared int, _ []balancer.Member, _ balancer.RebuildInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.declared == nil {
		r.declared = map[string]int{}
	}
	r.declared[set] = declared
}

func (r *declRecorder) SetRemoved(set string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removed = append(r.removed, set)
}

func (r *declRecorder) get(set string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.declared[set]
}

func mustReload(t *testing.T, p *Proxy, cfg Config) ReloadInfo {
	t.Helper()
	info, err := p.Reload(cfg)
	if err != nil {
		t.Fatalf("Reload: %v", err)
	}
	return info
}

// A reload that adds a set, changes another's retries and timeouts (new
// pools) and its declared count keeps every key where it was, the client's
// keep-alive connection open, and a request in flight answered.
func TestReloadKeepsKeysConnectionsAndRequests(t *testing.T) {
	reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
	pay := startReplica(t, "p0")
	rec := &declRecorder{}
	reg := newRegistry()
	p, addr := startProxyOpts(t, Options{Tables: []TableObserver{rec}, Registerer: reg}, nil, reps...)
	owners := map[string]string{}
	for i := range 300 {
		k := fmt.Sprint("order-", i)
		owners[k] = ownerOf(p, "orders", k)
	}

	// A request held by its replica across the reload.
	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	slow := keyOwnedBy(t, p, "r1")
	reps[1].setHandler(func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Request.Header.Peek("X-Key")) == slow {
			entered <- struct{}{}
			<-hold
		}
		ctx.SetBodyString("r1")
	})
	inflight := make(chan reply, 1)
	go func() {
		r, err := newClient(addr).try("POST", "/ingest", "body", "X-Key", slow)
		if err != nil {
			r = reply{status: -1, body: err.Error()}
		}
		inflight <- r
	}()
	within(t, entered, 5*time.Second, "the held request to reach r1")

	conn := dialRaw(t, addr)
	conn.send(t, "GET /a HTTP/1.1\r\nHost: orders.example\r\nX-Key: order-1\r\n\r\n")
	if r := conn.read(t); r.status != 200 {
		t.Fatalf("before reload: %v", r)
	}

	cfg := testConfig(reps...)
	cfg.ReplicaSets[0].Retries.Attempts = 2
	cfg.ReplicaSets[0].Timeouts.Request = 3 * time.Second
	cfg.ReplicaSets[0].Replicas = 5
	ps := DefaultSetConfig()
	ps.Name = "payments"
	ps.Match.Host = "pay.example"
	ps.Static = []StaticReplica{{Name: "p0", Addr: pay.addr(), Weight: 1}}
	cfg.ReplicaSets = append(cfg.ReplicaSets, ps)
	info := mustReload(t, p, cfg)
	if !slices.Equal(info.Added, []string{"payments"}) || !slices.Equal(info.Changed, []string{"orders"}) || len(info.RingChanged) != 0 {
		t.Fatalf("reload info %+v", info)
	}

	close(hold)
	if r := within(t, inflight, 5*time.Second, "the held request's answer"); r.status != 200 || r.body != "r1" {
		t.Fatalf("request in flight across the reload got %v", r)
	}
	conn.send(t, "GET /b HTTP/1.1\r\nHost: pay.example\r\nX-Key: order-1\r\n\r\n")
	if r := conn.read(t); r.status != 200 || r.body != "p0" {
		t.Fatalf("the same connection after reload, new set: %v", r)
	}
	for k, want := range owners {
		if got := ownerOf(p, "orders", k); got != want {
			t.Fatalf("key %s moved from %s to %s on a reload that kept the hash", k, want, got)
		}
	}
	c := newClient(addr)
	for k, want := range owners {
		if r := c.do(t, "POST", "/ingest", "x", "X-Key", k); r.status != 200 || r.body != want {
			t.Fatalf("key %s after reload: %v, want 200 from %s", k, r, want)
		}
	}
	if got := rec.get("orders"); got != 5 {
		t.Fatalf("observers saw declared %d, want 5", got)
	}
	if got := rec.get("payments"); got != 1 {
		t.Fatalf("observers saw payments declared %d, want 1", got)
	}
	if sc := p.SetConfigs(); len(sc) != 2 || sc[0].Retries.Attempts != 2 || sc[1].Name != "payments" {
		t.Fatalf("SetConfigs after reload: %+v", sc)
	}
	if got, _ := sample(t, reg, "keyway_requests_total", map[string]string{"set": "payments", "replica": "p0", "code": "2xx"}); got != 1 {
		t.Fatalf("payments p0 2xx = %v, want 1", got)
	}

	// Remove payments: its host now falls to orders, its series are gone,
	// the observers are told.
	cfg.ReplicaSets = cfg.ReplicaSets[:1]
	info = mustReload(t, p, cfg)
	if !slices.Equal(info.Removed, []string{"payments"}) || info.Unchanged != 1 {
		t.Fatalf("reload info %+v", info)
	}
	conn.send(t, "GET /c HTTP/1.1\r\nHost: pay.example\r\nX-Key: order-1\r\n\r\n")
	if r := conn.read(t); r.status != 200 || r.body != owners["order-1"] {
		t.Fatalf("after removing payments: %v, want orders' owner %s", r, owners["order-1"])
	}
	if n := seriesWithLabel(t, reg, "set", "payments"); n != 0 {
		t.Fatalf("%d series of the removed set remain", n)
	}
	rec.mu.Lock()
	removed := slices.Clone(rec.removed)
	rec.mu.Unlock()
	if !slices.Equal(removed, []string{"payments"}) {
		t.Fatalf("SetRemoved calls %v", removed)
	}
	if slices.Contains(p.Sets(), "payments") || p.Router("payments") != nil {
		t.Fatal("payments still served")
	}
}

func seriesWithLabel(t *testing.T, g prometheus.Gatherer, name, value string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == name && l.GetValue() == value {
					n++
				}
			}
		}
	}
	return n
}

// Keys that only take effect at start refuse the whole reload, naming each.
func TestReloadRefusesStartOnlyKeys(t *testing.T) {
	a := startReplica(t, "r0")
	p, addr := startProxy(t, nil, a)
	before := p.routes.Load()
	cfg := testConfig(a)
	cfg.Listen = "127.0.0.1:1"
	cfg.Server.ReadTimeout = 7 * time.Second
	cfg.Server.MaxConns = 5
	cfg.ReplicaSets[0].Retries.Attempts = 1 // a good change in the same file
	_, err := p.Reload(cfg)
	if err == nil {
		t.Fatal("Reload accepted start-only changes")
	}
	for _, want := range []string{"listen: running with", "server.read_timeout: running with 30s, the file says 7s", "server.max_conns: running with 10000, the file says 5",
		"restart keyway"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if p.routes.Load() != before {
		t.Fatal("a refused reload changed the routes")
	}
	// An invalid set is refused by validation, naming the key.
	cfg = testConfig(a)
	cfg.ReplicaSets[0].Retries.Attempts = 0
	cfg.ReplicaSets[0].Name = "Bad Name"
	if _, err := p.Reload(cfg); err == nil || !strings.Contains(err.Error(), "name") {
		t.Fatalf("Reload of a bad name: %v", err)
	}
	if r := newClient(addr).do(t, "GET", "/", "", "X-Key", "k"); r.status != 200 {
		t.Fatalf("after refused reloads: %v", r)
	}
}

// A new ring shape moves keys (reported), a new static list replaces a
// replica, and a run-time declared count survives reloads that do not
// touch the file's count.
func TestReloadRingStaticAndDeclared(t *testing.T) {
	a, b, c, d := startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2"), startReplica(t, "r3")
	rec := &declRecorder{}
	p, addr := startProxyOpts(t, Options{Tables: []TableObserver{rec}}, nil, a, b, c)

	cfg := testConfig(a, b, c)
	cfg.ReplicaSets[0].Hash.Partitions = 271
	info := mustReload(t, p, cfg)
	if !slices.Equal(info.RingChanged, []string{"orders"}) || p.Router("orders").Table().Partitions() != 271 {
		t.Fatalf("hash reload: %+v, %d partitions", info, p.Router("orders").Table().Partitions())
	}

	cfg = testConfig(a, b, d) // r2 replaced by r3
	cfg.ReplicaSets[0].Hash.Partitions = 271
	mustReload(t, p, cfg)
	key := keyOwnedBy(t, p, "r3")
	if r := newClient(addr).do(t, "POST", "/", "x", "X-Key", key); r.status != 200 || r.body != "r3" {
		t.Fatalf("new static replica: %v", r)
	}
	for _, m := range p.Router("orders").Table().Members() {
		if m.Name == "r2" {
			t.Fatal("r2 still a member after leaving the static list")
		}
	}

	cfg.ReplicaSets[0].Replicas = 7
	mustReload(t, p, cfg)
	if got := p.SetConfigs()[0].Replicas; got != 7 || rec.get("orders") != 7 {
		t.Fatalf("declared after the file changed it: %d (observers %d), want 7", got, rec.get("orders"))
	}
}

// Reloads racing with traffic: every request answered 200 (run with -race).
func TestReloadUnderTraffic(t *testing.T) {
	reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
	p, addr := startProxy(t, nil, reps...)
	stop := make(chan struct{})
	var sent, bad atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			c := newClient(addr)
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := c.try("POST", "/ingest", "x", "X-Key", fmt.Sprint("k", w, "-", i%50))
				sent.Add(1)
				if err != nil || r.status != 200 {
					bad.Add(1)
				}
			}
		})
	}
	for i := range 40 {
		cfg := testConfig(reps...)
		cfg.ReplicaSets[0].Retries.Attempts = 1 + i%3
		cfg.ReplicaSets[0].Timeouts.Idle = time.Duration(1+i%2) * time.Minute // new pools every other time
		if i%4 == 0 {
			ps := DefaultSetConfig()
			ps.Name = "payments"
			ps.Match.Host = "pay.example"
			ps.Static = []StaticReplica{{Name: "p0", Addr: reps[0].addr(), Weight: 1}}
			cfg.ReplicaSets = append(cfg.ReplicaSets, ps)
		}
		mustReload(t, p, cfg)
	}
	close(stop)
	wg.Wait()
	if bad.Load() != 0 || sent.Load() == 0 {
		t.Fatalf("%d of %d requests failed across 40 reloads", bad.Load(), sent.Load())
	}
	t.Logf("%d requests across 40 reloads, all 200", sent.Load())
}

// A set added by a reload and fed by gossip right after (the reloader's
// Resync) serves its first request at once, coalescing window or not.
func TestReloadNewGossipSetServesAtOnce(t *testing.T) {
	a, g := startReplica(t, "r0"), startReplica(t, "g0")
	p, addr := startProxyOpts(t, Options{Coalesce: time.Minute}, nil, a)
	cfg := testConfig(a)
	ps := DefaultSetConfig()
	ps.Name = "payments"
	ps.Match.Host = "pay.example"
	cfg.ReplicaSets = append(cfg.ReplicaSets, ps)
	mustReload(t, p, cfg)
	if !p.SetReplicaSet("payments", []balancer.Replica{{Name: "g0", Addr: g.addr(), State: balancer.StateReady, Weight: 1}}) {
		t.Fatal("payments not served after the reload")
	}
	conn := dialRaw(t, addr)
	conn.send(t, "GET /x HTTP/1.1\r\nHost: pay.example\r\nX-Key: k\r\n\r\n")
	if r := conn.read(t); r.status != 200 || r.body != "g0" {
		t.Fatalf("first request to the new set: %v", r)
	}
}

// A request in flight on a pool a reload renews returns its connection to
// the retired pool, which closes it (instead of keeping it open until the
// old idle timeout).
func TestReloadRetiredPoolClosesInflightConn(t *testing.T) {
	r0 := startReplica(t, "r0")
	p, addr := startProxy(t, nil, r0)
	old := p.Router("orders").Table().Backend(0)
	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	r0.setHandler(func(ctx *fasthttp.RequestCtx) { entered <- struct{}{}; <-hold })
	done := make(chan reply, 1)
	go func() {
		r, err := newClient(addr).try("POST", "/", "x", "X-Key", "k")
		if err != nil {
			r.status = -1
		}
		done <- r
	}()
	within(t, entered, 5*time.Second, "the request to reach r0")
	cfg := testConfig(r0)
	cfg.ReplicaSets[0].Timeouts.Idle = 5 * time.Minute
	mustReload(t, p, cfg)
	if p.Router("orders").Table().Backend(0) == old {
		t.Fatal("the pool was not renewed")
	}
	close(hold)
	if r := within(t, done, 5*time.Second, "the answer"); r.status != 200 {
		t.Fatalf("request across the renewal: %v", r)
	}
	poll.Until(t, 5*time.Second, "the retired pool to close its connection", func() bool { return old.hc.ConnsCount() == 0 })
}

// A gossip feed racing the removal of its set cannot put replicas back
// into the removed set's router (run with -race).
func TestReloadRemovalRacesGossip(t *testing.T) {
	a, g := startReplica(t, "r0"), startReplica(t, "g0")
	reg := newRegistry()
	p, _ := startProxyOpts(t, Options{Registerer: reg}, nil, a)
	with := testConfig(a)
	ps := DefaultSetConfig()
	ps.Name = "payments"
	ps.Match.Host = "pay.example"
	with.ReplicaSets = append(with.ReplicaSets, ps)
	without := testConfig(a)
	reps := []balancer.Replica{{Name: "g0", Addr: g.addr(), State: balancer.StateReady, Weight: 1}}
	for range 30 {
		mustReload(t, p, with)
		st := p.routes.Load().byName["payments"].st
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 20 {
				p.SetReplicaSet("payments", reps)
				p.SetReplicaSet("payments", nil)
			}
			p.SetReplicaSet("payments", reps)
		})
		mustReload(t, p, without)
		wg.Wait()
		st.router.Flush()
		if n := st.router.Table().Len(); n != 0 {
			t.Fatalf("the removed set's router has %d members after racing gossip", n)
		}
		if n := seriesWithLabel(t, reg, "set", "payments"); n != 0 {
			t.Fatalf("%d series of the removed set after racing gossip", n)
		}
	}
}

// BenchmarkReload measures Proxy.Reload of a set with 30 static replicas:
// a parameter change (same pools), new pools, and a new ring shape.
func BenchmarkReload(b *testing.B) {
	base := DefaultConfig()
	base.Listen = "127.0.0.1:0"
	sc := DefaultSetConfig()
	sc.Name = "orders"
	for i := range 30 {
		sc.Static = append(sc.Static, StaticReplica{Name: fmt.Sprintf("orders-%02d", i), Addr: fmt.Sprintf("127.0.0.1:%d", 20000+i), Weight: 1})
	}
	base.ReplicaSets = []SetConfig{sc}
	for _, bc := range []struct {
		name   string
		change func(*SetConfig)
	}{
		{"retries", func(s *SetConfig) { s.Retries.Attempts = 1 }},
		{"new_pools", func(s *SetConfig) { s.Timeouts.Idle = time.Minute }},
		{"new_ring", func(s *SetConfig) { s.Hash.Partitions = 7907 }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p, err := New(base, Options{Coalesce: -1})
			if err != nil {
				b.Fatal(err)
			}
			alt := base
			alt.ReplicaSets = []SetConfig{sc}
			bc.change(&alt.ReplicaSets[0])
			b.ResetTimer()
			for i := range b.N {
				cfg := base
				if i%2 == 0 {
					cfg = alt
				}
				if _, err := p.Reload(cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A stopped set answers every request 503 with Retry-After and a JSON
// body naming the set, keyed or not, and Explain says the same; started
// again, every key goes back to the replica it had.
func TestStoppedSetAnswers503AndComesBack(t *testing.T) {
	a, b := startReplica(t, "r0"), startReplica(t, "r1")
	p, addr := startProxy(t, nil, a, b)
	cfg := testConfig(a, b)
	cl := newClient(addr)
	before := map[string]string{}
	for i := range 50 {
		k := fmt.Sprintf("k%d", i)
		before[k] = cl.do(t, "POST", "/ingest", "x", "X-Key", k).body
	}
	served := a.count.Load() + b.count.Load()

	cfg.ReplicaSets[0].Stopped = true
	if info := mustReload(t, p, cfg); !slices.Equal(info.Changed, []string{"orders"}) || len(info.RingChanged) != 0 {
		t.Fatalf("stop reload: %+v", info)
	}
	for _, hdrs := range [][]string{{"X-Key", "k1"}, nil} {
		r := cl.do(t, "POST", "/ingest", "x", hdrs...)
		if r.status != 503 || r.header["Retry-After"] != "10" {
			t.Fatalf("stopped set: %s", r)
		}
		if e := r.errorJSON(t); e["replica_set"] != "orders" || !strings.Contains(e["error"], "stopped") {
			t.Fatalf("stopped set body: %v", e)
		}
	}
	if got := a.count.Load() + b.count.Load(); got != served {
		t.Fatalf("a stopped set forwarded %d requests", got-served)
	}
	ex, err := p.Explain("orders", "k1")
	if err != nil || ex.Pick != "" || ex.Answer == nil || ex.Answer.Status != 503 || !strings.Contains(ex.Answer.Message, "stopped") {
		t.Fatalf("explain of a stopped set: %+v %v", ex, err)
	}
	for _, c := range ex.Candidates {
		if c.Skipped != skipStopped {
			t.Fatalf("candidate %+v: want skipped %q", c, skipStopped)
		}
	}

	cfg.ReplicaSets[0].Stopped = false
	mustReload(t, p, cfg)
	for k, owner := range before {
		if got := cl.do(t, "POST", "/ingest", "x", "X-Key", k).body; got != owner {
			t.Fatalf("key %s went to %s after the start, %s before the stop", k, got, owner)
		}
	}
}
