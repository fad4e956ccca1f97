package membership

import (
	"sync"
	"testing"
	"time"

	"keyway/balancer"
)

// setStopSent records the SetStop commands Discovery sends.
type setStopSent struct {
	mu   sync.Mutex
	cmds map[string][]SetStop // by node
}

func (s *setStopSent) send(node string, msg []byte) error {
	if MessageKind(msg) != SetStopKind {
		return nil
	}
	c, err := DecodeSetStop(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmds == nil {
		s.cmds = map[string][]SetStop{}
	}
	s.cmds[node] = append(s.cmds[node], c)
	return nil
}

func (s *setStopSent) take() map[string][]SetStop {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cmds
	s.cmds = nil
	return c
}

// Agents whose SetStopped flag differs from what their set wants are told,
// once a second each, until they advertise it; other sets' agents and
// sets without a want are left alone.
func TestDiscoveryTellsAgentsTheirSetsStop(t *testing.T) {
	now := time.Unix(1000, 0)
	ft := &fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp", "users": "fp"}}
	d := NewDiscovery(ft, DiscoveryOptions{Now: func() time.Time { return now }})
	rec := &setStopSent{}
	d.send = rec.send
	stopped := func(m Member) Member { m.Meta.SetStopped = true; return m }
	d.SetMembers([]Member{
		rep("orders", "o-0", "a:1", balancer.StateReady, 1, StatusAlive),
		rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusAlive),
		rep("orders", "o-2", "a:3", balancer.StateReady, 1, StatusDead),
		stopped(rep("users", "u-0", "a:4", balancer.StateStopped, 1, StatusAlive)),
		stopped(rep("gone", "g-0", "a:5", balancer.StateStopped, 1, StatusAlive)),
	})
	d.tellSetStops()
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("commands without wants: %+v", got)
	}
	d.SetWants(map[string]SetWant{"orders": {Stop: true, Version: 7}, "users": {Stop: false, Version: 3}})
	d.tellSetStops()
	got := rec.take()
	if len(got) != 3 || len(got["o-0.b"]) != 1 || len(got["o-1.b"]) != 1 || len(got["u-0.b"]) != 1 {
		t.Fatalf("sent %+v; want one command each to o-0, o-1 (stop) and u-0 (start), none to the dead o-2 or the unwanted g-0", got)
	}
	if c := got["o-0.b"][0]; !c.Stop || c.Version != 7 || c.Set != "orders" {
		t.Fatalf("o-0 got %+v", c)
	}
	if c := got["u-0.b"][0]; c.Stop || c.Version != 3 {
		t.Fatalf("u-0 got %+v", c)
	}
	// Within a second nothing is sent again; after it, to those that still differ.
	now = now.Add(500 * time.Millisecond)
	d.tellSetStops()
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("resent within a second: %+v", got)
	}
	d.SetMembers([]Member{
		stopped(rep("orders", "o-0", "a:1", balancer.StateDraining, 1, StatusAlive)),
		rep("orders", "o-1", "a:2", balancer.StateReady, 1, StatusAlive),
		rep("users", "u-0", "a:4", balancer.StateStarting, 1, StatusAlive),
	})
	now = now.Add(600 * time.Millisecond)
	d.tellSetStops()
	if got := rec.take(); len(got) != 1 || len(got["o-1.b"]) != 1 {
		t.Fatalf("after a second: %+v; want o-1 alone", got)
	}
	// A new want goes out at once.
	d.SetWants(map[string]SetWant{"orders": {Stop: false, Version: 8}})
	d.tellSetStops()
	if got := rec.take(); len(got) != 1 || len(got["o-0.b"]) != 1 || got["o-0.b"][0].Stop {
		t.Fatalf("after a start: %+v; want a start to o-0", got)
	}
}
