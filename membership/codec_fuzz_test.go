package membership

import (
	"sync"
	"testing"
	"time"

	"keyway/balancer"
)

// FuzzDecodeMeta feeds arbitrary bytes to the gossip metadata decoder: a
// member's metadata comes off the network, from any member that holds
// the gossip key (or from anyone without one). It must never panic, and
// what it accepts must encode again to a meta that decodes the same.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{
		{Role: RoleProxy, Addr: "127.0.0.1:8080", Boot: 1, Fingerprint: "orders=abc,events=def", ID: "host-a:8080"},
		{Role: RoleProxy, Addr: "127.0.0.1:8080", Boot: 1, Fingerprint: "orders=abc"}, // an older proxy: no id
		{Role: RoleReplica, Set: "orders", Replica: "o-0", Addr: "10.0.0.1:9000", State: balancer.StateDraining, Weight: 3, Zone: "a", Boot: -5, Remove: true, Held: true, SetStopped: true, Supervised: true, SupervisionKnown: true},
	} {
		b, err := m.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		if m.ID == "" {
			b = append(b, 0) // an empty id, before the extra fields
		}
		f.Add(append(b, 0xff, 0x00)) // a later revision's extra fields
	}
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0, 0, 0, 0})
	f.Add([]byte{2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 2, 2, 0, 0, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			if m != (Meta{}) {
				t.Fatalf("error %v with a non-zero meta %+v", err, m)
			}
			return
		}
		enc, err := m.Encode()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		again, err := DecodeMeta(enc)
		if err != nil || again != m {
			t.Fatalf("re-decode: %+v, %v; want %+v", again, err, m)
		}
	})
}

// FuzzMetaRoundTrip builds metas from fuzzed fields: every meta that
// encodes decodes to itself, and one that does not encode is over a limit.
func FuzzMetaRoundTrip(f *testing.F) {
	f.Add(uint8(1), uint8(0), uint16(0), int64(0), "", "", "127.0.0.1:1", "", "", "", uint8(0))
	f.Add(uint8(1), uint8(0), uint16(0), int64(1), "", "", "127.0.0.1:1", "", "orders:0123abcd", "host-a:8080", uint8(0))
	f.Add(uint8(2), uint8(2), uint16(7), int64(-1), "orders", "o-0", "10.0.0.1:9000", "zone-a", "orders=ff", "", uint8(31))
	f.Fuzz(func(t *testing.T, role, state uint8, weight uint16, boot int64, set, replica, addr, zone, fp, id string, flags uint8) {
		m := Meta{
			Role: RoleProxy + Role(role%2), State: balancer.State(state % (uint8(balancer.StateFailed) + 1)),
			Weight: weight, Boot: boot, Set: set, Replica: replica, Addr: addr, Zone: zone, Fingerprint: fp, ID: id,
			Remove: flags&1 != 0, Held: flags&2 != 0, SetStopped: flags&4 != 0, Supervised: flags&8 != 0, SupervisionKnown: flags&16 != 0,
		}
		enc, err := m.Encode()
		if err != nil {
			long := false
			for _, s := range []string{set, replica, addr, zone, fp, id} {
				long = long || len(s) > 255
			}
			if !long && 6+10+6+len(set)+len(replica)+len(addr)+len(zone)+len(fp)+len(id) <= MetaMaxSize {
				t.Fatalf("%+v within limits does not encode: %v", m, err)
			}
			return
		}
		if len(enc) > MetaMaxSize {
			t.Fatalf("encoded %d bytes, over %d", len(enc), MetaMaxSize)
		}
		got, err := DecodeMeta(enc)
		if err != nil || got != m {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
	})
}

// fleetSink is a FleetTarget that keeps the last views handed over.
type fleetSink struct {
	mu    sync.Mutex
	peers []balancer.FleetPeer
}

func (s *fleetSink) FleetSets(time.Time) []balancer.FleetSet { return nil }
func (s *fleetSink) SetFleet(peers []balancer.FleetPeer, _ time.Time) {
	s.mu.Lock()
	s.peers = peers
	s.mu.Unlock()
}

// FuzzUserMessage feeds arbitrary bytes to every user-message decoder and
// to the handlers gossip calls with them (Fleet, Discovery; package
// runstate fuzzes the run-time state's): a user message comes from any
// cluster member. None may panic; a decoder that accepts a message
// accepts its own encoding of it too.
func FuzzUserMessage(f *testing.F) {
	for _, b := range [][]byte{
		AdminDrain{Set: "orders", Replica: "o-0", Boot: 3, Drain: true, By: "p1"}.Encode(),
		Repair{Set: "orders", By: "p1"}.Encode(),
		SetStop{Set: "orders", Stop: true, Version: 2, By: "p1"}.Encode(),
		DrainReport{Set: "orders", Replica: "o-0", Boot: 3, DrainingSeen: true, Inflight: 2}.Encode(),
		RestartReplica{Set: "orders", Replica: "o-0", Boot: 3, By: "p1"}.Encode(),
		[]byte(`{"kind":"proxy_state","node":"p2","seq":1,"sets":[{"set":"orders","digest":"d","votes":[{"replica":"o-0","reason":"refused","age_ms":-9223372036854775808}],"vetoes":["o-1"],"inflight":{"o-0":1}}]}`),
		[]byte(`{"kind":"proxy_state","node":"p2.b","id":"edge-2:8080","boot":-1,"seq":18446744073709551615,"sets":[]}`),
		[]byte(`{"kind":1}`),
		[]byte(`[]`),
		[]byte("\xff"),
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := DecodeAdminDrain(b); err == nil {
			if again, err := DecodeAdminDrain(c.Encode()); err != nil || again != c {
				t.Fatalf("admin drain %+v re-decodes as %+v, %v", c, again, err)
			}
		}
		if r, err := DecodeRepair(b); err == nil {
			if again, err := DecodeRepair(r.Encode()); err != nil || again != r {
				t.Fatalf("repair %+v re-decodes as %+v, %v", r, again, err)
			}
		}
		if s, err := DecodeSetStop(b); err == nil {
			if again, err := DecodeSetStop(s.Encode()); err != nil || again != s {
				t.Fatalf("set stop %+v re-decodes as %+v, %v", s, again, err)
			}
		}
		if r, err := DecodeDrainReport(b); err == nil {
			if again, err := DecodeDrainReport(r.Encode()); err != nil || again != r {
				t.Fatalf("drain report %+v re-decodes as %+v, %v", r, again, err)
			}
		}
		if r, err := DecodeRestartReplica(b); err == nil {
			if again, err := DecodeRestartReplica(r.Encode()); err != nil || again != r {
				t.Fatalf("restart %+v re-decodes as %+v, %v", r, again, err)
			}
		}
		_, _ = DecodeProcessEvent(b)
		_ = MessageKind(b)

		fl := NewFleet(&fleetSink{}, FleetOptions{})
		fl.HandleMessage("p2", b)
		fl.HandleMessage("p2", b) // the same view again is stale, not a new peer
		_ = fl.Peers()

		d := NewDiscovery(&fakeTarget{sets: map[string][]balancer.Replica{}, fps: map[string]string{"orders": "fp"}}, DiscoveryOptions{})
		d.HandleMessage("p2", b)
	})
}
