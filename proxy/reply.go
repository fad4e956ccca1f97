package proxy

import (
	"bytes"
	"errors"
	"math"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"keyway/balancer"
	"keyway/internal/jsonstr"
	"keyway/proxy/internal/field"
	"keyway/proxy/internal/wire"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Replies: a replica's answer relayed (relay), or keyway's own (reply),
// and for each one access-log line (logAccess).

// answer is what keyway answers a request itself.
type answer struct {
	// reason says why, for a request of a set (keyway_local_responses_total
	// and the access log); why says it for a request of none.
	reason localReason
	why    string
	status int
	msg    string
	// retry is the Retry-After: 0 means one second on a 503 and none on
	// any other status.
	retry time.Duration
	conn  connAfter
}

// connAfter is what becomes of the client's connection after an answer.
type connAfter uint8

const (
	connKeep   connAfter = iota // as the request's own framing says
	connClose                   // closed
	connLinger                  // closed gracefully: what the client still sends is read and dropped (listener.go)
)

var (
	hdrRetryAfter  = []byte("Retry-After")
	strRetryAfter1 = []byte("1")
	strJSON        = []byte("application/json")
)

// reply is keyway's own answer to r: the status and a small JSON body
//
//	{"error": msg, "replica_set": the set ("" when none matched),
//	 "replica": the last replica tried, or the one the decision named ("" when none),
//	 "reason": why the request was shed (absent otherwise)}
//
// with Retry-After on a 503 or a shed request, counted and logged.
func (p *Proxy) reply(r *request, a answer) {
	ctx := r.ctx
	ctx.Response.Reset()
	set, shed, why := "", "", a.why
	if rs := r.rs; rs != nil {
		set, why = rs.name, a.reason.String()
		rs.local[a.reason].Inc()
		rs.counts.local[codeClass(a.status)].Add(1)
		if a.reason >= lrOverloaded {
			shed = why
			rs.counts.shed.Add(1)
			switch a.reason {
			case lrSetOverloaded:
				rs.counts.setShed[0].Add(1)
			case lrMemory:
				rs.counts.setShed[1].Add(1)
			}
		}
	} else if c := p.metrics.noSetAnswer(why); c != nil {
		c.Inc()
		p.metrics.counters.noSet[codeClass(a.status)].Add(1)
	}
	ctx.Response.SetStatusCode(a.status)
	ctx.Response.Header.SetContentTypeBytes(strJSON)
	switch {
	case a.retry > 0:
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, retryAfter(a.retry))
	case a.status == fasthttp.StatusServiceUnavailable:
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, strRetryAfter1)
	}
	setErrorBody(ctx, a.msg, set, r.replica(), shed)
	switch a.conn {
	case connLinger:
		wire.MarkLinger(ctx.Conn())
		fallthrough
	case connClose:
		ctx.SetConnectionClose()
	}
	p.logAccess(r, why, a.status)
}

// errorBodyBufs are scratch buffers for JSON error bodies: an answer
// keyway gives itself (a shed one above all, which comes in floods)
// allocates nothing for its body.
var errorBodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// setErrorBody sets the response's body to reply's JSON.
func setErrorBody(ctx *fasthttp.RequestCtx, msg, set, replica, reason string) {
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

// relay passes on the reply of replica b, whose fields are f (scanReply),
// which took d and ended at end; it notes what the reply says of the
// replica (saturated, failing, answering), counts it and logs it.
func (p *Proxy) relay(r *request, b *Backend, f fields, end time.Time, d time.Duration) {
	rs, ctx := r.rs, r.ctx
	code := ctx.Response.StatusCode()
	var hold time.Duration
	saturated := false
	if f&field.Pressure != 0 { // a pressure header: the only way to say it
		hold, saturated = rs.limits.saturatedFor(&ctx.Response.Header, f)
	}
	if saturated {
		// The replica's own word that it is full: shed its keyed requests
		// for a while rather than move them, and take the answer as no
		// evidence against it (no ejection).
		b.saturatedUntil.Store(end.Add(hold).UnixNano())
	} else if now := end.UnixNano(); code >= 500 {
		b.lastFail.Store(now)
	} else if now-b.lastOK.Load() > vetoGrain {
		// Vetoes need lastOK to a fleet.veto_window (seconds): refreshing
		// it once per vetoGrain spares most requests a write to the
		// backend's shared cache line.
		b.lastOK.Store(now)
	}
	if p.opts.Observer != nil && b.saturatedUntil.Load() <= end.UnixNano() {
		p.opts.Observer.Observe(rs.name, b.name, code, nil, d)
	}
	prepareResponse(ctx, r.clientClose, f)
	restoreRequest(r)
	b.ctr.requests[codeClass(code)].Add(1)
	b.latency.Observe(end.Sub(r.start).Seconds())
	p.logAccess(r, "", code)
}

// prepareResponse cleans a replica's response, whose fields are f (from
// scanReply), before it is relayed.
func prepareResponse(ctx *fasthttp.RequestCtx, clientClose bool, f fields) {
	h := &ctx.Response.Header
	if f&field.Hop != 0 {
		stripResponseHopByHop(h, f)
	}
	h.ResetConnectionClose() // a replica closing its connection must not close the client's
	if clientClose {
		ctx.SetConnectionClose()
	}
}

// panicked answers a request whose handling panicked: 502, logged.
func (p *Proxy) panicked(r *request, v any) {
	p.log.Error("panic in request handler", zap.Any("panic", v), zap.Stack("stack"))
	releaseLines(r)
	p.reply(r, answer{reason: lrInternal, why: "internal", status: fasthttp.StatusBadGateway, msg: "internal proxy error"})
}

// handleParseError is fasthttp's ErrorHandler: it answers requests
// fasthttp could not read, and closes their connection, lingering.
func (p *Proxy) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	// ctx.Time() is not this request's: fasthttp sets it once a request is
	// read whole.
	r := request{ctx: ctx, start: time.Now()}
	a := answer{status: fasthttp.StatusBadRequest, msg: "malformed request", conn: connLinger}
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, wire.ErrBareLF):
		a.msg = wire.ErrBareLF.Error()
	case errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding):
		a.status, a.msg = transferCodingAnswer(wire.HeadOf(ctx.Conn()))
	case errors.As(err, &small):
		a.status, a.msg = p.headTooLarge(ctx)
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		// With StreamRequestBody fasthttp reports no body as too large
		// (TestContractStreamedBodyPastMax): keyway bounds bodies itself.
		// Should one come all the same, the headers were read: name the
		// set whose limit applies.
		if r.rs = p.matchSet(ctx.Host(), ctx.URI().PathOriginal()); r.rs != nil {
			a = tooLarge(r.rs)
			break
		}
		a.status, a.msg = fasthttp.StatusRequestEntityTooLarge, "request body exceeds the largest max_body_bytes of all replica sets ("+ByteSize(p.routes.Load().maxBody).String()+")"
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			a.status, a.msg = fasthttp.StatusRequestTimeout, "request not received within server.read_timeout"
		}
	}
	a.why = parseErrorReason(a.status)
	p.reply(&r, a)
}

func codeClass(code int) int {
	if code < 100 || code > 599 {
		return 5
	}
	return code / 100
}

// releaseLines gives the request's forwarding lines' buffer back.
func releaseLines(r *request) {
	if b := r.lines; b != nil {
		r.lines = nil
		if cap(*b) <= 4<<10 {
			lineBufs.Put(b)
		}
	}
}

// restoreRequest gives the client's request back its protocol version.
func restoreRequest(r *request) {
	if r.http10 {
		r.ctx.Request.Header.SetProtocolBytes(strHTTP10)
	}
}

// The access log: one JSON object per request, one line each, built by
// appending into a pooled buffer (no allocation per request) and handed to
// Options.AccessLog. The fields are documented in docs/logging.md.

// Bounds on what a client controls, so that one request cannot make a
// huge line: longer values are cut (at a UTF-8 boundary).
const (
	maxLogPath      = 4096 // the raw path; "path_truncated":true says it was cut
	maxLogHost      = 256
	maxLogRequestID = 128
	maxLogMethod    = 32
	maxLogKey       = 512 // key: plain
	// A buffer that grew beyond this for a huge line is not pooled.
	maxPooledLine = 64 << 10
)

// redactedSegment replaces a key's segment in a logged path, whatever
// log.access.key says: the path never carries the key, which is personal
// data more often than not.
const redactedSegment = "{key}"

// accessLine is a pooled line buffer with scratch space.
type accessLine struct {
	buf []byte // the line
	tmp []byte // the redacted path, the key
	out []byte // the key's logged form
}

// logAccess writes one access-log line for r, if the access log is on:
// reason is "" when a replica answered, else why keyway answered itself.
func (p *Proxy) logAccess(r *request, reason string, status int) {
	if p.access == nil {
		return
	}
	l, _ := p.accessBufs.Get().(*accessLine)
	if l == nil {
		l = &accessLine{buf: make([]byte, 0, 1024)}
	}
	l.buf = p.appendAccess(l, r, reason, status)
	_, _ = p.access.Write(l.buf)
	if cap(l.buf) <= maxPooledLine && cap(l.tmp) <= maxPooledLine {
		p.accessBufs.Put(l)
	}
}

// appendAccess builds the line in l.buf[:0] and returns it.
func (p *Proxy) appendAccess(l *accessLine, r *request, reason string, status int) []byte {
	ctx, rs, start, replica := r.ctx, r.rs, r.start, r.replica()
	now := time.Now()
	b := append(l.buf[:0], `{"time":"`...)
	b = start.UTC().AppendFormat(b, time.RFC3339Nano)

	b = append(b, `","request_id":`...)
	id := ctx.Request.Header.PeekBytes(hdrRequestID)
	if len(id) == 0 {
		id = r.requestID() // keyway's, written after the head by the round trip
	}
	if len(id) == 0 {
		// keyway answered before forwarding, which sets one: give the line
		// an id of its own, in the same form.
		l.tmp = appendRequestID(l.tmp[:0])
		id = l.tmp
	}
	b, _ = appendJSONString(b, id, maxLogRequestID)

	b = append(b, `,"client":"`...)
	b = appendAddr(b, ctx.RemoteAddr())
	b = append(b, `","method":`...)
	b, _ = appendJSONString(b, ctx.Request.Header.Method(), maxLogMethod)
	b = append(b, `,"host":`...)
	b, _ = appendJSONString(b, ctx.Request.Header.Host(), maxLogHost)

	b = append(b, `,"path":`...)
	path := ctx.URI().PathOriginal()
	if rs != nil {
		l.tmp = redactKeySegments(l.tmp[:0], path, rs.sources)
		path = l.tmp
	}
	b, cut := appendJSONString(b, path, maxLogPath)
	if cut {
		b = append(b, `,"path_truncated":true`...)
	}

	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"set":"`...)
	if rs != nil {
		b = append(b, rs.name...) // a valid set name needs no escaping
	}
	b = append(b, `","replica":`...)
	b, _ = appendJSONString(b, replica, len(replica))
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(r.tried), 10)
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendInt(b, bytesIn(r), 10)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendInt(b, bytesOut(&ctx.Response), 10)
	b = append(b, `,"duration":`...)
	b = appendSeconds(b, now.Sub(start))
	b = append(b, `,"upstream_duration":`...)
	b = appendSeconds(b, r.upstream)
	if reason != "" {
		b = append(b, `,"reason":"`...)
		b = append(b, reason...) // keyway's own words: no escaping needed
		b = append(b, '"')
	}
	if p.accessKey != nil && rs != nil {
		uri := ctx.URI()
		if key, ok := appendCanonicalKey(l.tmp[:0], rs, &ctx.Request.Header, uri.PathOriginal(), uri); ok {
			l.tmp = key
			l.out = p.accessKey(l.out[:0], key)
			b = append(b, `,"key":`...)
			b, _ = appendJSONString(b, l.out, maxLogKey)
		}
	}
	return append(b, "}\n"...)
}

// appendSeconds appends d in seconds, with up to nanosecond precision.
func appendSeconds(b []byte, d time.Duration) []byte {
	if d < 0 {
		d = 0
	}
	return strconv.AppendFloat(b, d.Seconds(), 'f', -1, 64)
}

// appendAddr appends a client address as ip:port ([ip]:port for IPv6).
func appendAddr(b []byte, a net.Addr) []byte {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			break
		}
		return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port)).AppendTo(b)
	case nil:
		return b
	}
	// Not TCP (tests' in-memory pipes): rare, so the allocation is fine;
	// escaped, since the address's String is not ours.
	b, _ = jsonstr.AppendEscaped(b, a.String(), math.MaxInt)
	return b
}

// redactKeySegments appends path with every segment a path_segment key
// source of the set reads replaced by "{key}": the key reaches the log
// only through the key field, in the form log.access.key chose.
func redactKeySegments(dst, path []byte, sources []keySource) []byte {
	seg := false
	for i := range sources {
		seg = seg || sources[i].kind == keyPathSegment
	}
	if !seg || len(path) == 0 || path[0] != '/' {
		return append(dst, path...)
	}
	rest := path[1:]
	for n := 1; ; n++ {
		dst = append(dst, '/')
		s := rest
		j := bytes.IndexByte(rest, '/')
		if j >= 0 {
			s, rest = rest[:j], rest[j+1:]
		}
		redact := false
		for i := range sources {
			redact = redact || sources[i].kind == keyPathSegment && sources[i].segment == n
		}
		if redact && len(s) > 0 {
			dst = append(dst, redactedSegment...)
		} else {
			dst = append(dst, s...)
		}
		if j < 0 {
			return dst
		}
	}
}

// bytesIn is the bytes of r's body keyway read: a body left unread (the
// request was answered before it) is not read for the log.
func bytesIn(r *request) int64 {
	switch {
	case r.body != nil:
		return r.body.BytesRead()
	case r.ctx.Request.IsBodyStream():
		return 0
	}
	return int64(len(r.ctx.Request.Body()))
}

// bytesOut is the bytes of the answer's body: for one streamed to the
// client after the log line is written, its Content-Length (0 when it is
// chunked).
func bytesOut(resp *fasthttp.Response) int64 {
	if resp.IsBodyStream() {
		return int64(max(resp.Header.ContentLength(), 0))
	}
	return int64(len(resp.Body()))
}

// appendCanonicalKey appends the request's key as routing used it: the
// first source present decides, in the canonical form the balancer hashes
// (its Append functions are its Hash functions' own extraction: HashKey of
// the result is the hash the request was routed by). ok is false for a
// request without a key, with a malformed one or with two.
func appendCanonicalKey(dst []byte, rs *replicaSet, h *fasthttp.RequestHeader, path []byte, uri *fasthttp.URI) ([]byte, bool) {
	for i := range rs.sources {
		src := &rs.sources[i]
		var st balancer.KeyStatus
		switch src.kind {
		case keyHeader:
			dst, st = balancer.AppendHeaderValuesKey(dst, h.PeekAll(src.header))
		case keyPathSegment:
			dst, st = balancer.AppendPathSegmentKey(dst, path, src.segment)
		default:
			dst, st = balancer.AppendQueryKey(dst, uri.QueryString(), src.name)
		}
		if st != balancer.KeyMissing {
			return dst, st == balancer.KeyOK
		}
	}
	return dst, false
}

// appendJSONString appends s, cut to at most max bytes, as a JSON string
// (quoted) and reports whether it was cut: keyway's one escaper,
// jsonstr.AppendCut, under the name the proxy's files use.
func appendJSONString[S string | []byte](b []byte, s S, max int) ([]byte, bool) {
	return jsonstr.AppendCut(b, s, max)
}

// parseErrorReason names, for the access log, why keyway answered a
// request fasthttp could not read, from the status it chose.
func parseErrorReason(status int) string {
	switch status {
	case fasthttp.StatusRequestHeaderFieldsTooLarge:
		return "headers_too_large"
	case fasthttp.StatusRequestURITooLong:
		return "uri_too_long"
	case fasthttp.StatusRequestEntityTooLarge:
		return "body_too_large"
	case fasthttp.StatusRequestTimeout:
		return "read_timeout"
	}
	return "malformed"
}
