package proxy

import (
	"bytes"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"keyway/proxy/internal/field"

	"github.com/valyala/fasthttp"
)

// Load shedding (docs/proxy.md, Overload). Beyond a bound keyway answers
// at once rather than letting latency and memory grow, and overload never
// moves a key: a keyed request whose replica is full, out of pooled
// connections or saturated by its own word is shed (503, or the set's
// overload_status, with Retry-After), never tried on the next candidate,
// which would move the key on this proxy only. A keyless request has no
// affinity to keep: it goes to the next candidate, and is shed only when
// every candidate is full. Admission is atomics only.

// strSaturated is the value of the pressure header by which a replica
// says it is saturated.
var strSaturated = []byte("saturated")

// retryAfterSecs holds Retry-After values 0..maxRetryAfter, made once so
// that shedding formats nothing.
const maxRetryAfter = 60

var retryAfterSecs = func() (t [maxRetryAfter + 1][]byte) {
	for i := range t {
		t[i] = []byte(strconv.Itoa(i))
	}
	return t
}()

// retryAfter returns the Retry-After value for a wait of d: whole seconds,
// rounded up, at least 1.
func retryAfter(d time.Duration) []byte {
	s := int((d + time.Second - 1) / time.Second)
	return retryAfterSecs[min(max(s, 1), maxRetryAfter)]
}

// limits is a generation's resolved limits (SetConfig.Limits).
type limits struct {
	perReplica int64  // 0: unbounded
	set        int64  // 0: unbounded
	status     int    // overload_status
	pressure   []byte // the pressure header; nil when off
	maxHold    time.Duration
	queue      int           // max_queued_per_replica; 0: no queue
	queueWait  time.Duration // max_queue_wait
	setMsg     string        // the message of a set_overloaded answer
}

func newLimits(sc SetConfig) limits {
	l := limits{
		perReplica: int64(sc.Limits.MaxInflightPerReplica),
		set:        int64(sc.Limits.MaxInflight),
		status:     sc.Limits.OverloadStatus,
		maxHold:    sc.Limits.MaxPressureHold,
		queue:      sc.Limits.MaxQueuedPerReplica,
		queueWait:  sc.Limits.MaxQueueWait,
	}
	if l.perReplica == 0 {
		l.perReplica = int64(sc.MaxConnsPerReplica)
	}
	l.setMsg = "the replica set has " + strconv.FormatInt(l.set, 10) + " requests in flight on this proxy (limits.max_inflight): the request was not delivered; retry later"
	if l.status == 0 {
		l.status = fasthttp.StatusServiceUnavailable
	}
	if h := sc.Limits.PressureHeader; h != "" {
		l.pressure = []byte(h)
	}
	return l
}

// saturatedFor reports whether resp says its replica is saturated, and for
// how long to shed its keyed requests: the answer's Retry-After in
// seconds (1s without one, or with an HTTP date), at most maxHold. f is
// the answer's fields (scanReply): without field.Pressure it has no pressure
// header.
func (l *limits) saturatedFor(resp *fasthttp.ResponseHeader, f fields) (time.Duration, bool) {
	if l.pressure == nil || f&field.Pressure == 0 {
		return 0, false
	}
	v := resp.PeekBytes(l.pressure)
	if len(v) == 0 || !bytes.EqualFold(bytes.TrimSpace(v), strSaturated) {
		return 0, false
	}
	hold := time.Second
	if ra := resp.PeekBytes(hdrRetryAfter); len(ra) > 0 {
		if n, err := fasthttp.ParseUint(ra); err == nil && n > 0 {
			hold = time.Duration(min(n, 3600)) * time.Second
		}
	}
	return min(hold, l.maxHold), true
}

// replicaQueue is a replica's short FIFO of requests waiting for one of
// its limits.max_inflight_per_replica slots (limits.max_queued_per_replica
// long, each waiting at most limits.max_queue_wait). A releasing request
// hands its slot straight to the oldest waiter, so a waiter never loses
// its turn to a newcomer that found the slot free for a moment, and a slot
// is never free while someone waits (the waiter announces itself before
// it checks the slots again; a releaser frees its slot before it looks for
// waiters: one of the two sees the other). Only overload takes the
// mutex; a request that finds a slot free touches the atomics alone.
type replicaQueue struct {
	waiting atomic.Int32 // len(q), readable without mu
	mu      sync.Mutex
	q       []*queueWaiter // oldest first
}

// queueWaiter is one waiting request; pooled, so queueing allocates
// nothing in steady state.
type queueWaiter struct {
	ready chan struct{} // a slot was handed over (buffered: the hand-over never blocks)
	timer *time.Timer
}

var waiterPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &queueWaiter{ready: make(chan struct{}, 1), timer: t}
}}

// release gives back a slot taken by acquire: to the oldest waiter if one
// waits and the bound allows (handOver), else to the free slots.
// exchange writes it out.
func (b *Backend) release(bound int64) {
	if b.inflight.Add(-1); b.queue.waiting.Load() != 0 {
		b.handOver(bound)
	}
}

// handOver gives a slot just released (release) to the oldest waiter of
// b's queue, if one waits and the bound allows.
func (b *Backend) handOver(bound int64) {
	q := &b.queue
	q.mu.Lock()
	if len(q.q) > 0 && b.inflight.Add(1) <= bound {
		w := q.q[0]
		q.q = slices.Delete(q.q, 0, 1)
		q.waiting.Add(-1)
		q.mu.Unlock()
		w.ready <- struct{}{}
		return
	} else if len(q.q) > 0 {
		// A newcomer took the slot first; it will hand it over in turn.
		b.inflight.Add(-1)
	}
	q.mu.Unlock()
}

// The per-replica shed counters (keyway_shed_total): shedIndex maps the
// reasons a replica sheds for to their index.
const shedKinds = 3

func shedIndex(r localReason) int {
	switch r {
	case lrSaturated:
		return 1
	case lrQueueTimeout:
		return 2
	}
	return 0 // lrOverloaded
}

var shedKindReasons = [shedKinds]localReason{lrOverloaded, lrSaturated, lrQueueTimeout}

// shedTexts are the messages of a replica's shed answers, made once per
// replica and limits rather than per shed request.
type shedTexts struct {
	bound                               int64
	wait                                time.Duration
	overloaded, queueTimeout, saturated string
}

// shedMessages returns b's shed messages for the limits l.
func (b *Backend) shedMessages(l *limits) *shedTexts {
	if m := b.shedText.Load(); m != nil && m.bound == l.perReplica && m.wait == l.queueWait {
		return m
	}
	m := &shedTexts{
		bound: l.perReplica, wait: l.queueWait,
		overloaded:   "replica " + b.name + " is overloaded (limits.max_inflight_per_replica " + strconv.FormatInt(l.perReplica, 10) + " or its connection pool is full): the request was not delivered; retry later (the key stays with this replica)",
		queueTimeout: "replica " + b.name + " stayed full for limits.max_queue_wait (" + l.queueWait.String() + ") while this request waited in its queue: the request was not delivered; retry later (the key stays with this replica)",
		saturated:    "replica " + b.name + " said it is saturated: the request was not delivered; retry after Retry-After (the key stays with this replica)",
	}
	b.shedText.Store(m)
	return m
}
