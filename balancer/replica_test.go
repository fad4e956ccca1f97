package balancer

import (
	"encoding/json"
	"testing"
)

func TestStateText(t *testing.T) {
	t.Parallel()
	for s := StateUnknown; s <= StateFailed; s++ {
		b, err := s.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got State
		if err := got.UnmarshalText(b); err != nil || got != s {
			t.Fatalf("%v: round trip gave %v, %v", s, got, err)
		}
	}
	tests := map[string]struct {
		in   string
		want State
		err  bool
	}{
		"ready":      {"ready", StateReady, false},
		"recovering": {"recovering", StateRecovering, false},
		"unknown":    {"unknown", StateUnknown, false},
		"upper case": {"READY", StateUnknown, true},
		"empty":      {"", StateUnknown, true},
		"bogus":      {"up", StateUnknown, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseState(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("ParseState(%q) = %v, %v", tc.in, got, err)
			}
		})
	}
	if s := State(42).String(); s != "state(42)" {
		t.Fatalf("State(42) = %q", s)
	}
}

func TestReplicaJSON(t *testing.T) {
	t.Parallel()
	r := Replica{Name: "orders-0", Addr: "10.0.0.1:8080", State: StateDraining, Zone: "a", Boot: 1764400000123456789}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"name":"orders-0","addr":"10.0.0.1:8080","state":"draining","zone":"a","boot":1764400000123456789}`; string(b) != want {
		t.Fatalf("json %s, want %s", b, want)
	}
	if b, _ := json.Marshal(Replica{Name: "s-0", Addr: "a:1", State: StateReady}); string(b) != `{"name":"s-0","addr":"a:1","state":"ready"}` {
		t.Fatalf("json of a replica without an incarnation: %s", b)
	}
	var back Replica
	if err := json.Unmarshal(b, &back); err != nil || back != r {
		t.Fatalf("round trip %+v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"state":"sleepy"}`), &back); err == nil {
		t.Fatal("unknown state accepted")
	}
}

func TestReasonString(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		r    Reason
		want string
	}{
		"none":     {0, "none"},
		"probe":    {ReasonProbe, "probe"},
		"two":      {ReasonEjected | ReasonAdmin, "ejected+admin"},
		"all":      {ReasonProbe | ReasonEjected | ReasonRefused | ReasonFailed | ReasonAdmin, "probe+ejected+refused+failed+admin"},
		"unnamed":  {1 << 10, "0x400"},
		"mixed in": {ReasonRefused | 1<<10, "refused+0x400"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.r.String(); got != tc.want {
				t.Fatalf("%d.String() = %q, want %q", tc.r, got, tc.want)
			}
		})
	}
}

// A new incarnation of a replica (a restart at the same address) is not a
// membership change: the ring is not rebuilt, no partition moves, and the
// replica keeps its backend (the proxy retires the backend's connections
// itself). A new address still makes a new backend.
func TestBootChangeKeepsRingAndBackend(t *testing.T) {
	t.Parallel()
	rc := &recorder{}
	r, err := NewRouter(RouterConfig{Set: "orders", Hash: DefaultHashConfig()}, rc.hooks())
	if err != nil {
		t.Fatal(err)
	}
	reps := []Replica{
		{Name: "o-0", Addr: "a:1", State: StateReady, Boot: 10},
		{Name: "o-1", Addr: "a:2", State: StateReady, Boot: 20},
	}
	r.SetReplicas("gossip", reps)
	before := r.Table()
	b0 := before.Backend(0)
	reps[0].Boot = 11
	r.SetReplicas("gossip", reps)
	after := r.Table()
	if got := after.Replica(0).Boot; got != 11 {
		t.Fatalf("the table lists o-0 with boot %d, want 11", got)
	}
	if after.Backend(0) != b0 {
		t.Fatal("a boot change alone replaced o-0's backend")
	}
	rc.mu.Lock()
	last := rc.infos[len(rc.infos)-1]
	created, released := len(rc.created), len(rc.released)
	rc.mu.Unlock()
	if last.RingBuilt || last.Moved != 0 || last.Diverted != 0 {
		t.Fatalf("a boot change alone rebuilt the ring or moved keys: %+v", last)
	}
	if created != 2 || released != 0 {
		t.Fatalf("backends created %d, released %d; want 2 and 0", created, released)
	}
	// A restart on a new address is a new backend, still without moving
	// a partition.
	reps[0].Boot, reps[0].Addr = 12, "a:9"
	r.SetReplicas("gossip", reps)
	if r.Table().Backend(0) == b0 {
		t.Fatal("a new address kept the old backend")
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if last := rc.infos[len(rc.infos)-1]; last.RingBuilt || last.Moved != 0 {
		t.Fatalf("a new address rebuilt the ring: %+v", last)
	}
}
