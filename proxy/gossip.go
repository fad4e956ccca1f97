package proxy

// The proxy's input adapters: gossip's replica lists (SetReplicaSet), the
// health checker's exclusions (SetExcluded), and what membership asks of
// the proxy (ReplicaLoad, Fingerprints).

import (
	"slices"
	"strings"

	"keyway/balancer"
)

// SetReplicaSet replaces the gossip-discovered replicas of one set (the
// membership.Target contract). It returns false for a set this proxy does
// not serve. A replica whose address, state, liveness or incarnation
// changed is cleared of a refused-connection hold: gossip knows better
// now. A new incarnation (Replica.Boot) retires the connection pool of the
// old one at once, without waiting for the Router.
func (p *Proxy) SetReplicaSet(set string, reps []balancer.Replica) bool {
	rs := p.routes.Load().byName[set]
	if rs == nil {
		return false
	}
	s := rs.st
	s.feedMu.Lock()
	defer s.feedMu.Unlock()
	if s.removed.Load() {
		return false // a reload removed it after we looked it up
	}
	s.mu.Lock()
	prev := s.gossip
	s.gossip = slices.Clone(reps)
	s.mu.Unlock()
	for _, r := range reps {
		i, found := slices.BinarySearchFunc(prev, r.Name, func(a balancer.Replica, n string) int { return strings.Compare(a.Name, n) })
		if found && prev[i].Boot != r.Boot {
			// A new incarnation: the connections to the old process are
			// dead, or will be when it exits. Same address or not, none
			// of them may carry another request (the Router keeps the
			// backend when only the incarnation changed).
			s.mu.Lock()
			b := s.live[r.Name]
			s.mu.Unlock()
			if b != nil {
				b.retirePool()
			}
		}
		if found && prev[i].Addr == r.Addr && prev[i].State == r.State && prev[i].Down == r.Down && prev[i].Boot == r.Boot {
			continue
		}
		t := s.router.Table()
		for _, m := range t.Members() {
			if m.Name == r.Name && m.Slot >= 0 {
				p.readmitRefused(s, t.Backend(m.Slot), 0)
			}
		}
	}
	s.router.SetReplicas("gossip", reps)
	if len(prev) == 0 && len(reps) > 0 && s.router.Table().Len() == 0 {
		// The set's first replicas (a new set, a reload, a proxy just
		// started): routable now, not after the coalescing window.
		s.router.Flush()
	}
	return true
}

// ReplicaLoad reports the requests in flight from this proxy to a replica
// and whether the proxy routes with it out of rotation (the
// membership.Target contract).
func (p *Proxy) ReplicaLoad(set, replica string) (inflight int64, outOfRotation, ok bool) {
	s := p.routes.Load().byName[set]
	if s == nil {
		return 0, false, false
	}
	t := s.router.Table()
	ms := t.Members()
	i, found := slices.BinarySearchFunc(ms, replica, func(m balancer.Member, n string) int { return strings.Compare(m.Name, n) })
	if !found || ms[i].Slot < 0 {
		return 0, false, false
	}
	return t.Backend(ms[i].Slot).Inflight(), !ms[i].InRotation, true
}

// Fingerprints returns each served set's ring fingerprint.
func (p *Proxy) Fingerprints() map[string]string {
	rt := p.routes.Load()
	out := make(map[string]string, len(rt.sets))
	for _, s := range rt.sets {
		out[s.name] = s.cfg.Hash.Fingerprint()
	}
	return out
}

// SetExcluded adds or clears a proxy-local reason holding a replica out of
// rotation (the health.Sink contract). Unknown sets are ignored.
func (p *Proxy) SetExcluded(set, replica string, reason balancer.Reason, excluded bool) {
	if s := p.routes.Load().byName[set]; s != nil {
		s.router.SetExcluded(replica, reason, excluded)
	}
}
