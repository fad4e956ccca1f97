package proxy

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
	"keyway/proxy/internal/field"
	"keyway/proxy/internal/wire"
)

// forward sends a request to its candidates in order, following the
// delivery contract: a request that never reached a replica may go to the
// next candidate; one whose fate is unknown only if it is replayable. A
// keyed request is never moved because its replica is full or saturated:
// it is shed. keyed says the request has a key, whose hash is hash (for
// the route context). It replies: the replica's answer (relay) or
// keyway's own (fail).
func (p *Proxy) forward(r *request, t *balancer.Table[*Backend], cands []uint16, keyed bool, hash uint64) {
	rs := r.rs
	r.deadline = r.start.Add(rs.timeout)
	var ring, key []byte
	var keyBuf [128]byte
	if rs.routeHdr != nil {
		ring = rs.st.ringID(t)
		if keyed {
			// Before prepare: the key's sources as the client sent them.
			uri := r.ctx.URI()
			key, _ = appendCanonicalKey(keyBuf[:0], rs, &r.ctx.Request.Header, uri.PathOriginal(), uri)
		}
	}
	p.prepare(r)
	tr := tries{t0: r.start, shed: localReasons}
	n := min(len(cands), rs.attempts)
	for i := 0; i < n; i++ {
		b := t.Backend(int(cands[i]))
		r.last = b
		if !p.admitAttempt(r, b, &tr, keyed || i == n-1) {
			if keyed {
				break
			}
			continue
		}
		if i > 0 && !tr.same {
			rs.retries.Inc() // keyway_retries_total: retries on another candidate
		}
		tr.same = false
		if rs.routeHdr != nil {
			setRouteContext(&r.ctx.Request.Header, rs.routeHdr, t, keyed, hash, key, int(cands[i]), ring)
		}
		out, f := p.exchange(r, b, &tr)
		if out.Err == nil {
			releaseLines(r)
			p.relay(r, b, f, tr.end, tr.end.Sub(tr.t0))
			return
		}
		if err := r.body.Err(); err != nil {
			// The client's body broke off, stalled or went past its
			// limit while it was streamed: the client failed, not the
			// replica.
			releaseLines(r)
			restoreRequest(r)
			p.reply(r, bodyAnswer(rs, err))
			return
		}
		switch p.failed(r, b, out, &tr, keyed) {
		case tryAgain:
			i-- // the same candidate, once more
		case stop:
			i = n
		}
	}
	releaseLines(r)
	p.fail(r, &tr)
}

// tries is forward's state across its attempts.
type tries struct {
	t0, end     time.Time // when the current attempt's exchange began and ended
	same        bool      // this attempt tries the previous one's replica again
	sameRetried bool      // the one try again on the same replica is used up
	kind        errKind   // the last failure's kind
	err         error     // and its error
	// shed is why the last candidate was passed over without an attempt
	// (lrOverloaded, lrSaturated, lrQueueTimeout), or localReasons when
	// it was tried; wait is how long to wait then (Retry-After).
	shed localReason
	wait time.Duration
}

// next is what forward does after a failed attempt.
type next uint8

const (
	nextCandidate next = iota
	tryAgain           // the same candidate, on a fresh connection
	stop               // no further attempt
)

// admitAttempt takes a slot of b for the request (queueing for one when
// mayQueue and the set has a queue), unless b said it is saturated. A
// request passed over says why in tr.shed.
func (p *Proxy) admitAttempt(r *request, b *Backend, tr *tries, mayQueue bool) bool {
	l := &r.rs.limits
	if until := b.saturatedUntil.Load(); until != 0 {
		if wait := time.Duration(until - r.start.UnixNano()); wait > 0 {
			tr.shed, tr.wait = lrSaturated, wait
			return false
		}
	}
	maxQueued := 0
	if mayQueue {
		maxQueued = l.queue
	}
	ok, queued := b.acquire(l.perReplica, maxQueued, l.queueWait, r.deadline)
	if !ok {
		tr.shed, tr.wait = lrOverloaded, time.Second
		if queued {
			tr.shed = lrQueueTimeout
		}
		return false
	}
	// A first attempt that waited in no queue began its exchange when the
	// request started (the routing before it takes a microsecond or two,
	// which its upstream time then includes): a clock read spared, a few
	// percent of a request.
	if queued || r.tried > 0 || tr.same {
		tr.t0 = time.Now()
	}
	tr.shed = localReasons
	r.tried++
	return true
}

// acquire takes one of b's bound slots, waiting in b's queue for at most
// wait when they are all taken and fewer than maxQueued wait already. It
// reports whether a slot was taken, and whether the request queued.
func (b *Backend) acquire(bound int64, maxQueued int, wait time.Duration, deadline time.Time) (ok, queued bool) {
	if b.inflight.Add(1) <= bound {
		return true, false
	}
	b.inflight.Add(-1)
	if maxQueued <= 0 || wait <= 0 {
		return false, false
	}
	if left := time.Until(deadline); left < wait {
		// The wait counts against the request's timeout.
		if wait = left; wait <= 0 {
			return false, false
		}
	}
	q := &b.queue
	q.mu.Lock()
	if len(q.q) >= maxQueued {
		q.mu.Unlock()
		return false, false
	}
	w := waiterPool.Get().(*queueWaiter)
	q.q = append(q.q, w)
	q.waiting.Add(1)
	// Announced; now a slot freed before this point is seen here, and one
	// freed after it is handed over.
	if b.inflight.Add(1) <= bound {
		q.q = q.q[:len(q.q)-1]
		q.waiting.Add(-1)
		q.mu.Unlock()
		waiterPool.Put(w)
		return true, true
	}
	b.inflight.Add(-1)
	q.mu.Unlock()

	w.timer.Reset(wait)
	select {
	case <-w.ready:
		w.timer.Stop()
		waiterPool.Put(w)
		return true, true
	case <-w.timer.C:
	}
	q.mu.Lock()
	if i := slices.Index(q.q, w); i >= 0 {
		q.q = slices.Delete(q.q, i, i+1)
		q.waiting.Add(-1)
		q.mu.Unlock()
		waiterPool.Put(w)
		return false, true
	}
	q.mu.Unlock()
	// A slot was handed over as the wait ran out: it is this request's.
	<-w.ready
	waiterPool.Put(w)
	return true, true
}

// exchange is one attempt on b, whose slot the request holds: the wire
// round trip, then the checks of its reply. It returns the outcome and
// the reply's fields (scanReply).
func (p *Proxy) exchange(r *request, b *Backend, tr *tries) (wire.Outcome, fields) {
	rs := r.rs
	pool := b.pool.Load()
	var lines []byte
	if r.lines != nil {
		lines = *r.lines
	}
	if r.body != nil && r.body.Bytes() == nil {
		// Not one slice (longer than a chunk, or streamed past the
		// buffer): each attempt reads the body from its start (failed
		// makes no further attempt once a byte beyond the buffer left).
		r.body.Rewind()
		r.ctx.Request.SetBodyStream(r.body, int(r.body.Size()))
	}
	opts := wire.ReplyOpts{Buffer: p.bodyBuffer, Limit: int(rs.cfg.MaxResponseBodyBytes), Whole: r.http10}
	out := wire.RoundTrip(b.hc, &r.ctx.Request, &r.ctx.Response, r.deadline, lines, opts)
	// The slot back (as release does, written out here: inlined by
	// hand, no call back into this file on the request's way out).
	if b.inflight.Add(-1); b.queue.waiting.Load() != 0 {
		b.handOver(rs.limits.perReplica)
	}
	if b.released.Load() || b.pool.Load() != pool {
		// The pool was retired while this request used it (a reload
		// renewed it, the replica left, or a new incarnation replaced the
		// replica's process): close the connection the request just
		// returned to it.
		b.hc.CloseIdleConnections()
	}
	var f fields
	if out.Err == nil {
		var valid bool
		if code := r.ctx.Response.StatusCode(); code < 200 || code > 599 {
			// fasthttp consumes interim replies (1xx but 101) and reads
			// "001" as 1. What is left is no final answer a client could
			// take: 101 (keyway forwards no Upgrade, so a replica has
			// switched protocols unasked), a status fasthttp could not
			// read as three digits, or 600-999, which RFC 9110 does not
			// define.
			out.Err = errBadStatus
		} else if valid, f = scanReply(&r.ctx.Response.Header, rs.limits.pressure); !valid {
			out.Err = errMalformedReply
		}
		if out.Err != nil {
			// The reply was read whole and its connection pooled; a
			// replica that answers this way may have left the connection
			// in any state (a switched protocol, a body framed some other
			// way): close the idle connections rather than send the next
			// request into it.
			b.hc.CloseIdleConnections()
		}
	}
	tr.end = time.Now()
	r.upstream += tr.end.Sub(tr.t0)
	return out, f
}

// failed accounts for a failed attempt on b (its counters, its ejection
// on a refused connection, the passive checks' evidence) and says what
// forward does next.
func (p *Proxy) failed(r *request, b *Backend, out wire.Outcome, tr *tries, keyed bool) next {
	rs := r.rs
	tr.kind, tr.err = classifyAttempt(out, b)
	b.ctr.upErrs[tr.kind].Add(1)
	p.blame(rs, b, tr.kind, tr.err, tr.end.Sub(tr.t0), tr.end)
	if ce := p.log.Check(zapcore.DebugLevel, "upstream attempt failed"); ce != nil {
		ce.Write(zap.String("set", rs.name), zap.String("replica", b.name), zap.Stringer("kind", tr.kind), zap.Error(tr.err), zap.Int("attempt", r.tried))
	}
	if !tr.sameRetried && (tr.kind == errStale || tr.kind == errReusedClosed && r.replayable()) {
		// The pooled connection was dead, not necessarily the replica.
		// Its other idle connections are suspect too (a restart or an
		// idle timeout closes them all): drop them, and try the same
		// replica once more on a fresh connection. If it crashed, that
		// dial is refused and ejects it. A stale connection sent nothing:
		// the try again is not another attempt. A reused connection
		// closed before any reply byte may have delivered the request (it
		// is replayable, or we would not be here): the try again is
		// another attempt, on the same candidate.
		tr.sameRetried, tr.same = true, true
		b.hc.CloseIdleConnections()
		if tr.kind == errStale {
			r.tried--
		}
		return tryAgain
	}
	if tr.kind == errNoFreeConns {
		// The replica's pool is full: it is overloaded, not down.
		tr.shed, tr.wait = lrOverloaded, time.Second
		if keyed {
			return stop
		}
	}
	if tr.kind == errReplyTooLarge || !tr.kind.neverSent() && !r.replayable() || !time.Now().Before(r.deadline) || r.body.Streamed() {
		// A body streamed beyond its buffer is gone: it cannot be sent
		// again, whatever the method.
		return stop
	}
	return nextCandidate
}

// blame takes a failed attempt on b, of kind k, as what it says of the
// replica: a refused connection holds it out of rotation on this proxy,
// a refused TLS handshake is logged, and evidence goes to the passive
// checks (Observer).
func (p *Proxy) blame(rs *replicaSet, b *Backend, k errKind, err error, d time.Duration, end time.Time) {
	if k == errDial && isRefused(err) {
		p.ejectRefused(rs, b)
	}
	if k == errTLS {
		p.handshakeFailed(rs.name, b, err)
	}
	if k.evidence() {
		b.lastFail.Store(end.UnixNano())
		if p.opts.Observer != nil {
			p.opts.Observer.Observe(rs.name, b.name, 0, err, d)
		}
	}
}

// fail answers a request no replica answered, from why the last
// candidate failed or was passed over.
func (p *Proxy) fail(r *request, tr *tries) {
	rs := r.rs
	restoreRequest(r)
	a := answer{reason: lrUpstream, status: 502}
	if r.clientClose {
		a.conn = connClose
	}
	if tr.shed != localReasons {
		r.last.ctr.shed[shedIndex(tr.shed)].Add(1)
		m := r.last.shedMessages(&rs.limits)
		a.reason, a.status, a.retry = tr.shed, rs.limits.status, tr.wait
		switch tr.shed {
		case lrSaturated:
			a.status, a.msg = 503, m.saturated
		case lrQueueTimeout:
			a.msg = m.queueTimeout
		default:
			a.msg = m.overloaded
		}
	} else {
		a.reason, a.status, a.msg = failure(rs, tr.kind)
	}
	p.reply(r, a)
	if ce := p.log.Check(zapcore.DebugLevel, "request failed"); ce != nil {
		ce.Write(zap.String("set", rs.name), zap.String("replica", r.replica()), zap.Error(tr.err))
	}
}

// failure is keyway's answer to a request whose last attempt failed with
// a failure of kind k.
func failure(rs *replicaSet, k errKind) (localReason, int, string) {
	switch {
	case k.neverSent():
		return lrUnreachable, 503, "no replica could be reached for this request (" + k.String() + "); it was not delivered: retry"
	case k == errTimeout:
		return lrTimeout, 504, "the replica did not answer within " + rs.timeout.String() + "; the request may or may not have been processed"
	case k == errReplyTooLarge:
		return lrUpstream, 502, "the replica's reply body exceeds max_response_body_bytes (" + ByteSize(rs.cfg.MaxResponseBodyBytes).String() + ") of this replica set: the replica answered, its reply is not relayed"
	case k == errReusedClosed:
		return lrUpstream, 502, "the replica closed a reused connection as the request was sent (" + k.String() + "); the request may or may not have been processed"
	}
	return lrUpstream, 502, "the replica failed after the request was sent (" + k.String() + "); the request may or may not have been processed"
}

// replayable reports whether a request may be sent again once it may have
// reached a replica: its body was not streamed beyond its buffer, and its
// method is idempotent, or it carries the set's
// idempotency header (an X-Request-Id one counts where keyway gave the
// request its ID, which every attempt carries). It is asked only after a
// failed attempt, so that a request that succeeds at once looks no header
// up.
func (r *request) replayable() bool {
	rs, h := r.rs, &r.ctx.Request.Header
	if r.body.Streamed() {
		return false // the body's bytes beyond its buffer are gone
	}
	return isIdempotent(h.Method()) || len(rs.idem) > 0 && (len(h.PeekBytes(rs.idem)) > 0 || rs.idemIsID && r.ownID)
}

func isIdempotent(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// The forwarding headers (X-Forwarded-For, -Proto, -Host, X-Request-Id).
// Set through fasthttp's header API, each costs a copy of its value, a
// check for line breaks, a comparison with the special headers, a walk of
// every field and two more copies into the field list: about 1,300
// instructions per request for the four. For a request whose head names
// none of the first three nor Transfer-Encoding or Trailer (almost every
// request: its fields tell), prepare builds their lines once, and every
// attempt's round trip writes them after fasthttp's head (wire.RoundTrip),
// in the same bytes as the header API would. Any other request gets the
// header API.

// lineBufs are the buffers of requests' forwarding lines.
var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 192); return &b }}

// prepare turns the client's request into the one sent upstream:
// hop-by-hop headers out, forwarding headers in, and keyway's own protocol
// version (RFC 9110 §2.5: an intermediary sends its own HTTP-version; an
// HTTP/1.0 request would otherwise close the pooled replica connection).
// It notes whether the client asked to close its connection and whether it
// spoke HTTP/1.0; restoreRequest undoes the version change, which the
// front end reads after the handler to frame its answer.
func (p *Proxy) prepare(r *request) {
	f := r.fields
	// A Transfer-Encoding or Trailer field may make fasthttp write the
	// request chunked, with trailer fields after the body: the lines are
	// spliced only where the body follows the head as it is.
	if p.opts.headerAPIForwarding || f&(field.XFF|field.XFProto|field.XFHost|field.TransferEncoding|field.Trailer) != 0 {
		r.clientClose, r.http10 = rewriteRequest(r.ctx, f)
		return
	}
	ctx := r.ctx
	r.clientClose, r.http10 = rewriteHop(ctx, f)
	r.ownID = true
	if f&field.RequestID != 0 {
		if len(ctx.Request.Header.PeekBytes(hdrRequestID)) > 0 {
			r.ownID = false // the client's own goes on
		} else {
			ctx.Request.Header.DelBytes(hdrRequestID) // an empty one: replaced
		}
	}
	if r.ownID {
		appendRequestID(r.id[:0])
	}
	// Built before the first attempt: fasthttp's writing of the request
	// may rewrite Host (from the URI).
	r.lines = lineBufs.Get().(*[]byte)
	*r.lines = appendForwardLines((*r.lines)[:0], r)
}

// appendForwardLines appends the forwarding header lines for r, each
// ending in CRLF, as the header API would have written them
// (rewriteRequest): the client's address, the scheme, the request's Host
// and, unless the client sent one, keyway's request ID.
func appendForwardLines(dst []byte, r *request) []byte {
	ctx := r.ctx
	dst = append(dst, "X-Forwarded-For: "...)
	dst = appendIP(dst, ctx.RemoteIP())
	if ctx.IsTLS() {
		dst = append(dst, "\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: "...)
	} else {
		dst = append(dst, "\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: "...)
	}
	dst = append(dst, ctx.Request.Header.Host()...)
	dst = append(dst, "\r\n"...)
	if r.ownID {
		dst = append(dst, "X-Request-Id: "...)
		dst = append(dst, r.id[:]...)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

func appendIP(dst []byte, ip net.IP) []byte {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return append(dst, "unknown"...)
	}
	return a.Unmap().AppendTo(dst)
}

// rewriteRequest is prepare for a request whose fields are f, with the
// forwarding headers set through fasthttp's header API.
func rewriteRequest(ctx *fasthttp.RequestCtx, f fields) (clientClose, http10 bool) {
	clientClose, http10 = rewriteHop(ctx, f)
	req := &ctx.Request

	// X-Forwarded-For: append the peer to any list the client sent.
	var buf [128]byte
	xff := buf[:0]
	if f&field.XFF != 0 {
		if prev := req.Header.PeekBytes(hdrXFF); len(prev) > 0 {
			xff = append(xff, prev...)
			xff = append(xff, ", "...)
		}
	}
	xff = appendIP(xff, ctx.RemoteIP())
	// The names are in canonical form: SetCanonical spares normalising them.
	req.Header.SetCanonical(hdrXFF, xff)
	if ctx.IsTLS() {
		req.Header.SetCanonical(hdrXFProto, strHTTPS)
	} else {
		req.Header.SetCanonical(hdrXFProto, strHTTP)
	}
	req.Header.SetCanonical(hdrXFHost, req.Header.Host())
	if f&field.RequestID == 0 || len(req.Header.PeekBytes(hdrRequestID)) == 0 {
		req.Header.SetCanonical(hdrRequestID, appendRequestID(buf[:0]))
	}
	return clientClose, http10
}

// rewriteHop is rewriteRequest but for the forwarding headers: the
// hop-by-hop headers out, Expect out, keyway's protocol version, the
// plain-HTTP scheme for a request that came over TLS.
func rewriteHop(ctx *fasthttp.RequestCtx, f fields) (clientClose, http10 bool) {
	req := &ctx.Request
	clientClose = req.Header.ConnectionClose()
	http10 = !req.Header.IsHTTP11()
	if f&field.Hop != 0 {
		stripRequestHopByHop(&req.Header, f)
	}
	if f&field.Expect != 0 {
		req.Header.DelBytes(hdrExpect) // the front end already answered 100-continue
	}
	req.Header.ResetConnectionClose()
	// fasthttp writes "Content-Type: application/octet-stream" for a body
	// without one unless told not to; Reset clears the flag, so it is set
	// per request. Nothing is injected that the client did not send.
	req.Header.SetNoDefaultContentType(true)
	if http10 {
		req.Header.SetProtocolBytes(strHTTP11)
	}
	if ctx.IsTLS() {
		req.URI().SetSchemeBytes(strHTTP) // the replica speaks plain HTTP
	}
	return clientClose, http10
}

// appendRequestID appends 32 random hex digits (lower case).
func appendRequestID(dst []byte) []byte {
	var b [32]byte
	x, y := rand.Uint64(), rand.Uint64()
	binary.BigEndian.PutUint64(b[0:], hex8(uint32(x>>32)))
	binary.BigEndian.PutUint64(b[8:], hex8(uint32(x)))
	binary.BigEndian.PutUint64(b[16:], hex8(uint32(y>>32)))
	binary.BigEndian.PutUint64(b[24:], hex8(uint32(y)))
	return append(dst, b[:]...)
}

// hex8 returns the eight lower-case hex digits of x, the last in the
// lowest byte (stored big-endian, they read as fmt's %08x): each nibble is
// spread to a byte of its own, and the bytes of the nibbles 10 to 15
// (those that carry into bit 4 when 6 is added) get the distance from
// '9'+1 to 'a' on top of '0'. It spares encoding/hex's loop a byte at a
// time.
func hex8(x uint32) uint64 {
	v := uint64(x)
	v = (v | v<<16) & 0x0000ffff0000ffff
	v = (v | v<<8) & 0x00ff00ff00ff00ff
	v = (v | v<<4) & 0x0f0f0f0f0f0f0f0f
	letters := (v + 0x0606060606060606) >> 4 & 0x0101010101010101
	return v + 0x3030303030303030 + letters*('a'-'9'-1)
}
