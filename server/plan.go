package server

import (
	"errors"
	"fmt"
	"slices"

	"keyway/admin"
	"keyway/balancer"
	"keyway/proxy"
)

var _ admin.Planner = (*view)(nil)

// Plan shapes the proxy's plan of a change of a set's ring members
// (proxy.Plan, which places the proposed members with the Router's own
// ring construction) into the admin API's answer, with the notes on what a
// plan does not cover.
func (v *view) Plan(set string, add, remove []string) (admin.ReplicaSetPlan, error) {
	p, err := v.n.p.Plan(set, add, remove)
	if errors.Is(err, proxy.ErrUnknownSet) {
		return admin.ReplicaSetPlan{}, fmt.Errorf("%w %q", admin.ErrUnknownSet, set)
	}
	if err != nil {
		return admin.ReplicaSetPlan{}, err
	}
	parts := p.Hash.Partitions
	out := admin.ReplicaSetPlan{
		Set: p.Set, Generation: p.Generation, Fingerprint: p.Fingerprint, Partitions: parts,
		Add: p.Added, Remove: p.Removed,
		MovedPartitions: p.Moved, MovedShare: p.MovedShare(),
		Now: planBalance(p.Now), After: planBalance(p.After),
		Replicas: make([]admin.PlanReplica, 0, len(p.Replicas)),
		Notes: []string{
			"The plan places partitions on ring members: replicas that were ready once. Rotation, who is out right now " +
				"(draining, recovering, ejected, failing probes), is not part of it: keys of a member out of rotation go to " +
				"the next member along the ring and come back when it returns, without any partition moving.",
			fmt.Sprintf("Weights are not used by placement: every ring member has the same %d virtual nodes.", p.Hash.ReplicationFactor),
		},
	}
	for _, r := range p.Replicas {
		change := admin.PlanStays
		switch {
		case slices.Contains(p.Added, r.Name):
			change = admin.PlanJoins
		case slices.Contains(p.Removed, r.Name):
			change = admin.PlanLeaves
		}
		out.Replicas = append(out.Replicas, admin.PlanReplica{
			Name: r.Name, Change: change,
			PartitionsNow: r.Now, PartitionsAfter: r.After,
			ShareNow: fraction(r.Now, parts), ShareAfter: fraction(r.After, parts),
			Gained: r.Gained, Lost: r.Lost,
			GainedShare: fraction(r.Gained, parts), LostShare: fraction(r.Lost, parts),
		})
	}
	return out, nil
}

func planBalance(b balancer.Balance) admin.PlanBalance {
	return admin.PlanBalance{
		Members: b.Members, MinPartitions: b.Min, MaxPartitions: b.Max, MeanPartitions: b.Mean,
		MaxOverMean: b.MaxOverMean(), MinOverMean: b.MinOverMean(),
	}
}

func fraction(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}
