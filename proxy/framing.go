package proxy

import (
	"bytes"
	"errors"
	"time"

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
}

var (
	strMethodConnect    = []byte("CONNECT")
	strHTTP1Prefix      = []byte("HTTP/1.")
	hdrContentLength    = []byte("content-length")
	hdrTransferEncoding = []byte("Transfer-Encoding")
)

// tokenChars are the bytes allowed in a header name (RFC 9110 §5.6.2).
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// checkFraming returns keyway's answer to a request whose head it must
// not forward, or the zero verdict.
func checkFraming(h *fasthttp.RequestHeader) verdict {
	// fasthttp takes any HTTP/<digit>.<digit>; RFC 9112 §2.3: a 1.x
	// request with a higher minor version is served as 1.1, another major
	// version is refused with 505.
	if p := h.Protocol(); len(p) != len("HTTP/1.1") || !bytes.HasPrefix(p, strHTTP1Prefix) || p[7] < '0' || p[7] > '9' {
		return vVersion
	}
	if bytes.Equal(h.Method(), strMethodConnect) {
		// A replica is not a tunnel; RFC 9110 §9.3.6 makes CONNECT a
		// proxy's method, and keyway is a reverse proxy.
		return vConnect
	}
	// With Transfer-Encoding: chunked fasthttp drops a Content-Length and
	// reads the chunks (RFC 9112 §6.3 allows it, closing the connection
	// after). Such a request is a smuggling attempt or a broken client:
	// refuse it, as the RFC suggests ("ought to be handled as an error").
	if (h.ContentLength() == -1 || len(h.PeekBytes(hdrTransferEncoding)) > 0) && rawHasHeader(h.RawHeaders(), hdrContentLength) {
		return vLengthConflict
	}
	// fasthttp accepts a space inside a header name ("X A: b"), which is
	// not a token: a replica could read the line differently.
	for k := range h.All() {
		for _, c := range k {
			if !tokenChars[c] {
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

// headerReceived is fasthttp's HeaderReceived hook. A request keyway
// refuses is marked and given an empty body: fasthttp then calls the
// handler at once, which answers from the mark (a body read, or the
// wait for a body the request's own framing may never complete, would
// delay the answer, and fasthttp resets the header when a body read
// fails). The connection is closed after the answer, so whatever the
// client sent after the head is never read as a request.
func (p *Proxy) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if v := checkFraming(h); v != vOK {
		h.SetContentLength(0)
		h.DelBytes(hdrTransferEncoding)
		h.DelBytes(hdrExpect)
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

// refuseFraming answers a request checkFraming refused and closes its
// connection: what follows on it cannot be trusted to start a request.
func (p *Proxy) refuseFraming(ctx *fasthttp.RequestCtx, v verdict) {
	status, msg := verdicts[v].status, verdicts[v].msg
	p.metrics.malformed.Inc()
	p.metrics.counters.noSet[codeClass(status)].Add(1)
	ctx.Response.Reset()
	writeJSONError(ctx, status, msg, "", "")
	ctx.SetConnectionClose()
	markLinger(ctx.Conn())
	p.logAccess(ctx, nil, "", parseErrorReason(status), status, 0, time.Now(), 0)
}

// errMalformedReply is a reply fasthttp read but keyway does not relay.
var errMalformedReply = errors.New("malformed reply: an HTTP version other than 1.x, or a header name outside RFC 9110's token characters")

// validReply reports whether a replica's reply, as fasthttp read it, may
// be relayed. fasthttp refuses most malformed replies itself (a 502
// follows); it takes any HTTP/<digit>.<digit> version and a space inside
// a header name, which keyway must not pass on.
func validReply(h *fasthttp.ResponseHeader) bool {
	if p := h.Protocol(); len(p) != len("HTTP/1.1") || !bytes.HasPrefix(p, strHTTP1Prefix) {
		return false
	}
	for k := range h.All() {
		for _, c := range k {
			if !tokenChars[c] {
				return false
			}
		}
	}
	return true
}
