package membership_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/internal/testnet"
	"keyway/membership"
)

// aliveNode reports whether the member named node is alive, and returns
// it.
func aliveNode(ms []membership.Member, node string) (membership.Member, bool) {
	for _, m := range ms {
		if m.Node == node {
			return m, m.Status == membership.StatusAlive
		}
	}
	return membership.Member{}, false
}

// MoveTo moves a running proxy's gossip to another port: a new member
// under a new node name, with the same metadata, takes the old one's
// place; the others see the new one alive and the old one leave (a leave,
// not a death); the node itself lists only the new one, and messages
// reach it there.
func TestMoveTo(t *testing.T) {
	meta := membership.Meta{Role: membership.RoleProxy, ID: "edge-a", Addr: "admin-a"}
	a := startNode(t, testConfig(), meta, nil)
	cfg := testConfig()
	cfg.Join = []string{a.GossipAddr()}
	b := startNode(t, cfg, replicaMeta("b"), nil)
	oldName, oldAddr := a.Name(), a.GossipAddr()
	b.rec.waitFor(t, "b to see a", 10*time.Second, func(ms []membership.Member) bool { _, ok := aliveNode(ms, oldName); return ok })

	port := testnet.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.MoveTo(ctx, port, 0); err != nil {
		t.Fatal(err)
	}
	newName := a.Name()
	if newName == oldName || a.GossipAddr() != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("after the move: node %s at %s (before: %s at %s), want a new name at port %d", newName, a.GossipAddr(), oldName, oldAddr, port)
	}
	b.rec.waitFor(t, "b to see the new member alive and the old one left", 10*time.Second, func(ms []membership.Member) bool {
		var left, now bool
		for _, m := range ms {
			switch m.Node {
			case oldName:
				if m.Status == membership.StatusDead {
					t.Fatalf("the moved member was recorded dead, not left: %+v", m)
				}
				left = m.Status == membership.StatusLeft
			case newName:
				now = m.Status == membership.StatusAlive && m.ID() == "edge-a" && m.Meta.Addr == "admin-a" && m.Meta.State != balancer.StateStopped
			}
		}
		return left && now
	})
	selfs := 0
	for _, m := range a.Members() {
		if m.Node == oldName {
			t.Fatalf("a still lists its old member: %+v", m)
		}
		if m.Self {
			selfs++
			if m.Node != newName {
				t.Fatalf("a's self is %s, want %s", m.Node, newName)
			}
		}
	}
	if selfs != 1 {
		t.Fatalf("a lists %d selves", selfs)
	}
	// Gossip still works both ways through the new member.
	if err := a.UpdateMeta(func(m *membership.Meta) { m.Addr = "admin-a2" }, time.Second); err != nil {
		t.Fatal(err)
	}
	b.rec.waitFor(t, "b to see a's new metadata", 10*time.Second, func(ms []membership.Member) bool {
		m, ok := aliveNode(ms, newName)
		return ok && m.Meta.Addr == "admin-a2"
	})
}
