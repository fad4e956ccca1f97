package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"sync"
	"time"
	"unsafe"

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

// ctxOfRequest returns the request context whose request req is. Only
// forward sends requests through the replica clients, and always
// &ctx.Request: fwdTransport, which they use, relies on that and nothing
// else may call it (for a request outside a RequestCtx it returns garbage).
func ctxOfRequest(req *fasthttp.Request) *fasthttp.RequestCtx {
	return (*fasthttp.RequestCtx)(unsafe.Add(unsafe.Pointer(req), -int(unsafe.Offsetof(fasthttp.RequestCtx{}.Request))))
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

// fwdTransport is the replica clients' transport (fasthttp.RoundTripper).
// A request whose client connection holds its fwdReq is written
// with its forwarding lines spliced in before the empty line that ends
// its head, within the request's deadline; it is otherwise what
// fasthttp's own transport does, through the HostClient's pool, for a
// request keyway sends (no body stream, no response body stream, no
// MaxConnDuration). Any other request goes to fasthttp's own transport.
type fwdTransport struct{}

func (fwdTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (retry bool, err error) {
	r := armedFwd(ctxOfRequest(req).Conn())
	if r == nil {
		return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	}
	left := time.Until(r.deadline)
	if left <= 0 {
		return false, fasthttp.ErrTimeout
	}
	cc, err := hc.AcquireConn(left, req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	resp.ParseNetConn(conn)
	if err = conn.SetWriteDeadline(r.deadline); err != nil {
		hc.CloseConn(cc)
		return true, err
	}

	w := fwdWriters.Get().(*fwdWriter)
	w.conn, w.spliced, w.bodyLen, w.lines = conn, false, len(req.Body()), r.lines
	w.bw.Reset(w)
	err = req.Write(w.bw)
	if err == nil {
		err = w.bw.Flush()
	}
	if err == nil && !w.spliced {
		err = errNoHeadEnd
	}
	w.release()
	if x, ok := err.(interface{ Timeout() bool }); ok && x.Timeout() {
		err = fasthttp.ErrTimeout // as fasthttp's transport answers a write timeout
	}
	if err != nil {
		hc.CloseConn(cc)
		return true, err
	}

	if err = conn.SetReadDeadline(r.deadline); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	br := hc.AcquireReader(conn)
	err = resp.ReadLimitBody(br, hc.MaxResponseBodySize)
	hc.ReleaseReader(br)
	if err != nil {
		hc.CloseConn(cc)
		return !errors.Is(err, fasthttp.ErrBodyTooLarge), err
	}
	if req.ConnectionClose() || resp.ConnectionClose() {
		hc.CloseConn(cc)
	} else {
		hc.ReleaseConn(cc)
	}
	return false, nil
}

// errNoHeadEnd: what fasthttp wrote of a request had no empty line to end
// its head within its first write, where fwdWriter splices the forwarding
// lines. fasthttp writes the head whole first; this is a guard.
var errNoHeadEnd = errors.New("keyway: the request head written upstream had no end in its first write; the forwarding headers could not be added")

// fwdWriter is the writer beneath the bufio.Writer a request is written
// into: its first write (fasthttp writes the head before the body, and
// bufio passes it on whole, alone or with the body's first bytes) gets
// the forwarding lines before the head's last CRLF, and goes to the
// replica connection in one write; later writes pass through.
type fwdWriter struct {
	bw      *bufio.Writer
	conn    net.Conn
	spliced bool
	bodyLen int    // the request's body, written after its head
	lines   []byte // the request's forwarding lines (fwdReq)
	out     []byte
}

// fwdWriterBuf is the bufio.Writer's size: fasthttp's default for a
// client's writes.
const fwdWriterBuf = 4 << 10

var fwdWriters = sync.Pool{New: func() any {
	w := &fwdWriter{}
	w.bw = bufio.NewWriterSize(w, fwdWriterBuf)
	return w
}}

// release returns w to the pool, unless it grew far beyond a usual head.
func (w *fwdWriter) release() {
	w.conn = nil
	w.bw.Reset(nil)
	w.lines = nil
	if cap(w.out) > 64<<10 {
		return
	}
	fwdWriters.Put(w)
}

func (w *fwdWriter) Write(p []byte) (int, error) {
	if w.spliced {
		return w.conn.Write(p)
	}
	at := headEnd(p, w.bodyLen) - 2 // the head's last CRLF: the empty line
	if at < 0 {
		return 0, errNoHeadEnd
	}
	w.spliced = true
	w.out = append(append(append(w.out[:0], p[:at]...), w.lines...), p[at:]...)
	n, err := w.conn.Write(w.out)
	if n >= at+len(w.lines) {
		n -= len(w.lines)
	} else if n > at {
		n = at
	}
	return n, err
}

// headEnd returns the end of the head that p begins with (just after its
// CRLF CRLF), or -1 if p holds none. A head holds no CRLF CRLF but at its
// end (no value holds a line break), and p is the head and at most
// bodyLen bytes more: the head ends bodyLen bytes before p's end when p
// holds the whole body, the usual case, which costs four comparisons.
// Otherwise the head's lines are followed to the empty one.
func headEnd(p []byte, bodyLen int) int {
	if i := len(p) - bodyLen; i >= 4 && p[i-4] == '\r' && p[i-3] == '\n' && p[i-2] == '\r' && p[i-1] == '\n' {
		return i
	}
	for i := 0; ; {
		j := bytes.IndexByte(p[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1
		if i >= 4 && p[i-4] == '\r' && p[i-3] == '\n' && p[i-2] == '\r' {
			return i
		}
	}
}
