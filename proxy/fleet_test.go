package proxy

import (
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/balancer"
)

// fleetEvents records FleetEvents.
type fleetEvents struct {
	mu  sync.Mutex
	evs []FleetEvent
}

func (f *fleetEvents) add(e FleetEvent) { f.mu.Lock(); f.evs = append(f.evs, e); f.mu.Unlock() }

func (f *fleetEvents) kinds() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.evs {
		out = append(out, e.Kind+":"+e.Replica+e.Peer)
	}
	return out
}

func excludedBy(p *Proxy, replica string) balancer.Reason {
	for _, m := range p.Router("orders").Table().Members() {
		if m.Name == replica {
			return m.Excluded
		}
	}
	return 0
}

func TestFleetVotesVetoesAndDigests(t *testing.T) {
	reps := []*testReplica{startReplica(t, "orders-0"), startReplica(t, "orders-1"), startReplica(t, "orders-2"), startReplica(t, "orders-3")}
	ev1, ev2 := &fleetEvents{}, &fleetEvents{}
	p1, _ := startProxyOpts(t, Options{FleetEvents: ev1.add}, nil, reps...)
	p2, addr2 := startProxyOpts(t, Options{FleetEvents: ev2.add}, nil, reps...)
	view := func(node string, p *Proxy, now time.Time) balancer.FleetPeer {
		return balancer.FleetPeer{ID: node, Sets: p.FleetSets(now)}
	}
	digest := func(p *Proxy) string { return p.Router("orders").Table().Digest() }
	if digest(p1) != digest(p2) {
		t.Fatal("two proxies with the same replicas have different digests")
	}

	// P1 ejects orders-1 on its own evidence: P2, idle, follows.
	p1.SetExcluded("orders", "orders-1", balancer.ReasonEjected, true)
	now := time.Now()
	v1 := view("p1", p1, now)
	if len(v1.Sets) != 1 || len(v1.Sets[0].Votes) != 1 || v1.Sets[0].Votes[0].Replica != "orders-1" {
		t.Fatalf("P1's view: %+v", v1)
	}
	p2.SetFleet([]balancer.FleetPeer{v1}, now)
	if excludedBy(p2, "orders-1") != balancer.ReasonFleet {
		t.Fatalf("P2 holds orders-1 out for %v, want fleet", excludedBy(p2, "orders-1"))
	}
	if digest(p1) != digest(p2) {
		t.Fatal("P2 follows P1's vote but their digests differ")
	}
	for k := range 200 {
		key := "k" + string(rune('a'+k%26)) + string(rune('a'+k/26))
		e1, _ := p1.Explain("orders", key)
		e2, _ := p2.Explain("orders", key)
		if e1.Pick != e2.Pick {
			t.Fatalf("key %s: P1 picks %s, P2 %s", key, e1.Pick, e2.Pick)
		}
	}

	// P2 just exchanged with orders-2 successfully: when P1 votes against
	// it too, P2 vetoes, and neither proxy's fleet verdict holds it out.
	key2 := keyOwnedBy(t, p2, "orders-2")
	if r := newClient(addr2).do(t, "GET", "/x", "", "X-Key", key2); r.status != 200 || r.body != "orders-2" {
		t.Fatalf("request to orders-2 through P2: %v", r)
	}
	p1.SetExcluded("orders", "orders-2", balancer.ReasonRefused, true)
	now = time.Now()
	v1 = view("p1", p1, now)
	p2.SetFleet([]balancer.FleetPeer{v1}, now)
	v2 := view("p2", p2, now)
	if !slices.Equal(v2.Sets[0].Vetoes, []string{"orders-2"}) {
		t.Fatalf("P2's vetoes %v, want [orders-2]", v2.Sets[0].Vetoes)
	}
	p1.SetFleet([]balancer.FleetPeer{v2}, now)
	if got := excludedBy(p2, "orders-2"); got != 0 {
		t.Fatalf("P2 holds the vetoed orders-2 out: %v", got)
	}
	if got := excludedBy(p1, "orders-2"); got != balancer.ReasonRefused {
		t.Fatalf("P1 holds orders-2 out for %v, want its own refused hold only", got)
	}
	// They disagree now (P1 diverts orders-2's keys, P2 does not), and the
	// disagreement is reported once it outlasts the bound.
	st := p1.FleetStatus()
	if len(st) != 1 || len(st[0].Peers) != 1 || st[0].Peers[0].Agrees {
		t.Fatalf("P1's fleet status: %+v", st)
	}
	later := now.Add(DefaultFleetConfig().DisagreementBound + time.Second)
	p1.SetFleet([]balancer.FleetPeer{v2}, later)
	if !slices.Contains(ev1.kinds(), "fleet_disagreement:p2") {
		t.Fatalf("P1's events %v, want a fleet_disagreement with p2", ev1.kinds())
	}

	// A vote no second proxy backs lapses after solo_vote_max.
	p2.SetFleet([]balancer.FleetPeer{view("p1", p1, later)}, later.Add(DefaultFleetConfig().SoloVoteMax))
	if got := excludedBy(p2, "orders-1"); got != 0 {
		t.Fatalf("P2 still holds orders-1 out after the solo vote lapsed: %v", got)
	}
	if k := ev2.kinds(); !slices.Contains(k, "fleet_hold:orders-1") || !slices.Contains(k, "fleet_release:orders-1") {
		t.Fatalf("P2's events %v", k)
	}

	// P1's ejection ends: its vote is gone from its view, and P2 (which
	// held orders-1 again on a fresh view) lets it back at once.
	p2.SetFleet([]balancer.FleetPeer{view("p1", p1, time.Now())}, time.Now())
	p1.SetExcluded("orders", "orders-1", balancer.ReasonEjected, false)
	p1.Router("orders").Flush()
	p2.SetFleet([]balancer.FleetPeer{view("p1", p1, time.Now())}, time.Now())
	if got := excludedBy(p2, "orders-1"); got != 0 {
		t.Fatalf("P2 holds orders-1 out after P1's ejection ended: %v", got)
	}
}

func TestFleetShareOff(t *testing.T) {
	reps := []*testReplica{startReplica(t, "orders-0"), startReplica(t, "orders-1")}
	p1, _ := startProxy(t, nil, reps...)
	p2, _ := startProxy(t, func(c *Config) { c.Fleet.Share = false }, reps...)
	p1.SetExcluded("orders", "orders-1", balancer.ReasonEjected, true)
	now := time.Now()
	p2.SetFleet([]balancer.FleetPeer{{ID: "p1", Sets: p1.FleetSets(now)}}, now)
	if got := excludedBy(p2, "orders-1"); got != 0 {
		t.Fatalf("with fleet.share false P2 follows P1's vote: %v", got)
	}
	if v := p2.FleetSets(now); len(v) != 1 || v[0].Digest == "" || len(v[0].Votes) != 0 {
		t.Fatalf("with fleet.share false P2's view: %+v", v)
	}
}

func TestFleetIDRules(t *testing.T) {
	cases := map[string]struct {
		id   string
		want string // "" means valid
	}{
		"default":       {id: ""},
		"host and port": {id: "edge-1.example.com:8080"},
		"upper case":    {id: "EDGE_1"},
		"128 bytes":     {id: strings.Repeat("a", 128)},
		"129 bytes":     {id: strings.Repeat("a", 129), want: `id: "` + strings.Repeat("a", 129) + `" must be 1 to 128 bytes long, got 129; leave it empty for <host name>:<port>, or write e.g. edge-1`},
		"space":         {id: "edge 1", want: `id: "edge 1" has ' ' at byte 4: use letters, digits, '.', '-', '_' and ':'; leave it empty`},
		"slash":         {id: "edge/1", want: `has '/' at byte 4`},
		"non-ASCII":     {id: "édge", want: `has a non-ASCII byte at byte 0`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := DefaultFleetConfig()
			c.ID = tc.id
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestProxyID(t *testing.T) {
	ln := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 41277}
	cases := map[string]struct {
		id, host string
		listen   net.Addr
		want     string // the ID, or with err a part of the error
		err      bool
	}{
		"configured":        {id: "edge-1", host: "h", listen: ln, want: "edge-1"},
		"default":           {host: "web-3", listen: ln, want: "web-3:41277"},
		"default, any addr": {host: "web-3", listen: &net.TCPAddr{Port: 8080}, want: "web-3:8080"},
		"no host name":      {listen: ln, err: true, want: "fleet.id: empty, and the default <host name>:<port> is unknown"},
		"odd host name":     {host: "web 3", listen: ln, err: true, want: `fleet.id: empty, and the default <host name>:<port> "web 3:41277" has ' ' at byte 3`},
		"not listening":     {host: "web-3", err: true, want: "set fleet.id"},
		"invalid":           {id: "a b", host: "h", listen: ln, err: true, want: `fleet.id: "a b" has ' '`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := DefaultFleetConfig()
			c.ID = tc.id
			got, err := c.ProxyID(tc.host, tc.listen)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("ProxyID = %q, %v; want an error with %q", got, err, tc.want)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ProxyID = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
