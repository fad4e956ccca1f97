package agent

import (
	"testing"

	"keyway/membership"
)

// Only an alive member whose metadata says role proxy may send admin drain
// commands.
func TestCommandSender(t *testing.T) {
	member := func(node string, role membership.Role, status membership.Status) membership.Member {
		return membership.Member{Node: node, Meta: membership.Meta{Role: role}, Status: status}
	}
	members := []membership.Member{
		{Node: "orders-0.a", Meta: membership.Meta{Role: membership.RoleReplica}, Status: membership.StatusAlive, Self: true},
		member("proxy-1.b", membership.RoleProxy, membership.StatusAlive),
		member("proxy-2.c", membership.RoleProxy, membership.StatusDead),
		member("proxy-3.d", membership.RoleProxy, membership.StatusLeft),
		member("orders-1.e", membership.RoleReplica, membership.StatusAlive),
	}
	cases := map[string]string{
		"proxy-1.b":  "",
		"proxy-2.c":  rejectUnknownSender, // dead
		"proxy-3.d":  rejectUnknownSender, // left
		"orders-1.e": rejectNotProxy,
		"orders-0.a": rejectNotProxy, // itself
		"stranger.f": rejectUnknownSender,
		"":           rejectUnknownSender,
	}
	for from, want := range cases {
		if got := commandSender(members, from); got != want {
			t.Errorf("commandSender(%q) = %q, want %q", from, got, want)
		}
	}
}
