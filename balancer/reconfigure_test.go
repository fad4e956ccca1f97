package balancer

import (
	"errors"
	"slices"
	"testing"
)

func TestRouterReconfigure(t *testing.T) {
	rc := &recorder{}
	r := newTestRouter(t, RouterConfig{Failover: FailoverNext, Candidates: 2}, rc)
	r.SetReplicas("static", readyReplicas(4))
	r.SetExcluded("orders-001", ReasonProbe, true)
	before := r.Table()
	hashes := make([]uint64, 2000)
	for i := range hashes {
		hashes[i] = HashKey([]byte{byte(i), byte(i >> 8), 'k'})
	}
	created := len(rc.created)

	// Failover and candidates: same ring, same backends, exclusions kept.
	if err := r.Reconfigure(RouterConfig{Set: "orders", Hash: DefaultHashConfig(), Failover: FailoverStrict, Candidates: 3}, false); err != nil {
		t.Fatal(err)
	}
	after := r.Table()
	info := rc.last(t)
	if info.Cause != "config" || info.RingBuilt || info.Moved != 0 {
		t.Fatalf("failover change: info %+v, want cause config and no ring rebuild", info)
	}
	if after.Failover() != FailoverStrict || r.Config().Candidates != 3 {
		t.Fatalf("failover %v candidates %d, want strict 3", after.Failover(), r.Config().Candidates)
	}
	if len(rc.created) != created || len(rc.released) != 0 {
		t.Fatalf("backends replaced without renew: %d created, %d released", len(rc.created)-created, len(rc.released))
	}
	if m, _ := memberOf(after, "orders-001"); m.InRotation || m.Excluded&ReasonProbe == 0 {
		t.Fatalf("exclusion lost: %+v", m)
	}
	if got, want := owners(after, hashes), owners(before, hashes); !slices.Equal(got, want) {
		t.Fatal("owners changed without a hash change")
	}

	// Renew: every ring member gets a new backend, the old ones are released.
	if err := r.Reconfigure(RouterConfig{Set: "orders", Hash: DefaultHashConfig(), Failover: FailoverStrict, Candidates: 3}, true); err != nil {
		t.Fatal(err)
	}
	if got := len(rc.created) - created; got != 4 {
		t.Fatalf("renew created %d backends, want 4", got)
	}
	if len(rc.released) != 4 {
		t.Fatalf("renew released %d backends, want 4", len(rc.released))
	}
	t2 := r.Table()
	for s := range t2.Len() {
		if t2.Backend(s).id <= created {
			t.Fatalf("slot %d still has an old backend", s)
		}
	}

	// A new partition count rebuilds the ring: every partition counts as moved.
	h := DefaultHashConfig()
	h.Partitions = 271
	if err := r.Reconfigure(RouterConfig{Set: "orders", Hash: h, Failover: FailoverStrict, Candidates: 3}, false); err != nil {
		t.Fatal(err)
	}
	info = rc.last(t)
	if !info.RingBuilt || info.Moved != 271 || info.Diverted != 271 || len(info.Joined)+len(info.Left) != 0 {
		t.Fatalf("partition change: info %+v, want ring rebuilt, 271 moved and diverted, nobody joined or left", info)
	}
	if r.Table().Partitions() != 271 {
		t.Fatalf("table has %d partitions, want 271", r.Table().Partitions())
	}

	// A new load factor keeps the partition count: only changed owners count.
	h.Load = 3
	if err := r.Reconfigure(RouterConfig{Set: "orders", Hash: h, Failover: FailoverStrict, Candidates: 3}, false); err != nil {
		t.Fatal(err)
	}
	if info = rc.last(t); !info.RingBuilt || info.Moved >= 271 {
		t.Fatalf("load change: info %+v, want a ring rebuild moving some partitions", info)
	}

	// Refused: a new name, bad candidates, a bad hash. Nothing changes.
	gen := r.Table().Generation()
	for _, bad := range []RouterConfig{
		{Set: "payments", Hash: h},
		{Set: "orders", Hash: h, Candidates: 99},
		{Set: "orders", Hash: HashConfig{Partitions: -1, ReplicationFactor: 100, Load: 1.25}},
	} {
		if err := r.Reconfigure(bad, false); !errors.Is(err, ErrBadRouterConfig) {
			t.Errorf("Reconfigure(%+v) = %v, want ErrBadRouterConfig", bad, err)
		}
	}
	if r.Table().Generation() != gen {
		t.Fatal("a refused Reconfigure published a table")
	}
}
