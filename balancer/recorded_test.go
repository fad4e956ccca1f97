package balancer

import (
	"strings"
	"testing"
)

func TestParseFingerprint(t *testing.T) {
	for _, c := range []HashConfig{DefaultHashConfig(), {Partitions: 101, ReplicationFactor: 7, Load: 2.5}} {
		got, err := ParseFingerprint(c.Fingerprint())
		if err != nil || got != c {
			t.Errorf("ParseFingerprint(%s) = %+v, %v; want %+v", c.Fingerprint(), got, err, c)
		}
	}
	for _, bad := range []string{"", "v2-xxh64-cons1.1-p7919-r100-l1.25", "v1-xxh64-cons1.1-p0-r100-l1.25", "v1-xxh64-cons1.1-p7919-r100-l1.25x"} {
		if _, err := ParseFingerprint(bad); err == nil || !strings.Contains(err.Error(), "fingerprint") {
			t.Errorf("ParseFingerprint(%q): err %v, want one naming the fingerprint", bad, err)
		}
	}
}

// What a ring_rebuild or rotation_change event records (the fingerprint,
// the ring members and those in rotation) places every partition as the
// Router's table did at that moment: owner and pick, with failover next
// and strict, whoever is out.
func TestPlaceRecorded(t *testing.T) {
	for _, failover := range []Failover{FailoverNext, FailoverStrict} {
		r := newTestRouter(t, RouterConfig{Failover: failover}, nil)
		reps := readyReplicas(5)
		r.SetReplicas("gossip", reps)
		r.SetExcluded(reps[1].Name, ReasonEjected, true)
		r.SetReplicas("gossip", withState(reps, reps[3].Name, StateDraining))
		r.Flush()
		tbl := r.Table()
		var members, rotation []string
		for _, m := range tbl.Members() {
			if m.Slot >= 0 {
				members = append(members, m.Name)
				if m.InRotation {
					rotation = append(rotation, m.Name)
				}
			}
		}
		if len(rotation) != 3 {
			t.Fatalf("rotation %v, want 3 of 5", rotation)
		}
		for p := 0; p < tbl.Partitions(); p += 7 {
			got, err := PlaceRecorded(tbl.Fingerprint(), members, rotation, failover, p)
			if err != nil {
				t.Fatal(err)
			}
			want := Placed{Owner: tbl.ring.names[tbl.ring.owner[p]], Pick: tbl.target(p)}
			if got != want {
				t.Fatalf("%s, partition %d: %+v, the table's %+v", failover, p, got, want)
			}
		}
	}
	if _, err := PlaceRecorded(DefaultHashConfig().Fingerprint(), []string{"a"}, nil, FailoverNext, 7919); err == nil {
		t.Error("partition 7919 of 7919: no error")
	}
	if got, err := PlaceRecorded(DefaultHashConfig().Fingerprint(), nil, nil, FailoverNext, 3); err != nil || got != (Placed{}) {
		t.Errorf("an empty ring: %+v, %v", got, err)
	}
}
