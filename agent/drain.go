package agent

import (
	"maps"
	"slices"
	"strconv"
	"sync"

	"keyway/membership"
)

// reportBook keeps the latest drain report of each proxy, received since
// the drain began. The membership message worker writes it (record); the
// agent's run loop reads it (snapshot). Safe for concurrent use; must not
// be copied.
type reportBook struct {
	set, replica string
	boot         int64
	metrics      *metrics

	mu         sync.Mutex
	collecting bool                              // a drain has begun (and not ended)
	latest     map[string]membership.DrainReport // by sender's gossip node name
	changed    chan struct{}                     // capacity 1: a report arrived
}

func newReportBook(set, replica string, boot int64, m *metrics) *reportBook {
	return &reportBook{set: set, replica: replica, boot: boot, metrics: m,
		latest: map[string]membership.DrainReport{}, changed: make(chan struct{}, 1)}
}

// begin marks the start of the drain: reports received before it are
// forgotten and later ones recorded.
func (b *reportBook) begin() {
	b.mu.Lock()
	b.collecting = true
	clear(b.latest)
	b.mu.Unlock()
}

// end marks the end of a drain that did not lead to a leave (a set start):
// reports are no longer recorded until the next begin.
func (b *reportBook) end() {
	b.mu.Lock()
	b.collecting = false
	clear(b.latest)
	b.mu.Unlock()
}

// record is the membership.MessageHandler. It runs on the membership
// message worker: it only decodes, stores under a mutex and signals
// without blocking.
func (b *reportBook) record(from string, msg []byte) {
	r, err := membership.DecodeDrainReport(msg)
	switch {
	case err != nil:
		b.metrics.reports.WithLabelValues("malformed").Inc()
		return
	case r.Set != b.set || r.Replica != b.replica || r.Boot != b.boot:
		// About another replica, or an earlier incarnation of this one.
		b.metrics.reports.WithLabelValues("other_replica").Inc()
		return
	}
	b.mu.Lock()
	ok := b.collecting
	if ok {
		b.latest[from] = r
	}
	b.mu.Unlock()
	if !ok {
		b.metrics.reports.WithLabelValues("before_drain").Inc()
		return
	}
	b.metrics.reports.WithLabelValues("accepted").Inc()
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// snapshot returns a copy of the latest reports.
func (b *reportBook) snapshot() map[string]membership.DrainReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.latest)
}

// pendingProxies returns, sorted, the gossip node names of the live proxies
// that have not yet said they are done with this replica: a proxy is done
// when its latest report (received since the drain began) has DrainingSeen
// and no request in flight. Members that are not proxies, or not alive
// (dead, left), are not waited for. It is a pure function.
func pendingProxies(members []membership.Member, latest map[string]membership.DrainReport) []string {
	var out []string
	for _, m := range members {
		if m.Self || m.Meta.Role != membership.RoleProxy || m.Status != membership.StatusAlive {
			continue
		}
		if r, ok := latest[m.Node]; ok && r.DrainingSeen && r.Inflight == 0 {
			continue
		}
		out = append(out, m.Node)
	}
	slices.Sort(out)
	return out
}

// pendingStopped returns, sorted, the live proxies whose latest report does
// not say they see this replica stopped. It is a pure function.
func pendingStopped(members []membership.Member, latest map[string]membership.DrainReport) []string {
	var out []string
	for _, m := range members {
		if m.Self || m.Meta.Role != membership.RoleProxy || m.Status != membership.StatusAlive {
			continue
		}
		if r, ok := latest[m.Node]; ok && r.StoppedSeen {
			continue
		}
		out = append(out, m.Node)
	}
	slices.Sort(out)
	return out
}

// describePending says, for each pending proxy, what it last reported:
// "proxy-a.x1=3 in flight", "proxy-b.x2=no report" or
// "proxy-c.x3=draining not seen yet". For the drain timeout's log line.
func describePending(pending []string, latest map[string]membership.DrainReport) []string {
	out := make([]string, len(pending))
	for i, p := range pending {
		r, ok := latest[p]
		switch {
		case !ok:
			out[i] = p + "=no report"
		case !r.DrainingSeen:
			out[i] = p + "=draining not seen yet"
		default:
			out[i] = p + "=" + strconv.FormatInt(r.Inflight, 10) + " in flight"
		}
	}
	return out
}
