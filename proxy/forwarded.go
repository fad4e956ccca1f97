package proxy

import (
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// The forwarding headers (X-Forwarded-For, -Proto, -Host, X-Request-Id)
// written by keyway itself. Set through fasthttp's header API, each costs
// a copy of its value, a check for line breaks, a comparison with the
// special headers, a walk of every field and two more copies into the
// field list: about 1,300 instructions per request for the four, and
// fasthttp's DoDeadline reads the clock four times more than keyway needs.
// For a request from a client connection keyway accepted whose head names
// none of the first three nor Transfer-Encoding or Trailer (almost every
// request: fields tells), prepareRequest leaves them out of the header and
// builds their lines in a fwdReq the connection holds instead; the
// replica clients' transport (fwdTransport) then writes them after
// fasthttp's head, in the same bytes as the header API would, and sets the
// exchange's deadlines from the request's own. Any other request gets the
// header API and DoDeadline, as before.

// fwdReq is the forwarding state of a request being forwarded: taken
// from a pool by prepareRequest and held by its client connection (one
// request at a time) until handled releases it, after the access log.
type fwdReq struct {
	deadline time.Time // the request's deadline (timeouts.request from its start)
	ownID    bool      // keyway gives the request its ID: id
	id       [32]byte
	// lines are the forwarding header lines, each ending in CRLF, built
	// once for all the request's attempts.
	lines []byte
}

var fwdReqs = sync.Pool{New: func() any { return &fwdReq{lines: make([]byte, 0, 192)} }}

// fwdSlot returns where a client connection keyway accepted holds its
// request's fwdReq (nil while none is armed), or nil for any other
// connection (clientStateOf).
func fwdSlot(c net.Conn) **fwdReq {
	if s := clientStateOf(c); s != nil {
		return &s.fwd
	}
	return nil
}

// armedFwd returns the fwdReq a client connection holds, or nil.
func armedFwd(c net.Conn) *fwdReq {
	if s := fwdSlot(c); s != nil {
		return *s
	}
	return nil
}

// releaseFwd ends a request's forwarding state, if it has one.
func releaseFwd(c net.Conn) {
	if s := fwdSlot(c); s != nil && *s != nil {
		r := *s
		*s = nil
		if cap(r.lines) <= 4<<10 {
			fwdReqs.Put(r)
		}
	}
}

// requestID returns the ID keyway gave the request it forwards, or nil.
func (r *fwdReq) requestID() []byte {
	if r == nil || !r.ownID {
		return nil
	}
	return r.id[:]
}

// appendForwardLines appends the forwarding header lines for ctx's
// request, each ending in CRLF, as the header API would have written them
// (rewriteRequest): the client's address, the scheme, the request's Host
// and, unless the client sent one, keyway's request ID.
func appendForwardLines(dst []byte, ctx *fasthttp.RequestCtx, r *fwdReq) []byte {
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
