package proxy

import (
	"bytes"
	"strconv"
	"time"

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
}

func newLimits(sc SetConfig) limits {
	l := limits{
		perReplica: int64(sc.Limits.MaxInflightPerReplica),
		set:        int64(sc.Limits.MaxInflight),
		status:     sc.Limits.OverloadStatus,
		maxHold:    sc.Limits.MaxPressureHold,
	}
	if l.perReplica == 0 {
		l.perReplica = int64(sc.MaxConnsPerReplica)
	}
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
// seconds (1s without one, or with an HTTP date), at most maxHold.
func (l *limits) saturatedFor(resp *fasthttp.ResponseHeader) (time.Duration, bool) {
	if l.pressure == nil {
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

// shed answers a request keyway sheds: status with Retry-After after
// wait, and a JSON body naming the set and the replica.
func (p *Proxy) shed(ctx *fasthttp.RequestCtx, rs *replicaSet, reason localReason, status int, wait time.Duration, msg, replica string, attempts int, upstream time.Duration) {
	rs.counts.shed.Add(1)
	p.answer(ctx, rs, reason, status, msg, replica, attempts, upstream)
	ctx.Response.Header.SetBytesKV(hdrRetryAfter, retryAfter(wait))
}
