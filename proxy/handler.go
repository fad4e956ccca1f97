package proxy

import (
	"bytes"
	"time"

	"keyway/proxy/internal/field"
	"keyway/proxy/internal/wire"

	"github.com/valyala/fasthttp"
)

// localReason says why keyway answered a request itself.
type localReason uint8

const (
	lrNoKey         localReason = iota // 400: no key and fallback reject
	lrBadKey                           // 400: key in a non-canonical form
	lrDupKey                           // 400: the key header or query parameter sent twice
	lrBodyTooLarge                     // 413
	lrClientBody                       // 400 or 408: the client's body broke off or stalled
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

var localReasonNames = [localReasons]string{"no_key", "bad_key", "duplicate_key", "body_too_large", "client_body", "no_replica", "unreachable", "upstream_error", "upstream_timeout", "internal", "set_stopped", "overloaded", "set_overloaded", "replica_saturated", "memory", "queue_timeout"}

func (r localReason) String() string { return localReasonNames[r] }

// request is one request's way through keyway: made by handle and passed
// by pointer down the path (route, forward, the wire round trip, the
// reply), never kept after handle returns. What one step decided is a
// field here, not state a later step reads back out of the connection.
type request struct {
	ctx   *fasthttp.RequestCtx
	start time.Time // when fasthttp had read the request
	// fields are the head's fields of interest (field.Of), or field.All
	// where the head cannot tell.
	fields fields
	rs     *replicaSet // nil until a set matched
	// body is the request's body as it is forwarded (buffered up to its
	// buffer, the rest streamed), or nil for a request without one.
	body *wire.Body

	// Set by forward (prepare) for the request's attempts.
	deadline    time.Time // timeouts.request from start
	clientClose bool      // the client asked to close its connection
	http10      bool      // the client spoke HTTP/1.0 (forwarded as 1.1)
	lines       *[]byte   // forwarding header lines written after the head; nil: set in the header
	ownID       bool      // keyway gave the request its ID: id
	id          [32]byte

	// Who tried: the last replica tried, the attempts made, the time spent
	// in exchanges with replicas; named is the replica an answer names
	// when none was tried. For the answer and the access log.
	last     *Backend
	tried    int
	upstream time.Duration
	named    string
}

// requestID returns the ID keyway gave the request, or nil.
func (r *request) requestID() []byte {
	if !r.ownID {
		return nil
	}
	return r.id[:]
}

// replica names the last replica tried, or "".
func (r *request) replica() string {
	if r.last == nil {
		return r.named
	}
	return r.last.name
}

// handle is the request path: the head's verdict, then route (route.go),
// which forwards (forward.go) and replies (reply.go).
//
// Its defer is open-coded by the compiler (one defer, few returns): no
// defer record per request.
func (p *Proxy) handle(ctx *fasthttp.RequestCtx) {
	p.metrics.inflight.Inc()
	r := request{ctx: ctx, start: ctx.Time()}
	if r.start.IsZero() {
		r.start = time.Now() // a context that fasthttp's server did not start
	}
	defer func() {
		p.metrics.inflight.Dec()
		if v := recover(); v != nil {
			p.panicked(&r, v)
		}
		if p.draining.Load() {
			// The proxy is stopping: the client learns it with this
			// answer, and sends its next request elsewhere.
			ctx.SetConnectionClose()
		}
		if r.body != nil {
			// The request's body may point into the body's buffer.
			ctx.Request.ResetBody()
			wire.ReleaseBody(r.body)
		}
	}()
	if v := p.headVerdict(&r); v != vOK {
		p.reply(&r, p.refusal(&r, v))
		return
	}
	p.route(&r)
}

// headVerdict is keyway's verdict on the request's head, from its
// connection's scan where it followed the head (one pass over the head's
// bytes, as they were read, found its framing and fields), else from the
// raw header block. It notes the head's fields in r.fields. Besides
// checkHead's verdicts it refuses a head the scan saw end in a bare LF,
// and "Transfer-Encoding: identity": fasthttp reads it as no coding at all
// (the body framed by Content-Length, or empty) and drops the field, but
// RFC 9112 has no identity coding: chunked is not the final coding, so the
// body's length cannot be determined (section 6.3), and with
// Content-Length it is the Transfer-Encoding and Content-Length conflict
// that other readers frame differently.
func (p *Proxy) headVerdict(r *request) verdict {
	h := &r.ctx.Request.Header
	r.fields = field.All
	if h.ConnectionClose() {
		if v := refused(h); v != vOK {
			return v
		}
	}
	s := wire.HeadOf(r.ctx.Conn())
	if s != nil && s.Bare() {
		// A head fasthttp took although it ended in a bare LF, which
		// checkHead cannot see: a request line ended by a bare LF and
		// then an empty line "\r\n" (fasthttp's empty header block).
		return vBareLF
	}
	v, f, known := checkHead(h, s)
	if v != vOK {
		return v
	}
	cl := h.ContentLength()
	if cl == -1 {
		return vOK // chunked: read as such; its trailer fields are unknown
	}
	if known {
		r.fields = f
	}
	var te bool
	if s != nil && s.Done() {
		n, _, _ := s.TransferEncoding()
		te = n > 0
	} else {
		te = rawHasHeader(h.RawHeaders(), hdrTransferEncLower)
	}
	switch {
	case !te:
		return vOK
	case emptyChunked(h, s):
		return vOK
	case cl >= 0:
		return vLengthConflict
	}
	return vNotChunked
}

// checkFraming returns keyway's answer to a request whose head it must
// not forward, or the zero verdict.
func checkFraming(h *fasthttp.RequestHeader) verdict {
	v, _, _ := checkHead(h, nil)
	return v
}

// checkHead is checkFraming for a head the connection's scan s followed
// (nil: none did): the fields come from the scan where it can tell, else
// from the raw header block. It also returns the fields, and whether they
// are known (else the verdict came from fasthttp's parsed fields).
func checkHead(h *fasthttp.RequestHeader, s *wire.HeadScan) (verdict, fields, bool) {
	// fasthttp takes a bare-LF empty line as the head's end only when a
	// CRLF CRLF follows somewhere in what it has buffered (a body, the
	// next request); without one it waits (see wire.HeadScan). Refuse such a
	// head always, so that the answer does not depend on what came after
	// it in the same read.
	if bareEnd(h.RawHeaders()) {
		return vBareLF, 0, false
	}
	if badVersion(h.Protocol()) {
		return vVersion, 0, false
	}
	if bytes.Equal(h.Method(), strMethodConnect) {
		// A replica is not a tunnel; RFC 9110 §9.3.6 makes CONNECT a
		// proxy's method, and keyway is a reverse proxy.
		return vConnect, 0, false
	}
	// With Transfer-Encoding: chunked fasthttp drops a Content-Length and
	// reads the chunks (RFC 9112 §6.3 allows it, closing the connection
	// after). Such a request is a smuggling attempt or a broken client:
	// refuse it, as the RFC suggests ("ought to be handled as an error").
	// The names in the head (the scan's, or the raw block's) tell which
	// fields there are, and that every name is a token; where they cannot
	// tell, the header is asked.
	f, ok := fields(0), false
	if s != nil {
		f, ok = s.Fields(h.RawHeaders())
	}
	if !ok {
		f, ok = field.InBlock(h.RawHeaders())
	}
	if ok {
		if f&field.ContentLength != 0 && (h.ContentLength() == -1 || f&field.TransferEncoding != 0 && len(h.PeekBytes(hdrTransferEncoding)) > 0) {
			return vLengthConflict, f, true
		}
		return vOK, f, true
	}
	return fieldsVerdict(h), 0, false
}

// badVersion reports whether p is a protocol version keyway refuses with
// 505: fasthttp takes any HTTP/<digit>.<digit>; RFC 9112 §2.3: a 1.x
// request with a higher minor version is served as 1.1, another major
// version is refused.
func badVersion(p []byte) bool {
	return len(p) != len("HTTP/1.1") || !bytes.HasPrefix(p, strHTTP1Prefix) || p[7] < '0' || p[7] > '9'
}

// bareEnd reports whether a raw header block (its fields and the empty
// line that ends it) ends with an empty line after a bare LF, or with a
// bare LF as the empty line.
func bareEnd(raw []byte) bool {
	n := len(raw)
	if n < 2 || raw[n-1] != '\n' {
		return false
	}
	return raw[n-2] == '\n' || n >= 4 && raw[n-2] == '\r' && raw[n-3] == '\n' && raw[n-4] != '\r'
}

// emptyChunked reports whether fasthttp read the request's body as
// chunked and found it empty: it then gives the request a Content-Length
// of 0 and drops Transfer-Encoding, as it does for "identity". The head
// scan kept the field's value: one "chunked", and no Content-Length
// field. A head the scan did not follow (pipelined) cannot tell, and
// keeps the conflict's 400.
func emptyChunked(h *fasthttp.RequestHeader, s *wire.HeadScan) bool {
	if h.ContentLength() != 0 || s == nil || !s.Done() || s.ContentLength() {
		return false
	}
	n, te, ok := s.TransferEncoding()
	return n == 1 && ok && bytes.EqualFold(bytes.Trim(te, " \t\r"), strChunked)
}
