package proxy

import (
	"errors"
	"math"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Replies: a replica's answer relayed (relay), or keyway's own (reply),
// and for each one access-log line.

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
		markLinger(ctx.Conn())
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
	if f&fPressure != 0 { // a pressure header: the only way to say it
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
	if f&hopFields != 0 {
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
	case errors.Is(err, errBareLF):
		a.msg = errBareLF.Error()
	case errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding):
		a.status, a.msg = transferCodingAnswer(headScanOf(ctx.Conn()))
	case errors.As(err, &small):
		a.status, a.msg = p.headTooLarge(ctx)
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		// The headers were read: name the set whose limit applies. The
		// server-wide limit is the largest max_body_bytes of all sets.
		if r.rs = p.matchSet(ctx.Host(), ctx.URI().PathOriginal()); r.rs != nil {
			a.reason, a.status, a.msg = lrBodyTooLarge, fasthttp.StatusRequestEntityTooLarge,
				"request body exceeds max_body_bytes ("+ByteSize(r.rs.maxBody).String()+") of this replica set"
			break
		}
		a.status, a.msg = fasthttp.StatusRequestEntityTooLarge, "request body exceeds the largest max_body_bytes of all replica sets ("+ByteSize(p.server.MaxRequestBodySize).String()+")"
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
