package proxy

import (
	"bytes"
	"errors"
	"strconv"

	"keyway/proxy/internal/field"
	"keyway/proxy/internal/wire"

	"github.com/valyala/fasthttp"
)

// Request framing checks fasthttp leaves to keyway. fasthttp's parser
// already answers 400 for most malformed requests (see the table in
// docs/proxy.md); what it accepts and keyway must not forward is checked
// here, when the head is read (headerReceived), before any body is.

// verdict is keyway's answer to a request whose framing it refuses.
type verdict uint8

const (
	vOK verdict = iota
	vVersion
	vConnect
	vLengthConflict
	vHeaderName
	vNoHost
	vBareLF
	vNotChunked
	vTooLarge
)

var verdicts = [...]struct {
	status int
	msg    string
}{
	vOK:             {},
	vVersion:        {fasthttp.StatusHTTPVersionNotSupported, "HTTP version not supported: use HTTP/1.1 or HTTP/1.0"},
	vConnect:        {fasthttp.StatusNotImplemented, "method CONNECT is not supported"},
	vLengthConflict: {fasthttp.StatusBadRequest, "request has both Transfer-Encoding and Content-Length"},
	vHeaderName:     {fasthttp.StatusBadRequest, "request has a header name with a character outside RFC 9110's token characters"},
	vNoHost:         {fasthttp.StatusBadRequest, "request has no Host header"},
	vBareLF:         {fasthttp.StatusBadRequest, wire.ErrBareLF.Error()},
	vNotChunked:     {fasthttp.StatusBadRequest, msgNotChunked},
	vTooLarge:       {fasthttp.StatusRequestEntityTooLarge, "request Content-Length exceeds the largest max_body_bytes of all replica sets: the body was not read"},
}

const msgNotChunked = "request has a Transfer-Encoding whose final coding is not chunked: its body's length cannot be determined (RFC 9112 section 6.3); send Transfer-Encoding: chunked or Content-Length"

var (
	strMethodConnect    = []byte("CONNECT")
	strHTTP1Prefix      = []byte("HTTP/1.")
	hdrContentLength    = []byte("content-length")
	hdrTransferEncoding = []byte("Transfer-Encoding")
	hdrTransferEncLower = []byte("transfer-encoding")
	strChunked          = []byte("chunked")
)

// fieldsVerdict is checkFraming's verdict on the fields, from the header
// as fasthttp parsed it.
func fieldsVerdict(h *fasthttp.RequestHeader) verdict {
	if (h.ContentLength() == -1 || len(h.PeekBytes(hdrTransferEncoding)) > 0) && rawHasHeader(h.RawHeaders(), hdrContentLength) {
		return vLengthConflict
	}
	// fasthttp accepts a space inside a header name ("X A: b"), which is
	// not a token: a replica could read the line differently.
	for k := range h.All() {
		for _, c := range k {
			if !field.Token[c] {
				return vHeaderName
			}
		}
	}
	return vOK
}

// rawHasHeader reports whether the raw header block (name: value lines,
// CRLF or LF ended) has a field named name (lower case).
func rawHasHeader(raw, name []byte) bool {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if i := bytes.IndexByte(line, ':'); i >= 0 && bytes.EqualFold(bytes.TrimRight(line[:i], " \t"), name) {
			return true
		}
	}
	return false
}

// hdrRefused marks a request headerReceived refused; its value is the
// verdict's index in verdicts. No client can send it: its name is not a
// token, and a request with such a name is refused, which overwrites it.
var hdrRefused = []byte("Keyway Refused")

// headerReceived is fasthttp's HeaderReceived hook: it refuses, before
// any body is read, a head keyway can judge from the header alone at no
// cost: one ending in a bare-LF empty line, a version keyway does not
// speak, CONNECT, and a chunked request that also has a Content-Length
// (fasthttp would read the chunks, which the client may never end: a
// smuggling attempt or a broken client). Such a request is given an empty
// body, so that fasthttp calls the handler at once, and is marked:
// Connection: close, which the handler's verdict (headVerdict) checks
// before it looks the mark up. The connection is closed after the answer,
// so whatever the client sent after the head is never read as a request.
// The verdicts that need the head's fields (a header name that is not a
// token, Transfer-Encoding: identity with or without Content-Length) are
// the handler's, where the head's scan makes them cheap: fasthttp reads
// such a request's body first, framed by its Content-Length, as any
// other's. The hook sees the header alone: it looks at no connection.
func (p *Proxy) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	v := vOK
	switch raw := h.RawHeaders(); {
	case bareEnd(raw):
		v = vBareLF
	case badVersion(h.Protocol()):
		v = vVersion
	case bytes.Equal(h.Method(), strMethodConnect):
		v = vConnect
	case h.ContentLength() == -1 && rawHasHeader(raw, hdrContentLength):
		v = vLengthConflict
	case h.ContentLength() > p.routes.Load().maxBody:
		// Refused before fasthttp waits for the body's first 4 KiB (it
		// reads them before the handler runs, however long the body).
		v = vTooLarge
	}
	if v != vOK {
		h.SetContentLength(0)
		h.DelBytes(hdrTransferEncoding)
		h.DelBytes(hdrExpect)
		h.SetConnectionClose()
		h.SetBytesKV(hdrRefused, []byte{'0' + byte(v)})
	}
	return fasthttp.RequestConfig{}
}

// refused returns the verdict headerReceived left on a request.
func refused(h *fasthttp.RequestHeader) verdict {
	if m := h.PeekBytes(hdrRefused); len(m) == 1 && m[0] > '0' && int(m[0]-'0') < len(verdicts) {
		return verdict(m[0] - '0')
	}
	return vOK
}

// headTooLarge answers a head that filled server.max_header_bytes: 414
// when its request line alone did (RFC 9112 section 3: a request-target
// longer than the server wishes to parse), else 431. A head the scan did
// not follow gets 431.
func (p *Proxy) headTooLarge(ctx *fasthttp.RequestCtx) (int, string) {
	if s := wire.HeadOf(ctx.Conn()); s != nil && s.InRequestLine() {
		return fasthttp.StatusRequestURITooLong, "request line exceeds server.max_header_bytes (" + p.cfg.Server.MaxHeaderBytes.String() + "): the request target is too long"
	}
	return fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers exceed server.max_header_bytes (" + p.cfg.Server.MaxHeaderBytes.String() + ")"
}

// transferCodingAnswer answers a request whose Transfer-Encoding fasthttp
// refused (it reads one field, "chunked" or "identity", in HTTP/1.1 only),
// from what the head scan s kept of it:
//
//   - in a request other than HTTP/1.1: 400, the framing is faulty (RFC
//     9112 section 6.1: "MUST treat the message as if the framing is
//     faulty");
//   - with Content-Length: 400, as keyway answers that conflict whatever
//     the coding (section 6.3: "ought to be handled as an error");
//   - chunked not the final coding ("gzip", "chunked, gzip"): 400, the
//     body's length cannot be determined (section 6.3: "MUST respond with
//     the 400 (Bad Request) status code and then close the connection");
//   - chunked more than once ("chunked, chunked", or in two fields): 400
//     (section 6.1: a sender "MUST NOT apply the chunked transfer coding
//     more than once");
//   - chunked final, once, after codings keyway does not implement
//     ("gzip, chunked"; or chunked with parameters): 501 (section 6.1: "A
//     server that receives a request message with a transfer coding it
//     does not understand SHOULD respond with 501 (Not Implemented)").
//
// Fields are combined into one list (RFC 9110 section 5.3). A head the
// scan did not follow to its end, a folded field or one too long to keep
// get 400.
func transferCodingAnswer(s *wire.HeadScan) (int, string) {
	const generic = "request has a Transfer-Encoding keyway cannot read: send a single Transfer-Encoding: chunked, or Content-Length"
	if s == nil || !s.Done() {
		return fasthttp.StatusBadRequest, generic
	}
	te, values, ok := s.TransferEncoding()
	switch {
	case te == 0 || !ok:
		return fasthttp.StatusBadRequest, generic
	case !s.HTTP11():
		return fasthttp.StatusBadRequest, "request has a Transfer-Encoding but is not HTTP/1.1: its framing is faulty (RFC 9112 section 6.1); send Content-Length"
	case s.ContentLength():
		return fasthttp.StatusBadRequest, verdicts[vLengthConflict].msg
	}
	n, chunked := 0, 0
	var other []byte // the first coding keyway does not implement
	lastChunked := false
	for elem := range bytes.SplitSeq(values, []byte{','}) {
		elem = bytes.Trim(elem, " \t\r")
		if len(elem) == 0 {
			continue // empty list elements are ignored (RFC 9110 section 5.6.1)
		}
		n++
		name, params, hasParams := bytes.Cut(elem, []byte{';'})
		name = bytes.TrimRight(name, " \t")
		if !isToken(name) || hasParams && !validParams(params) {
			return fasthttp.StatusBadRequest, generic
		}
		lastChunked = bytes.EqualFold(name, strChunked)
		if lastChunked {
			chunked++
		}
		if (!lastChunked || hasParams) && other == nil {
			other = elem
		}
	}
	switch {
	case n == 0 || !lastChunked:
		return fasthttp.StatusBadRequest, msgNotChunked
	case chunked > 1:
		return fasthttp.StatusBadRequest, "request applies the chunked transfer coding more than once (RFC 9112 section 6.1)"
	case other != nil:
		return fasthttp.StatusNotImplemented, "request has a transfer coding keyway does not implement, " + strconv.Quote(string(other)) + ": only chunked is"
	}
	return fasthttp.StatusBadRequest, generic
}

// isToken reports whether b is an RFC 9110 token.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !field.Token[c] {
			return false
		}
	}
	return true
}

// validParams reports whether b is a transfer coding's parameters after
// its first semicolon: token=token pairs separated by semicolons (a quoted
// value is not accepted: no transfer coding keyway knows has one).
func validParams(b []byte) bool {
	for p := range bytes.SplitSeq(b, []byte{';'}) {
		k, v, ok := bytes.Cut(p, []byte{'='})
		if !ok || !isToken(bytes.Trim(k, " \t")) || !isToken(bytes.Trim(v, " \t")) {
			return false
		}
	}
	return true
}

// refusal is keyway's answer to a head it refuses. The connection is
// closed after it, lingering: what follows on it cannot be trusted to
// start a request.
func refusal(v verdict) answer {
	return answer{status: verdicts[v].status, msg: verdicts[v].msg, conn: connLinger, why: parseErrorReason(verdicts[v].status)}
}

// refusal is the package refusal for r, whose head got verdict v; a body
// too large for every set names the set the request is for, if one
// matches (its body was not read: the connection closes lingering).
func (p *Proxy) refusal(r *request, v verdict) answer {
	if v != vTooLarge {
		return refusal(v)
	}
	if r.rs = p.matchSet(r.ctx.Host(), r.ctx.URI().PathOriginal()); r.rs == nil {
		return refusal(v)
	}
	return tooLarge(r.rs)
}

// errMalformedReply is a reply fasthttp read but keyway does not relay.
var errMalformedReply = errors.New("malformed reply: an HTTP version other than 1.x, or a header name outside RFC 9110's token characters")
