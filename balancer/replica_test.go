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
	r := Replica{Name: "orders-0", Addr: "10.0.0.1:8080", State: StateDraining, Zone: "a"}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"name":"orders-0","addr":"10.0.0.1:8080","state":"draining","zone":"a"}`; string(b) != want {
		t.Fatalf("json %s, want %s", b, want)
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
