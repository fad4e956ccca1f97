package membership

import (
	"errors"
	"testing"

	"keyway/balancer"
)

func TestRepairMessage(t *testing.T) {
	r, err := DecodeRepair(Repair{Set: "orders", By: "p1"}.Encode())
	if err != nil || r.Set != "orders" || r.By != "p1" || r.Kind != RepairKind {
		t.Fatalf("round trip: %+v %v", r, err)
	}
	if _, err := DecodeRepair(AdminDrain{Set: "orders"}.Encode()); err == nil {
		t.Fatal("an admin drain decoded as a repair")
	}
}

// Repair goes to the newest alive incarnation of each replica of the set
// and to the other alive proxies, names the failed ones, and reaches the
// receiving proxy's OnRepair.
func TestDiscoveryRepair(t *testing.T) {
	d, _, rec := drainFixture()
	failed := rep("orders", "o-1", "a:2", balancer.StateFailed, 2, StatusAlive)
	d.SetMembers(append([]Member{
		rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive),
		rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusDead),
		failed,
		rep("other", "x-0", "a:9", balancer.StateReady, 1, StatusAlive),
	}, proxies...))
	res, err := d.Repair("orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Agents) != 2 || len(res.Failed) != 1 || res.Failed[0] != failed.Node || res.Proxies != 1 {
		t.Fatalf("repair reached %+v", res)
	}
	rec.take()
	if _, err := d.Repair("nobody"); !errors.Is(err, ErrNotAdvertised) {
		t.Fatalf("repair of a set without replicas: %v", err)
	}
	var got [2]string
	o := NewDiscovery(nil, DiscoveryOptions{OnRepair: func(set, by string) { got = [2]string{set, by} }})
	o.HandleMessage("p1", Repair{Set: "orders", By: "p1"}.Encode())
	if got != [2]string{"orders", "p1"} {
		t.Fatalf("OnRepair got %v", got)
	}
}
