package proxy

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"

	"keyway/balancer"
)

// routeScenario is a state of a four-replica set (r0..r3, fed by gossip)
// that requests and Explain must agree on.
type routeScenario struct {
	failOpen bool
	strict   bool
	attempts int                       // 0: the default
	states   map[string]balancer.State // gossip states after joining ready
	down     []string                  // gossip reports them down
	excluded []string                  // failing active health checks
	stopped  []string                  // listeners closed too
	query    bool                      // the key travels in a query parameter
	// What the scenario must exercise, so that it tests what it says.
	wantAnswers, wantFailOpen, wantFailover bool
}

// Requests and Explain go through the same decision: for many keys in
// every scenario, the replica that answers a real request is Explain's
// Pick, or keyway's own answer is Explain's Answer.
func TestExplainMatchesRouting(t *testing.T) {
	probe := []string{"r0", "r1", "r2", "r3"}
	draining := balancer.StateDraining
	scenarios := map[string]routeScenario{
		"all in rotation":                          {},
		"next: owner drained, another excluded":    {states: map[string]balancer.State{"r1": draining}, excluded: []string{"r2"}, wantFailover: true},
		"next: three of four out, three attempts":  {attempts: 3, states: map[string]balancer.State{"r0": draining}, excluded: []string{"r1"}, down: []string{"r2"}, wantFailover: true},
		"strict: owner excluded or drained":        {strict: true, states: map[string]balancer.State{"r2": draining}, excluded: []string{"r1"}, wantAnswers: true},
		"all excluded by health, fail closed":      {excluded: probe, wantAnswers: true},
		"all excluded by health, fail open":        {failOpen: true, excluded: probe, wantFailOpen: true},
		"all excluded, fail open, owners not able": {failOpen: true, excluded: probe, states: map[string]balancer.State{"r1": draining}, down: []string{"r3"}, wantFailOpen: true, wantAnswers: true},
		"strict, all excluded, fail open":          {strict: true, failOpen: true, excluded: probe, wantFailOpen: true},
		"a stopped replica":                        {states: map[string]balancer.State{"r2": balancer.StateStopped}, stopped: []string{"r2"}, wantFailover: true},
		"a down replica":                           {down: []string{"r3"}, wantFailover: true},
		"query keys, owner drained":                {query: true, states: map[string]balancer.State{"r0": draining}, wantFailover: true},
	}
	for name, sc := range scenarios {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2"), startReplica(t, "r3")}
			p, addr := startProxyOpts(t, Options{FailOpen: sc.failOpen}, func(cfg *Config) {
				s := &cfg.ReplicaSets[0]
				s.Static, s.Replicas = nil, 4
				if sc.strict {
					s.Failover = balancer.FailoverStrict
				}
				if sc.attempts > 0 {
					s.Retries.Attempts = sc.attempts
				}
				if sc.query {
					s.Key = []balancer.KeySource{{Header: "X-Key"}, {Query: "key"}}
				}
			})
			gossip := gossipReplicas(reps...)
			p.SetReplicaSet("orders", gossip) // every replica joins the ring ready
			for i := range gossip {
				if st, ok := sc.states[gossip[i].Name]; ok {
					gossip[i].State = st
				}
				gossip[i].Down = slices.Contains(sc.down, gossip[i].Name)
			}
			p.SetReplicaSet("orders", gossip)
			for _, r := range sc.excluded {
				p.SetExcluded("orders", r, balancer.ReasonProbe, true)
			}
			for _, r := range reps {
				if slices.Contains(sc.stopped, r.name) {
					r.stop(t)
				}
			}
			p.Router("orders").Flush()
			inRotation := map[string]bool{}
			for _, m := range p.Router("orders").Table().Members() {
				inRotation[m.Name] = m.InRotation
			}

			cl := newClient(addr)
			var answers, failOpen, failover int
			for i := 0; i < 500; i++ {
				key := fmt.Sprint("key-", i)
				if sc.query {
					key = fmt.Sprintf("tenant é+/%d", i) // escaped in the query, hashed decoded
				}
				ex, err := p.Explain("orders", key)
				if err != nil {
					t.Fatal(err)
				}
				var r reply
				if sc.query {
					r = cl.do(t, "POST", "/ingest?key="+url.QueryEscape(key), "x")
				} else {
					r = cl.do(t, "POST", "/ingest", "x", "X-Key", key)
				}
				if ex.Pick == "" {
					answers++
					if ex.Answer == nil {
						t.Fatalf("key %q: no pick and no answer: %+v", key, ex)
					}
					body := r.errorJSON(t)
					if r.status != ex.Answer.Status || body["error"] != ex.Answer.Message || body["replica"] != ex.Owner {
						t.Fatalf("key %q: keyway answered %s; Explain says %d %q naming %q", key, r, ex.Answer.Status, ex.Answer.Message, ex.Owner)
					}
					continue
				}
				if r.status != 200 || r.body != ex.Pick {
					t.Fatalf("key %q: %s answered; Explain's pick is %s (%+v)", key, r, ex.Pick, ex)
				}
				if ex.Answer != nil {
					t.Fatalf("key %q: a pick and an answer: %+v", key, ex)
				}
				if ex.FailOpen {
					failOpen++
					if ex.Pick != ex.Owner || inRotation[ex.Pick] {
						t.Fatalf("key %q: fail open picked %s, owner %s", key, ex.Pick, ex.Owner)
					}
				} else if !inRotation[ex.Pick] {
					t.Fatalf("key %q: picked %s, out of rotation, without fail open", key, ex.Pick)
				}
				if ex.Pick != ex.Owner {
					failover++
				}
				checkAttempts(t, ex, sc)
			}
			if (answers > 0) != sc.wantAnswers || (failOpen > 0) != sc.wantFailOpen || (failover > 0) != sc.wantFailover {
				t.Fatalf("%d keyway answers, %d fail-open picks, %d failovers: not what the scenario is about", answers, failOpen, failover)
			}
			for _, r := range reps {
				if !inRotation[r.name] && !sc.failOpen && r.count.Load() > 0 {
					t.Errorf("%s, out of rotation, received %d requests", r.name, r.count.Load())
				}
			}
		})
	}
}

// checkAttempts checks that Candidates number the attempts 1..n in failover
// order, starting with Pick, within retries.attempts.
func checkAttempts(t *testing.T, ex Explanation, sc routeScenario) {
	t.Helper()
	max := 2
	if sc.attempts > 0 {
		max = sc.attempts
	}
	next := 1
	for _, c := range ex.Candidates {
		if c.Attempt == 0 {
			continue
		}
		if c.Attempt != next || (next == 1 && c.Name != ex.Pick) || (!c.InRotation && !ex.FailOpen) || c.Skipped != "" {
			t.Fatalf("key %q: candidate %+v out of order in %+v", ex.Key, c, ex.Candidates)
		}
		next++
	}
	if next == 1 || next-1 > max {
		t.Fatalf("key %q: %d attempts, want 1..%d: %+v", ex.Key, next-1, max, ex.Candidates)
	}
}

// The explanation of one key in detail: attempts, reasons for skipping,
// and what follows the last attempt.
func TestExplainCandidates(t *testing.T) {
	reps := []*testReplica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2"), startReplica(t, "r3")}
	p, _ := startProxy(t, func(cfg *Config) {
		cfg.ReplicaSets[0].Static, cfg.ReplicaSets[0].Replicas = nil, 4
		cfg.ReplicaSets[0].Retries.Attempts = 2
	})
	gossip := gossipReplicas(reps...)
	p.SetReplicaSet("orders", gossip)
	tbl := p.Router("orders").Table()
	key, h := "", uint64(0)
	for i := 0; ; i++ { // a key whose order is r1 first, r2 second
		key = fmt.Sprint("k", i)
		h = balancer.HashString(key)
		o := tbl.Order(h)
		if tbl.Replica(o[0]).Name == "r1" && tbl.Replica(o[1]).Name == "r2" {
			break
		}
	}
	order := func() []string {
		var out []string
		for _, s := range tbl.Order(h) {
			out = append(out, tbl.Replica(s).Name)
		}
		return out
	}()
	third, fourth := order[2], order[3]

	// r1 drains, r2 fails its probes: the key goes to the third and the
	// fourth of its order.
	gossip[1].State = balancer.StateDraining
	p.SetReplicaSet("orders", gossip)
	p.SetExcluded("orders", "r2", balancer.ReasonProbe, true)
	ex, err := p.Explain("orders", key)
	if err != nil {
		t.Fatal(err)
	}
	tbl = p.Router("orders").Table()
	addr := map[string]string{}
	for _, r := range reps {
		addr[r.name] = r.addr()
	}
	want := []Candidate{
		{Name: "r1", Addr: addr["r1"], State: balancer.StateDraining, Skipped: "state draining"},
		{Name: "r2", Addr: addr["r2"], State: balancer.StateReady, Skipped: "excluded: probe"},
		{Name: third, Addr: addr[third], State: balancer.StateReady, InRotation: true, Attempt: 1},
		{Name: fourth, Addr: addr[fourth], State: balancer.StateReady, InRotation: true, Attempt: 2},
	}
	if !slices.Equal(ex.Candidates, want) {
		t.Errorf("candidates\n%+v, want\n%+v", ex.Candidates, want)
	}
	if ex.Set != "orders" || ex.Key != key || ex.Hash != h || ex.Partition != tbl.Partition(h) || ex.Failover != balancer.FailoverNext ||
		ex.Owner != "r1" || ex.Pick != third || ex.FailOpen || ex.AllDown || ex.Answer != nil ||
		ex.Fingerprint != tbl.Fingerprint() || ex.Generation != tbl.Generation() {
		t.Errorf("explanation %+v", ex)
	}

	// Strict: keyway answers; the owner is skipped for its state, the
	// others for the policy.
	if _, err := p.Reload(func() Config {
		cfg := testConfig()
		cfg.ReplicaSets[0].Failover = balancer.FailoverStrict
		cfg.ReplicaSets[0].Replicas = 4
		return cfg
	}()); err != nil {
		t.Fatal(err)
	}
	ex, _ = p.Explain("orders", key)
	skipped := []string{"state draining", "excluded: probe", skipStrict, skipStrict}
	for i, c := range ex.Candidates {
		if c.Attempt != 0 || c.Skipped != skipped[i] {
			t.Errorf("strict: candidate %d = %+v, want skipped %q", i, c, skipped[i])
		}
	}
	if ex.Pick != "" || ex.Answer == nil || *ex.Answer != (Answer{503, msgStrict}) {
		t.Errorf("strict: pick %q, answer %+v", ex.Pick, ex.Answer)
	}

	if _, err := p.Explain("nope", key); !errors.Is(err, ErrUnknownSet) {
		t.Errorf("unknown set: %v", err)
	}
	if _, err := p.Explain("orders", ""); !errors.Is(err, ErrEmptyKey) {
		t.Errorf("empty key: %v", err)
	}
}
