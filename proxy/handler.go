package proxy

import (
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"keyway/balancer"
	"keyway/proxy/internal/wire"
)

// localReason says why keyway answered a request itself.
type localReason uint8

const (
	lrNoKey         localReason = iota // 400: no key and fallback reject
	lrBadKey                           // 400: key in a non-canonical form
	lrBodyTooLarge                     // 413
	lrNoReplica                        // 503: nothing in rotation for this key
	lrUnreachable                      // 503: every candidate refused or had no free connection
	lrUpstream                         // 502: the replica failed after the request was sent
	lrTimeout                          // 504: the replica did not answer in time
	lrInternal                         // 502: a bug in keyway (recovered panic)
	lrStopped                          // 503: an operator stopped the set
	lrOverloaded                       // 503 or 429: the key's replica is at its in-flight bound or out of pooled connections
	lrSetOverloaded                    // 503 or 429: the set is at its in-flight bound on this proxy
	lrSaturated                        // 503: the key's replica said it is saturated (pressure header)
	lrMemory                           // 503: the memory guard sheds (heap or bodies in flight)
	lrQueueTimeout                     // 503 or 429: the key's replica stayed full while the request waited in its queue
	localReasons
)

var localReasonNames = [localReasons]string{"no_key", "bad_key", "body_too_large", "no_replica", "unreachable", "upstream_error", "upstream_timeout", "internal", "set_stopped", "overloaded", "set_overloaded", "replica_saturated", "memory", "queue_timeout"}

func (r localReason) String() string { return localReasonNames[r] }

var (
	hdrRetryAfter  = []byte("Retry-After")
	strRetryAfter1 = []byte("1")
	// A stopped set stays stopped until an operator starts it: producers
	// need not retry every second.
	strRetryAfterStopped = []byte("10")
	strJSON              = []byte("application/json")
)

// handle is the request path: match set → key → table → forward.
//
// Its defers sit in functions with few returns, so that the compiler
// open-codes them (it does not when returns × defers exceeds 15, and a
// deferred call then goes through the runtime's defer records).
func (p *Proxy) handle(ctx *fasthttp.RequestCtx) {
	p.metrics.inflight.Inc()
	defer p.handled(ctx)
	p.route(ctx)
}

// handled ends every request handle took: a panic becomes a 502.
func (p *Proxy) handled(ctx *fasthttp.RequestCtx) {
	p.metrics.inflight.Dec()
	if v := recover(); v != nil {
		p.log.Error("panic in request handler", zap.Any("panic", v), zap.Stack("stack"))
		ctx.Response.Reset()
		p.respondError(ctx, nil, lrInternal, fasthttp.StatusBadGateway, "internal proxy error", "")
	}
	releaseFwd(ctx.Conn()) // after the access log, which may read its request ID
}

// route matches the request's set and admits it (admit).
func (p *Proxy) route(ctx *fasthttp.RequestCtx) {
	if v := refusedRequest(ctx); v != vOK {
		p.refuseFraming(ctx, v)
		return
	}
	if len(ctx.Host()) == 0 {
		// HTTP/1.1 without Host fasthttp refuses itself; an HTTP/1.0
		// request may lack it, but keyway routes by it and a replica
		// needs one.
		p.refuseFraming(ctx, vNoHost)
		return
	}
	uri := ctx.URI()
	path := uri.PathOriginal()
	rs := p.matchSet(ctx.Host(), path)
	if rs == nil {
		p.respondNoSet(ctx)
		return
	}
	if len(ctx.Request.Body()) > rs.maxBody {
		p.respondError(ctx, rs, lrBodyTooLarge, fasthttp.StatusRequestEntityTooLarge,
			"request body exceeds max_body_bytes ("+ByteSize(rs.maxBody).String()+") of this replica set", "")
		ctx.SetConnectionClose()
		return
	}
	if p.mem.over.Load() {
		p.shed(ctx, rs, lrMemory, fasthttp.StatusServiceUnavailable, time.Second,
			"keyway's heap is above server.max_heap_bytes: the request was not delivered; retry later", "", 0, 0)
		return
	}
	p.admit(ctx, rs, path, uri)
}

// admit holds the request's share of the memory guard's body budget and
// of its set's in-flight bound while it is dispatched, or sheds it.
func (p *Proxy) admit(ctx *fasthttp.RequestCtx, rs *replicaSet, path []byte, uri *fasthttp.URI) {
	if g := p.mem; g.maxBody > 0 {
		if n := int64(len(ctx.Request.Body())); n > 0 {
			defer g.releaseBody(n)
			if !g.admitBody(n) {
				p.shed(ctx, rs, lrMemory, fasthttp.StatusServiceUnavailable, time.Second,
					"the request bodies in flight would exceed server.max_inflight_body_bytes: the request was not delivered; retry later", "", 0, 0)
				return
			}
		}
	}
	if bound := rs.limits.set; bound > 0 {
		st := rs.st
		defer st.inflight.Add(-1)
		if st.inflight.Add(1) > bound {
			p.shed(ctx, rs, lrSetOverloaded, rs.limits.status, time.Second, rs.limits.setMsg, "", 0, 0)
			return
		}
	}
	p.dispatch(ctx, rs, path, uri)
}

// dispatch keys the request, decides its candidates and forwards it.
func (p *Proxy) dispatch(ctx *fasthttp.RequestCtx, rs *replicaSet, path []byte, uri *fasthttp.URI) {
	t := rs.router.Table()
	hash, status := rs.key(&ctx.Request.Header, path, uri)
	var buf [8]uint16
	cands, d := p.decide(rs, t, status, hash, buf[:0])
	if d.allDown {
		rs.allDown.Inc()
	}
	if len(cands) == 0 {
		p.respondError(ctx, rs, d.reason, d.status, d.msg, d.replica)
		return
	}
	p.forward(ctx, rs, t, cands, status == balancer.KeyOK, hash)
}

// key looks for the request's key in the set's sources, in order: the
// first source that is present decides (a malformed key is KeyInvalid, not
// skipped). path is the raw request path.
func (rs *replicaSet) key(h *fasthttp.RequestHeader, path []byte, uri *fasthttp.URI) (uint64, balancer.KeyStatus) {
	for i := range rs.sources {
		src := &rs.sources[i]
		var hash uint64
		var status balancer.KeyStatus
		switch src.kind {
		case keyHeader:
			hash, status = balancer.HashHeader(h.PeekBytes(src.name))
		case keyPathSegment:
			hash, status = balancer.HashPathSegment(path, src.segment)
		default:
			hash, status = balancer.HashQuery(uri.QueryString(), src.name)
		}
		if status != balancer.KeyMissing {
			return hash, status
		}
	}
	return 0, balancer.KeyMissing
}

// keyless picks candidates for a request without a key, or nil.
func (p *Proxy) keyless(rs *replicaSet, t *balancer.Table[*Backend], dst []uint16) []uint16 {
	rot := t.Rotation()
	if len(rot) == 0 || rs.cfg.Fallback == balancer.FallbackReject {
		return nil
	}
	var first int
	switch rs.cfg.Fallback {
	case balancer.FallbackRandom:
		first, _ = t.RandomSlot()
	case balancer.FallbackLeastInflight:
		// Power of two choices between two distinct replicas: drawing both
		// with replacement would send a quarter of the requests to a
		// blocked replica of two.
		first = int(rot[0])
		if n := len(rot); n > 1 {
			i := rand.IntN(n)
			j := rand.IntN(n - 1)
			if j >= i {
				j++
			}
			a, b := int(rot[i]), int(rot[j])
			if t.Backend(b).inflight.Load() < t.Backend(a).inflight.Load() {
				a = b
			}
			first = a
		}
	default:
		first, _ = t.NextRoundRobin()
	}
	// Retries go to the following replicas of the rotation.
	i := 0
	for i < len(rot) && int(rot[i]) != first {
		i++
	}
	for n := 0; n < min(len(rot), rs.attempts, cap(dst)); n++ {
		dst = append(dst, rot[(i+n)%len(rot)])
	}
	return dst
}

// forward tries the candidates in order, following the delivery contract:
// a request that never reached a replica may go to the next candidate; one
// whose fate is unknown only if it is replayable. keyed says the request
// has a key, whose hash is hash (for the route context).
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, rs *replicaSet, t *balancer.Table[*Backend], cands []uint16, keyed bool, hash uint64) {
	// fasthttp read the clock just before it called the handler: the
	// request's deadline counts from then (a microsecond of routing
	// earlier than a clock read here), and one clock read is spared.
	start := ctx.Time()
	if start.IsZero() {
		start = time.Now() // a context that fasthttp's server did not start
	}
	deadline := start.Add(rs.timeout)
	clientClose, http10, fwd := prepareRequest(ctx, deadline, !p.opts.headerAPIForwarding)
	var ring []byte
	if rs.routeHdr != nil {
		ring = rs.st.ringID(t)
	}

	var lastErr error
	var lastKind errKind
	var last *Backend
	// shed is why the last candidate was passed over without an attempt
	// (lrOverloaded, lrSaturated), or localReasons when it was tried.
	shed := localReasons
	var shedWait time.Duration
	var upstream time.Duration // time in exchanges with replicas (the access log)
	tried := 0
	sameRetried := false // the one try again on the same replica is used up
	same := false        // this attempt tries the previous one's replica again
	attempts := min(len(cands), rs.attempts)
	// t0 is when an attempt's exchange began: the request's start for a
	// first attempt that waited in no queue (routing and the rewriting
	// before it take a microsecond or two, which its upstream time then
	// includes), the clock for the others. Each clock read costs about a
	// hundred instructions, or a few percent of the whole request.
	t0 := start
	for i := 0; i < attempts; i++ {
		slot := int(cands[i])
		b := t.Backend(slot)
		last = b
		// Admission. A keyed request never goes to another replica
		// because its own is full or saturated: it is shed. A keyless
		// one tries the next candidate.
		if until := b.saturatedUntil.Load(); until != 0 {
			if wait := time.Duration(until - start.UnixNano()); wait > 0 {
				shed, shedWait = lrSaturated, wait
				if keyed {
					break
				}
				continue
			}
		}
		// A keyed request may wait in its replica's queue; a keyless one
		// only at its last candidate, having found every other one full.
		maxQueued := 0
		if keyed || i == attempts-1 {
			maxQueued = rs.limits.queue
		}
		ok, queued := b.acquire(rs.limits.perReplica, maxQueued, rs.limits.queueWait, deadline)
		if !ok {
			shed, shedWait = lrOverloaded, time.Second
			if queued {
				shed = lrQueueTimeout
			}
			if keyed {
				break
			}
			continue
		}
		if queued || tried > 0 || same {
			t0 = time.Now()
		}
		shed = localReasons
		tried++
		// wire.RoundTrip resets the response. keyway_retries_total counts
		// retries on another candidate.
		if i > 0 && !same {
			rs.retries.Inc()
		}
		same = false
		if rs.routeHdr != nil {
			setRouteContext(&ctx.Request.Header, rs.routeHdr, t, keyed, hash, slot, ring)
		}
		pool := b.pool.Load()
		var lines []byte
		if fwd != nil {
			lines = fwd.lines // the forwarding headers, written after the head
		}
		out := wire.RoundTrip(b.hc, &ctx.Request, &ctx.Response, deadline, lines)
		err := out.Err
		var valid bool
		var reply fields // the reply's fields (scanReply)
		b.release(rs.limits.perReplica)
		if b.released.Load() || b.pool.Load() != pool {
			// The pool was retired while this request used it (a reload
			// renewed it, the replica left, or a new incarnation replaced
			// the replica's process): close the connection the request
			// just returned to it.
			b.hc.CloseIdleConnections()
		}
		if err == nil {
			if code := ctx.Response.StatusCode(); code < 200 || code > 599 {
				// fasthttp consumes interim replies (1xx but 101) and
				// reads "001" as 1. What is left is no final answer a
				// client could take: 101 (keyway forwards no Upgrade, so
				// a replica has switched protocols unasked), a status
				// fasthttp could not read as three digits, or 600-999,
				// which RFC 9110 does not define.
				err = errBadStatus
			} else if valid, reply = scanReply(&ctx.Response.Header, rs.limits.pressure); !valid {
				err = errMalformedReply
			}
			if err != nil {
				// fasthttp read the reply whole and pooled its connection;
				// a replica that answers this way may have left the
				// connection in any state (a switched protocol, a body
				// framed some other way). Close the idle connections
				// rather than send the next request into it.
				b.hc.CloseIdleConnections()
			}
		}
		end := time.Now()
		d := end.Sub(t0)
		upstream += d
		if err == nil {
			code := ctx.Response.StatusCode()
			if hold, ok := rs.limits.saturatedFor(&ctx.Response.Header, reply); ok {
				// The replica's own word that it is full: shed its keyed
				// requests for a while rather than move them, and take the
				// answer as no evidence against it (no ejection).
				b.saturatedUntil.Store(end.Add(hold).UnixNano())
			} else if now := end.UnixNano(); code >= 500 {
				b.lastFail.Store(now)
			} else if now-b.lastOK.Load() > vetoGrain {
				// Vetoes need lastOK to a fleet.veto_window (seconds):
				// refreshing it once per vetoGrain spares most requests
				// a write to the backend's shared cache line.
				b.lastOK.Store(now)
			}
			if p.opts.Observer != nil && b.saturatedUntil.Load() <= end.UnixNano() {
				p.opts.Observer.Observe(rs.name, b.name, code, nil, d)
			}
			prepareResponse(ctx, clientClose, reply)
			restoreRequest(ctx, http10)
			b.ctr.requests[codeClass(code)].Add(1)
			b.latency.Observe(end.Sub(start).Seconds())
			p.logAccess(ctx, rs, b.name, "", code, tried, ctx.Time(), upstream)
			return
		}
		lastKind, lastErr = classifyAttempt(out, b)
		err = lastErr
		b.ctr.upErrs[lastKind].Add(1)
		if lastKind == errDial && isRefused(err) {
			p.ejectRefused(rs, b)
		}
		if lastKind == errTLS {
			p.handshakeFailed(rs.name, b, err)
		}
		if lastKind.evidence() {
			b.lastFail.Store(end.UnixNano())
			if p.opts.Observer != nil {
				p.opts.Observer.Observe(rs.name, b.name, 0, err, d)
			}
		}
		if ce := p.log.Check(zapcore.DebugLevel, "upstream attempt failed"); ce != nil {
			ce.Write(zap.String("set", rs.name), zap.String("replica", b.name), zap.Stringer("kind", lastKind), zap.Error(err), zap.Int("attempt", i+1))
		}
		if !sameRetried && (lastKind == errStale || (lastKind == errReusedClosed && rs.replayable(&ctx.Request.Header, fwd))) {
			// The pooled connection was dead, not necessarily the replica.
			// Its other idle connections are suspect too (a restart or an
			// idle timeout closes them all): drop them, and try the same
			// replica once more on a fresh connection. If it crashed, that
			// dial is refused and ejects it. A stale connection sent
			// nothing: the try again is not another attempt. A reused
			// connection closed before any answer byte may have delivered
			// the request (it is replayable, or we would not be here): the
			// try again is another attempt, on the same candidate.
			sameRetried, same = true, true
			b.hc.CloseIdleConnections()
			i--
			if lastKind == errStale {
				tried--
			}
			continue
		}
		if lastKind == errNoFreeConns {
			// The replica's pool is full: it is overloaded, not down.
			shed, shedWait = lrOverloaded, time.Second
			if keyed {
				break
			}
		}
		if lastKind == errReplyTooLarge || !lastKind.neverSent() && !rs.replayable(&ctx.Request.Header, fwd) {
			break
		}
		if !time.Now().Before(deadline) {
			break
		}
	}
	restoreRequest(ctx, http10)
	ctx.Response.Reset()
	if clientClose {
		ctx.SetConnectionClose()
	}
	if shed != localReasons {
		last.ctr.shed[shedIndex(shed)].Add(1)
	}
	switch {
	case shed == lrSaturated:
		p.shed(ctx, rs, lrSaturated, fasthttp.StatusServiceUnavailable, shedWait, last.shedMessages(&rs.limits).saturated, last.name, tried, upstream)
	case shed == lrQueueTimeout:
		p.shed(ctx, rs, lrQueueTimeout, rs.limits.status, shedWait, last.shedMessages(&rs.limits).queueTimeout, last.name, tried, upstream)
	case shed == lrOverloaded:
		p.shed(ctx, rs, lrOverloaded, rs.limits.status, shedWait, last.shedMessages(&rs.limits).overloaded, last.name, tried, upstream)
	case lastKind.neverSent():
		p.answer(ctx, rs, lrUnreachable, fasthttp.StatusServiceUnavailable,
			"no replica could be reached for this request ("+lastKind.String()+"); it was not delivered: retry", last.name, tried, upstream)
	case lastKind == errTimeout:
		p.answer(ctx, rs, lrTimeout, fasthttp.StatusGatewayTimeout,
			"the replica did not answer within "+rs.timeout.String()+"; the request may or may not have been processed", last.name, tried, upstream)
	case lastKind == errReplyTooLarge:
		p.answer(ctx, rs, lrUpstream, fasthttp.StatusBadGateway,
			"the replica's reply body exceeds max_response_body_bytes ("+ByteSize(rs.cfg.MaxResponseBodyBytes).String()+") of this replica set: the replica answered, its reply is not relayed", last.name, tried, upstream)
	case lastKind == errReusedClosed:
		p.answer(ctx, rs, lrUpstream, fasthttp.StatusBadGateway,
			"the replica closed a reused connection as the request was sent ("+lastKind.String()+"); the request may or may not have been processed", last.name, tried, upstream)
	default:
		p.answer(ctx, rs, lrUpstream, fasthttp.StatusBadGateway,
			"the replica failed after the request was sent ("+lastKind.String()+"); the request may or may not have been processed", last.name, tried, upstream)
	}
	if ce := p.log.Check(zapcore.DebugLevel, "request failed"); ce != nil {
		ce.Write(zap.String("set", rs.name), zap.String("replica", last.name), zap.Error(lastErr))
	}
}

// replayable reports whether a request may be sent again once it may
// have reached a replica: its method is idempotent, or it carries the
// set's idempotency header. It is asked only after a failed attempt, so
// that a request that succeeds at once looks no header up.
// fwd is the request's forwarding state (forwarded.go), or nil: an
// idempotency header that is X-Request-Id counts where keyway gave the
// request its ID, which every attempt carries, as the header API path
// has it in the header.
func (rs *replicaSet) replayable(h *fasthttp.RequestHeader, fwd *fwdReq) bool {
	return isIdempotent(h.Method()) || len(rs.idem) > 0 && (len(h.PeekBytes(rs.idem)) > 0 || rs.idemIsID && fwd.requestID() != nil)
}

func isIdempotent(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

func codeClass(code int) int {
	if code < 100 || code > 599 {
		return 5
	}
	return code / 100
}

// respondError answers with a small JSON body. 503s carry Retry-After.
func (p *Proxy) respondError(ctx *fasthttp.RequestCtx, rs *replicaSet, reason localReason, status int, msg, replica string) {
	p.answer(ctx, rs, reason, status, msg, replica, 0, 0)
}

// answer is respondError after attempts with replicas, which took
// upstream in all.
func (p *Proxy) answer(ctx *fasthttp.RequestCtx, rs *replicaSet, reason localReason, status int, msg, replica string, attempts int, upstream time.Duration) {
	p.answerAt(ctx, rs, reason, status, msg, replica, attempts, upstream, ctx.Time())
}

// answerAt is answer for a request read at start.
func (p *Proxy) answerAt(ctx *fasthttp.RequestCtx, rs *replicaSet, reason localReason, status int, msg, replica string, attempts int, upstream time.Duration, start time.Time) {
	set := ""
	if rs != nil {
		set = rs.name
		rs.local[reason].Inc()
		rs.counts.local[codeClass(status)].Add(1)
	}
	shedReason := ""
	if reason >= lrOverloaded {
		shedReason = reason.String()
	}
	writeJSONErrorReason(ctx, status, msg, set, replica, shedReason)
	if reason == lrStopped {
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, strRetryAfterStopped)
	}
	p.logAccess(ctx, rs, replica, reason.String(), status, attempts, start, upstream)
}

func writeJSONError(ctx *fasthttp.RequestCtx, status int, msg, set, replica string) {
	writeJSONErrorReason(ctx, status, msg, set, replica, "")
}

// errorBodyBufs are scratch buffers for JSON error bodies: an answer
// keyway gives itself (a shed one above all, which comes in floods)
// allocates nothing for its body.
var errorBodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeJSONErrorReason answers with status and the JSON error body
//
//	{"error": msg, "replica_set": set ("" when no set matched),
//	 "replica": replica ("" when none was involved),
//	 "reason": reason (why a request was shed; absent otherwise)}
func writeJSONErrorReason(ctx *fasthttp.RequestCtx, status int, msg, set, replica, reason string) {
	ctx.Response.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(strJSON)
	if status == fasthttp.StatusServiceUnavailable {
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, strRetryAfter1)
	}
	buf := errorBodyBufs.Get().(*[]byte)
	b := append((*buf)[:0], `{"error":`...)
	b, _ = appendJSONString(b, msg, math.MaxInt)
	b = append(b, `,"replica_set":`...)
	b, _ = appendJSONString(b, set, math.MaxInt)
	b = append(b, `,"replica":`...)
	b, _ = appendJSONString(b, replica, math.MaxInt)
	if reason != "" {
		b = append(b, `,"reason":`...)
		b, _ = appendJSONString(b, reason, math.MaxInt)
	}
	b = append(b, "}\n"...)
	ctx.Response.SetBody(b)
	*buf = b
	errorBodyBufs.Put(buf)
}

func (p *Proxy) respondNoSet(ctx *fasthttp.RequestCtx) {
	p.metrics.noSet.Inc()
	p.metrics.counters.noSet[4].Add(1)
	writeJSONError(ctx, fasthttp.StatusNotFound,
		"no replica set matches host "+strconv.Quote(string(ctx.Host()))+" and path "+strconv.Quote(string(ctx.URI().PathOriginal())), "", "")
	p.logAccess(ctx, nil, "", "no_set", fasthttp.StatusNotFound, 0, ctx.Time(), 0)
}

// handleParseError answers requests fasthttp could not read.
func (p *Proxy) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	status, msg := fasthttp.StatusBadRequest, "malformed request"
	switch {
	case errors.Is(err, errBareLF):
		msg = errBareLF.Error()
	case errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding):
		status, msg = transferCodingAnswer(headScanOf(ctx.Conn()))
	case errors.As(err, &small):
		status, msg = p.headTooLarge(ctx)
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		// The headers were read: name the set whose limit applies. The
		// server-wide limit is the largest max_body_bytes of all sets.
		if rs := p.matchSet(ctx.Host(), ctx.URI().PathOriginal()); rs != nil {
			// ctx.Time() is not this request's: fasthttp sets it once a
			// request is read whole.
			p.answerAt(ctx, rs, lrBodyTooLarge, fasthttp.StatusRequestEntityTooLarge,
				"request body exceeds max_body_bytes ("+ByteSize(rs.maxBody).String()+") of this replica set", "", 0, 0, time.Now())
			ctx.SetConnectionClose()
			markLinger(ctx.Conn())
			return
		}
		status, msg = fasthttp.StatusRequestEntityTooLarge, "request body exceeds the largest max_body_bytes of all replica sets ("+ByteSize(p.server.MaxRequestBodySize).String()+")"
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			status, msg = fasthttp.StatusRequestTimeout, "request not received within server.read_timeout"
		}
	}
	if status == fasthttp.StatusRequestEntityTooLarge {
		p.metrics.noSetBodyBig.Inc()
	} else {
		p.metrics.malformed.Inc()
	}
	p.metrics.counters.noSet[codeClass(status)].Add(1)
	writeJSONError(ctx, status, msg, "", "")
	ctx.SetConnectionClose()
	markLinger(ctx.Conn())
	p.logAccess(ctx, nil, "", parseErrorReason(status), status, 0, time.Now(), 0)
}

// lifecycleReady reports whether a replica's own view allows traffic —
// ready and not down in gossip — whatever this proxy's health checks say.
func lifecycleReady(r *balancer.Replica) bool { return r.State == balancer.StateReady && !r.Down }
