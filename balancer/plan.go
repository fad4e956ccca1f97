package balancer

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// A plan answers "what would this change of ring members do?" before
// anyone makes it. It places the partitions on the proposed members with
// buildRing, the function every Router uses, and counts moved partitions
// with movedOwners, the count a Router reports in RebuildInfo.Moved: a
// plan is what the Router will do when the same members reach it, not an
// estimate of it.
//
// A plan is about the ring only. Rotation (who is out right now: drained,
// ejected, restarting) changes where keys go for a while but never the
// placement, so it is not part of a plan; and placement does not use
// Replica.Weight: every member gets the same HashConfig.ReplicationFactor
// virtual nodes.

// ErrBadPlan is wrapped by every [PlanError].
var ErrBadPlan = errors.New("balancer: bad plan")

// PlanError is a change that cannot be planned: Param ("add" or "remove")
// and Value name what was given, Problem says what is wrong with it and
// how to fix it. It wraps [ErrBadPlan].
type PlanError struct {
	Param   string
	Value   string
	Problem string
}

func (e *PlanError) Error() string {
	return fmt.Sprintf("%s %q: %s", e.Param, e.Value, e.Problem)
}

// Unwrap returns ErrBadPlan.
func (e *PlanError) Unwrap() error { return ErrBadPlan }

// Plan is what a change of a replica set's ring members would do to its
// partitions (and so to its keys: keys are spread evenly over partitions,
// so a share of partitions is a share of keys). A plain value; its slices
// belong to the receiver.
type Plan struct {
	// Set and Generation name the routing table the plan starts from
	// (Table.Plan); PlanChange leaves them empty.
	Set        string
	Generation uint64
	// Hash is the ring's shape, the same before and after; Fingerprint is
	// its HashConfig.Fingerprint.
	Hash        HashConfig
	Fingerprint string
	// Current and Proposed are the ring members before and after, sorted.
	// Added and Removed are the change, sorted.
	Current, Proposed []string
	Added, Removed    []string
	// Replicas has one row per replica of either ring, sorted by name.
	Replicas []PlanReplica
	// Moved counts the partitions whose owner changes, exactly as the
	// Router's RebuildInfo.Moved will count them when the change is made
	// (every partition when the ring was empty).
	Moved int
	// Now and After are the balance of the two rings.
	Now, After Balance
}

// MovedShare is the share of partitions (and of keys) that change owner,
// 0..1.
func (p Plan) MovedShare() float64 { return share(p.Moved, p.Hash.Partitions) }

// PlanReplica is one replica in a plan.
type PlanReplica struct {
	Name string
	// Now and After are the partitions it owns before and after (0 when it
	// is not on that ring).
	Now, After int
	// Gained counts partitions it owns after and did not before; Lost the
	// reverse. After - Now = Gained - Lost. With bounded loads a member
	// that stays may both gain and lose some (collateral moves).
	Gained, Lost int
}

// Balance is how evenly a ring spreads its partitions. A plain value; the
// zero Balance is that of an empty ring.
type Balance struct {
	Members int
	// Min and Max are the fewest and most partitions a member owns; Mean
	// is partitions / members.
	Min, Max int
	Mean     float64
}

// MaxOverMean is Max / Mean (1 is perfect; the load bound caps it near
// HashConfig.Load), or 0 for an empty ring.
func (b Balance) MaxOverMean() float64 {
	if b.Mean == 0 {
		return 0
	}
	return float64(b.Max) / b.Mean
}

// MinOverMean is Min / Mean, or 0 for an empty ring.
func (b Balance) MinOverMean() float64 {
	if b.Mean == 0 {
		return 0
	}
	return float64(b.Min) / b.Mean
}

// PlanChange computes what adding and removing ring members would do to a
// ring of the current members with shape cfg. current is sorted and
// deduplicated (a copy; the caller's slice is not changed); add and remove
// may come in any order: the plan is the same. It changes nothing.
//
// The error is a *[PlanError] (wrapping [ErrBadPlan]) for a name that is
// not a valid replica name, given twice, or in both lists; a name to add
// that is already a current member; a name to remove that is not one; a
// change that would leave the ring empty or with more than [MaxReplicas]
// members. No change at all, or an invalid cfg, is an error wrapping
// ErrBadPlan too.
func PlanChange(cfg HashConfig, current, add, remove []string) (Plan, error) {
	if err := cfg.Validate(); err != nil {
		return Plan{}, fmt.Errorf("%w: hash config: %w", ErrBadPlan, err)
	}
	cur := slices.Compact(slices.Sorted(slices.Values(current)))
	if err := checkChange(cur, add, remove); err != nil {
		return Plan{}, err
	}
	return planRings(cfg, buildRing(cur, cfg), add, remove), nil
}

// Plan is PlanChange on this table's ring: its members and its shape, as
// the Router built them (the current ring is the table's own, not a copy).
// The plan carries the table's set and generation. Safe for concurrent
// use; it builds one ring (the proposed one), off the request path.
func (t *Table[B]) Plan(add, remove []string) (Plan, error) {
	if err := checkChange(t.ring.names, add, remove); err != nil {
		return Plan{}, err
	}
	p := planRings(t.hash, t.ring, add, remove)
	p.Set, p.Generation = t.set, t.generation
	return p, nil
}

// checkChange validates a change of the sorted ring members cur.
func checkChange(cur, add, remove []string) error {
	if len(add) == 0 && len(remove) == 0 {
		return fmt.Errorf("%w: no change given: name at least one replica to add or to remove", ErrBadPlan)
	}
	seen := make(map[string]string, len(add)+len(remove))
	for _, l := range []struct {
		param string
		names []string
	}{{"add", add}, {"remove", remove}} {
		if len(l.names) > MaxReplicas {
			return &PlanError{Param: l.param, Value: fmt.Sprintf("%d names", len(l.names)),
				Problem: fmt.Sprintf("more than %d names: a ring has at most %d members", MaxReplicas, MaxReplicas)}
		}
		for _, n := range l.names {
			if !ValidReplicaName(n) {
				return &PlanError{Param: l.param, Value: n, Problem: "not a valid replica name: use 1 to 128 bytes without spaces, tabs or line breaks (e.g. orders-3)"}
			}
			if prev, ok := seen[n]; ok {
				if prev == l.param {
					return &PlanError{Param: l.param, Value: n, Problem: "given twice: name each replica once"}
				}
				return &PlanError{Param: l.param, Value: n, Problem: "given to both add and remove: name it in one of them"}
			}
			seen[n] = l.param
			_, on := slices.BinarySearch(cur, n)
			switch {
			case l.param == "add" && on:
				return &PlanError{Param: "add", Value: n, Problem: "already a ring member of the set: add only new names (to plan its removal, pass it to remove)"}
			case l.param == "remove" && !on:
				return &PlanError{Param: "remove", Value: n, Problem: "not a ring member of the set: remove only ring members (" + someNames(cur) + ")"}
			}
		}
	}
	size := len(cur) + len(add) - len(remove)
	if size == 0 {
		return &PlanError{Param: "remove", Value: strings.Join(slices.Sorted(slices.Values(remove)), ","),
			Problem: "would leave the ring empty, and a set without ring members routes nothing: keep at least one member, or add one"}
	}
	if size > MaxReplicas && len(add) > 0 {
		return &PlanError{Param: "add", Value: fmt.Sprintf("%d names", len(add)),
			Problem: fmt.Sprintf("the ring would have %d members, more than the limit of %d: add fewer, or remove some", size, MaxReplicas)}
	}
	return nil
}

// someNames lists up to 10 of the sorted ring members for an error message.
func someNames(cur []string) string {
	switch {
	case len(cur) == 0:
		return "the ring is empty"
	case len(cur) <= 10:
		return "ring members: " + strings.Join(cur, ", ")
	}
	return fmt.Sprintf("ring members: %s and %d more", strings.Join(cur[:10], ", "), len(cur)-10)
}

// planRings places the proposed members (cur's names plus add minus
// remove, already checked) with buildRing and compares the two rings.
func planRings(cfg HashConfig, cur *ring, add, remove []string) Plan {
	added := slices.Sorted(slices.Values(add))
	removed := slices.Sorted(slices.Values(remove))
	proposed := make([]string, 0, len(cur.names)+len(added))
	for _, n := range cur.names {
		if _, gone := slices.BinarySearch(removed, n); !gone {
			proposed = append(proposed, n)
		}
	}
	proposed = append(proposed, added...)
	slices.Sort(proposed)
	next := buildRing(proposed, cfg)

	p := Plan{
		Hash: cfg, Fingerprint: cfg.Fingerprint(),
		Current: slices.Clone(cur.names), Proposed: proposed,
		Added: added, Removed: removed,
		Moved: movedOwners(cur, next),
		Now:   balanceOf(cur), After: balanceOf(next),
	}

	rows := map[string]*PlanReplica{}
	row := func(n string) *PlanReplica {
		r := rows[n]
		if r == nil {
			r = &PlanReplica{Name: n}
			rows[n] = r
		}
		return r
	}
	for part := 0; part < cfg.Partitions; part++ {
		before, after := "", ""
		if len(cur.owner) > 0 {
			before = cur.names[cur.owner[part]]
			row(before).Now++
		}
		after = next.names[next.owner[part]]
		row(after).After++
		if before != after {
			row(after).Gained++
			if before != "" {
				row(before).Lost++
			}
		}
	}
	for _, n := range cur.names {
		row(n)
	}
	for _, n := range proposed {
		row(n)
	}
	p.Replicas = make([]PlanReplica, 0, len(rows))
	for _, n := range slices.Sorted(maps.Keys(rows)) {
		p.Replicas = append(p.Replicas, *rows[n])
	}
	return p
}

// balanceOf measures how a ring spreads its partitions.
func balanceOf(r *ring) Balance {
	if len(r.names) == 0 {
		return Balance{}
	}
	owned := make([]int, len(r.names))
	for _, o := range r.owner {
		owned[o]++
	}
	return Balance{
		Members: len(r.names),
		Min:     slices.Min(owned),
		Max:     slices.Max(owned),
		Mean:    float64(r.parts) / float64(len(r.names)),
	}
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}
