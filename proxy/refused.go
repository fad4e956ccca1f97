package proxy

import (
	"errors"
	"syscall"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
)

// The refused-connection hold: passive ejection by this proxy alone, on
// the request path, before gossip agrees.

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
	p.clk.AfterFunc(RefusedHold, func() { p.readmitRefused(st, b, gen) })
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
