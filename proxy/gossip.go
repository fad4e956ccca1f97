package proxy

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
)

// RefusedHold is how long a replica whose connection was refused stays out
// of rotation on this proxy, unless gossip reports a change of it first (a
// new address, a new state, back from down). A refused connection means
// nothing listens: the process crashed or is restarting, which gossip
// confirms only seconds later. Requests in between go to the next
// candidate at once. After the hold the replica is tried again; if it
// still refuses, it is held out again by that one request, which is
// retried on the next candidate.
const RefusedHold = 5 * time.Second

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// ejectRefused takes a replica out of rotation at once. Only the first
// refused request of a hold touches the Router.
func (p *Proxy) ejectRefused(rs *replicaSet, b *Backend) {
	if b.refused.Load() {
		return
	}
	b.refusedMu.Lock()
	if b.refused.Load() {
		b.refusedMu.Unlock()
		return
	}
	b.refused.Store(true)
	b.refusedGen++
	gen := b.refusedGen
	rs.st.router.SetExcluded(b.name, balancer.ReasonRefused, true)
	b.refusedMu.Unlock()
	p.log.Warn("replica refused a connection; out of rotation on this proxy",
		zap.String("set", rs.name), zap.String("replica", b.name), zap.String("addr", b.addr), zap.Duration("hold", RefusedHold))
	st := rs.st
	time.AfterFunc(RefusedHold, func() { p.readmitRefused(st, b, gen) })
}

// readmitRefused lifts b's hold: the one numbered gen, or any (gen 0). The
// exclusion is keyed by replica name, so it is left alone when another,
// newer backend of the same name holds a hold of its own.
func (p *Proxy) readmitRefused(st *setState, b *Backend, gen uint64) {
	if p.stopped.Load() || st.removed.Load() {
		return // nothing routes with this set any more
	}
	b.refusedMu.Lock()
	defer b.refusedMu.Unlock()
	if !b.refused.Load() || (gen != 0 && gen != b.refusedGen) {
		return
	}
	b.refused.Store(false)
	st.mu.Lock()
	cur := st.live[b.name]
	st.mu.Unlock()
	if cur != nil && cur != b && cur.refused.Load() {
		return
	}
	st.router.SetExcluded(b.name, balancer.ReasonRefused, false)
}

// SetReplicaSet replaces the gossip-discovered replicas of one set (the
// membership.Target contract). It returns false for a set this proxy does
// not serve. A replica whose address, state or liveness changed is cleared
// of a refused-connection hold: gossip knows better now.
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
		if found && prev[i].Addr == r.Addr && prev[i].State == r.State && prev[i].Down == r.Down {
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
