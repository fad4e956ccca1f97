package membership

import (
	"bytes"
	"encoding/hex"
	"testing"

	"keyway/balancer"
)

// An agent's supervision travels in two bits of the flags byte. Metadata
// of an agent of the previous version (neither bit) decodes as "not
// known"; a decoder of the previous version, which reads only the bits
// it knows, decodes a new agent's metadata as it did before: the layout
// after the flags byte is unchanged, and the new bits are the only
// difference.
func TestMetaSupervisionFlags(t *testing.T) {
	base := Meta{Role: RoleReplica, Set: "orders", Replica: "orders-0", Addr: "127.0.0.1:9001",
		State: balancer.StateReady, Boot: 42, Held: true}
	for name, tc := range map[string]struct {
		supervised, known bool
		bits              byte
	}{
		"supervised":   {true, true, 0x18},
		"unsupervised": {false, true, 0x10},
		"older agent":  {false, false, 0},
	} {
		t.Run(name, func(t *testing.T) {
			m := base
			m.Supervised, m.SupervisionKnown = tc.supervised, tc.known
			b, err := m.Encode()
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeMeta(b)
			if err != nil || got != m {
				t.Fatalf("round trip: %+v, %v; want %+v", got, err, m)
			}
			old, _ := base.Encode()
			if len(b) != len(old) || b[3] != old[3]|tc.bits || !bytes.Equal(b[:3], old[:3]) || !bytes.Equal(b[4:], old[4:]) {
				t.Fatalf("encoding %x, previous %x: want only bits %#x of the flags byte added", b, old, tc.bits)
			}
			// The previous version's decoder: flags remove, held, set
			// stopped; the other bits ignored.
			if prev := b[3] & 0x07; prev != old[3] {
				t.Fatalf("the previous decoder's flags %#x, want %#x", prev, old[3])
			}
		})
	}

	// Frozen bytes of the previous version's encoder (a held, ready
	// replica; see base): no supervision bits, so not known.
	prev, _ := hex.DecodeString("01020202000054066f7264657273086f72646572732d300e3132372e302e302e313a393030310000")
	got, err := DecodeMeta(prev)
	if err != nil {
		t.Fatal(err)
	}
	if got != base || got.Supervised || got.SupervisionKnown {
		t.Fatalf("previous version's metadata: %+v, %v; want %+v, supervision not known", got, err, base)
	}

	// Bits of a later revision are ignored, not refused.
	later := append([]byte(nil), prev...)
	later[3] |= 0xe0
	if got, err := DecodeMeta(later); err != nil || got != base {
		t.Fatalf("unknown flag bits: %+v, %v; want %+v", got, err, base)
	}
}
