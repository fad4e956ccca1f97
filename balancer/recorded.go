package balancer

import (
	"fmt"
	"slices"
)

// ParseFingerprint reads a ring shape back from its
// [HashConfig.Fingerprint], as the audit trail records it. A fingerprint
// of another hasher or ring algorithm version is an error: its placement
// is not this code's.
func ParseFingerprint(fp string) (HashConfig, error) {
	var c HashConfig
	if _, err := fmt.Sscanf(fp, "v1-xxh64-cons1.1-p%d-r%d-l%g", &c.Partitions, &c.ReplicationFactor, &c.Load); err != nil || c.Fingerprint() != fp {
		return HashConfig{}, fmt.Errorf("ring fingerprint %q: not one of this version's (%s)", fp, DefaultHashConfig().Fingerprint())
	}
	if err := c.Validate(); err != nil {
		return HashConfig{}, fmt.Errorf("ring fingerprint %q: %w", fp, err)
	}
	return c, nil
}

// Placed is where one partition's keys went at a moment the audit trail
// recorded: the partition's ring owner, and the replica a request went
// to (its pick: the owner when in rotation, else with failover next the
// first in rotation along the partition's order), "" when none could
// take it.
type Placed struct {
	Owner, Pick string
}

// PlaceRecorded works out partition p's placement from what a
// ring_rebuild or rotation_change event records: the ring's fingerprint,
// its members and those in rotation (any order), with the Router's own
// ring and candidate code, so that it matches what the proxy did.
func PlaceRecorded(fingerprint string, members, rotation []string, failover Failover, p int) (Placed, error) {
	cfg, err := ParseFingerprint(fingerprint)
	if err != nil {
		return Placed{}, err
	}
	if p < 0 || p >= cfg.Partitions {
		return Placed{}, fmt.Errorf("partition %d: the ring has partitions 0 to %d", p, cfg.Partitions-1)
	}
	names := slices.Clone(members)
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) > maxRingMembers {
		return Placed{}, fmt.Errorf("%d ring members: more than a ring holds (%d)", len(names), maxRingMembers)
	}
	rg := buildRing(names, cfg)
	if len(names) == 0 {
		return Placed{}, nil
	}
	t := &Table[struct{}]{failover: failover, hash: cfg, ring: rg, replicas: make([]Replica, len(names)), inRotation: make([]bool, len(names))}
	for slot, name := range names {
		t.replicas[slot].Name = name
		if slices.Contains(rotation, name) {
			t.inRotation[slot] = true
			t.rotation = append(t.rotation, uint16(slot))
		}
	}
	t.buildCandidates(1)
	return Placed{Owner: names[rg.owner[p]], Pick: t.target(p)}, nil
}
