package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Outcome is what became of one exchange with a replica, as a value: the
// error, and what the replica connection saw of it, which the error alone
// cannot tell (fasthttp reports any failure at a reply's first byte as
// io.EOF).
type Outcome struct {
	// Err is nil when the replica's reply was read whole into the
	// response.
	Err error
	// Stale says that a pooled connection was found closed before
	// anything was sent (Err is ErrStale): the request never reached the
	// replica.
	Stale bool
	// LostReused says that a reused pooled connection was closed or reset
	// before the reply's first byte: the replica closed it as the request
	// went out (a restart, its keep-alive timeout). The request's fate is
	// unknown; the replica is not at fault.
	LostReused bool
	// TLSRefused, when not nil, is the TLS alert with which the replica
	// answered a fresh connection's first exchange, before any reply
	// byte: it refused the handshake (a client certificate it does not
	// accept) and read no request.
	TLSRefused error
}

// RoundTrip sends req to the replica of hc on one of its pooled
// connections (fasthttp's AcquireConn) and reads the reply into resp,
// within deadline for the whole exchange (the pool wait, the write and the
// read). lines, when not empty, are header lines (each ending in CRLF)
// written after req's own, before the empty line that ends its head: they
// reach the replica exactly as if they had been set through req.Header.
//
// It does what fasthttp's HostClient.Do does for one attempt with its own
// transport, for a request whose body is buffered or streamed (the body
// stream is read as the connection takes it, and detached from req once
// written) and a reply whose body is read whole, or left to stream to the
// client as opts say (resp's body stream then owns the connection until
// fasthttp closes it): no retry (keyway owns every retry), no MaxConnDuration, no user
// agent; resp is reset first and adds no default Content-Type. The
// connection goes back to the pool unless either side asked to close it or
// the exchange failed. Over a connection the hc's dialer wrapped in a
// ReplicaConn, the outcome says what the connection saw.
//
// Safe for concurrent use; req and resp belong to the caller's goroutine.
func RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time, lines []byte, opts ReplyOpts) (o Outcome) {
	resp.Reset()
	resp.Header.SetNoDefaultContentType(true)
	left := time.Until(deadline)
	if left <= 0 {
		o.Err = fasthttp.ErrTimeout
		return o
	}
	cc, err := hc.AcquireConn(left, req.ConnectionClose())
	if err != nil {
		o.Err = err
		return o
	}
	conn := cc.Conn()
	streamed, err := exchange(hc, cc, (*fasthttp.HostClient).ReleaseConn, (*fasthttp.HostClient).CloseConn, req, resp, deadline, lines, opts)
	if rc, ok := conn.(*ReplicaConn); ok {
		rc.outcome(&o)
	}
	switch {
	case streamed:
		// The reply's body stream owns the connection now (ReplyStream).
	case err != nil:
		o.Err = transportError(err)
		hc.CloseConn(cc)
	case req.ConnectionClose() || resp.ConnectionClose():
		hc.CloseConn(cc)
	default:
		hc.ReleaseConn(cc)
	}
	return o
}

// exchange writes req on cc's connection and reads the reply into resp,
// both within deadline (readReply). It reports whether the reply's body
// is left to stream, with the connection.
func exchange[C interface{ Conn() net.Conn }](hc *fasthttp.HostClient, cc C, release, closeConn func(*fasthttp.HostClient, C), req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time, lines []byte, opts ReplyOpts) (bool, error) {
	conn := cc.Conn()
	if err := conn.SetDeadline(deadline); err != nil {
		return false, err
	}
	req.URI().DisablePathNormalizing = hc.DisablePathNormalizing
	if err := writeRequest(conn, req, lines); err != nil {
		return false, err
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	br := hc.AcquireReader(conn)
	streamed, err := readReply(hc, cc, release, closeConn, br, req, resp, opts)
	if !streamed {
		hc.ReleaseReader(br)
	}
	return streamed, err
}

// transportError is err as HostClient.Do reports it: any timeout is
// fasthttp.ErrTimeout, and the end of the connection before the reply's
// first byte fasthttp.ErrConnectionClosed.
func transportError(err error) error {
	if x, ok := err.(interface{ Timeout() bool }); ok && x.Timeout() {
		return fasthttp.ErrTimeout
	}
	if err == io.EOF {
		return fasthttp.ErrConnectionClosed
	}
	return err
}

// writeRequest writes req to conn, with lines spliced before the end of
// its head.
func writeRequest(conn net.Conn, req *fasthttp.Request, lines []byte) error {
	bodyLen := -1 // a body stream: the head's end is found by its lines
	if !req.IsBodyStream() {
		bodyLen = len(req.Body())
	}
	w := headWriters.Get().(*headWriter)
	w.conn, w.spliced, w.bodyLen, w.lines = conn, len(lines) == 0, bodyLen, lines
	w.bw.Reset(w)
	err := req.Write(w.bw)
	if err == nil {
		err = w.bw.Flush()
	}
	if err == nil && !w.spliced {
		err = ErrNoHeadEnd
	}
	w.release()
	return err
}

// ErrNoHeadEnd says that what fasthttp wrote of a request had no empty
// line to end its head within its first write, where the extra header
// lines go: nothing was sent. fasthttp writes a head whole before its
// body (TestContractHeadFirst); this is a guard.
var ErrNoHeadEnd = errors.New("wire: the request head written upstream had no end in its first write; its extra header lines could not be added")

// headWriter is the writer beneath the bufio.Writer a request is written
// into: its first write (fasthttp writes the head before the body, and
// bufio passes it on whole, alone or with the body's first bytes) gets
// the lines before the head's last CRLF, and goes to the connection in
// one write; later writes pass through.
type headWriter struct {
	bw      *bufio.Writer
	conn    net.Conn
	spliced bool
	bodyLen int    // the request's body, written after its head
	lines   []byte // the lines to add to the head
	out     []byte
}

// headWriterBuf is the bufio.Writer's size: fasthttp's default for a
// client's writes.
const headWriterBuf = 4 << 10

var headWriters = sync.Pool{New: func() any {
	w := &headWriter{}
	w.bw = bufio.NewWriterSize(w, headWriterBuf)
	return w
}}

// release returns w to the pool, unless it grew far beyond a usual head.
func (w *headWriter) release() {
	w.conn = nil
	w.bw.Reset(nil)
	w.lines = nil
	if cap(w.out) > 64<<10 {
		return
	}
	headWriters.Put(w)
}

func (w *headWriter) Write(p []byte) (int, error) {
	if w.spliced {
		return w.conn.Write(p)
	}
	at := headEnd(p, w.bodyLen) - 2 // the head's last CRLF: the empty line
	if at < 0 {
		return 0, ErrNoHeadEnd
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

// ReadFrom copies a body stream to the connection in pieces of up to
// copyBufSize, once the head has gone out: bufio.Writer hands a copy to
// the writer beneath it when its own buffer is empty, which spares one
// system call per 4 KiB (the bufio.Writer's size) of a streamed body.
func (w *headWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.spliced {
		// Not yet the head's end: the head goes through Write.
		return io.Copy(writerOnly{w}, r)
	}
	return copyBuffered(w.conn, r)
}

// writerOnly hides a writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// copyBufSize is the piece in which a streamed body is copied.
const copyBufSize = 64 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// copyBuffered copies r to w through a pooled buffer of copyBufSize.
func copyBuffered(w io.Writer, r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(writerOnly{w}, readerOnly{r}, *bp)
}

// readerOnly hides a reader's WriteTo from io.CopyBuffer.
type readerOnly struct{ io.Reader }

// headEnd returns the end of the head that p begins with (just after its
// CRLF CRLF), or -1 if p holds none. A head holds no CRLF CRLF but at its
// end (no value holds a line break), and p is the head and at most
// bodyLen bytes more: the head ends bodyLen bytes before p's end when p
// holds the whole body, the usual case, which costs four comparisons.
// Otherwise (and for a body of unknown length, bodyLen -1) the head's
// lines are followed to the empty one.
func headEnd(p []byte, bodyLen int) int {
	if i := len(p) - bodyLen; bodyLen >= 0 && i >= 4 && p[i-4] == '\r' && p[i-3] == '\n' && p[i-2] == '\r' && p[i-1] == '\n' {
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
