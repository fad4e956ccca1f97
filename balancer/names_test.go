package balancer

import (
	"strings"
	"testing"
)

func TestValidSetName(t *testing.T) {
	cases := map[string]bool{
		"orders":                true,
		"a":                     true,
		"orders_v2-eu":          true,
		"0":                     true,
		strings.Repeat("a", 63): true,
		strings.Repeat("a", 64): false,
		"":                      false,
		"Orders":                false,
		"orders.eu":             false,
		"orders eu":             false,
		"ordérs":                false,
		"orders/":               false,
	}
	for name, want := range cases {
		if got := ValidSetName(name); got != want {
			t.Errorf("ValidSetName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestValidReplicaName(t *testing.T) {
	cases := map[string]bool{
		"orders-0":               true,
		"Orders.0:pod/x":         true,
		"ordérs":                 true,
		strings.Repeat("a", 128): true,
		strings.Repeat("a", 129): false,
		"":                       false,
		"orders 0":               false,
		"orders\t0":              false,
		"orders-0\n":             false,
		"\rorders":               false,
	}
	for name, want := range cases {
		if got := ValidReplicaName(name); got != want {
			t.Errorf("ValidReplicaName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestMemberOutReason(t *testing.T) {
	ready := Replica{Name: "r0", State: StateReady}
	cases := map[string]struct {
		m    Member
		want string
	}{
		"in rotation":  {Member{Replica: ready, Slot: 0, InRotation: true}, ""},
		"never ready":  {Member{Replica: Replica{Name: "r0", State: StateStarting}, Slot: -1}, "not on the ring (never ready); state starting"},
		"draining":     {Member{Replica: Replica{Name: "r0", State: StateDraining}, Slot: 2}, "state draining"},
		"down":         {Member{Replica: Replica{Name: "r0", State: StateReady, Down: true}, Slot: 1}, "down (gossip)"},
		"excluded":     {Member{Replica: ready, Slot: 1, Excluded: ReasonProbe | ReasonRefused}, "excluded: probe+refused"},
		"everything":   {Member{Replica: Replica{Name: "r0", State: StateStopped, Down: true}, Slot: 0, Excluded: ReasonAdmin}, "state stopped; down (gossip); excluded: admin"},
		"no known why": {Member{Replica: ready, Slot: 0}, "out of rotation"},
		"off the ring": {Member{Replica: ready, Slot: -1}, "not on the ring (never ready)"},
	}
	for name, c := range cases {
		if got := c.m.OutReason(); got != c.want {
			t.Errorf("%s: OutReason() = %q, want %q", name, got, c.want)
		}
	}
}
