package wire

import (
	"bufio"
	"errors"
	"io"
	"sync"

	"github.com/valyala/fasthttp"
)

// ReplyOpts says how RoundTrip reads a reply's body.
type ReplyOpts struct {
	// Buffer: a body whose Content-Length is at most this is read whole
	// before RoundTrip returns; a longer one, or one framed otherwise
	// (chunked, or until the connection closes), is streamed to the
	// client after the handler returns (ReplyStream).
	Buffer int
	// Limit is the most bytes a body may have (max_response_body_bytes):
	// a Content-Length over it is fasthttp.ErrBodyTooLarge at once, and a
	// streamed body that goes past it ends there, its connections closed.
	Limit int
	// Whole reads every body whole, up to Limit: the client cannot take a
	// body of unknown length (HTTP/1.0).
	Whole bool
}

// ErrReplyTooLarge ends a streamed reply that went past its limit.
var ErrReplyTooLarge = errors.New("wire: the reply body exceeds max_response_body_bytes")

// ReplyStream is the body of a reply that is streamed to the client: it
// reads the replica's connection as fasthttp writes the client's answer,
// and gives the connection back to the pool once the body was read whole,
// or closes it. fasthttp closes it (Close) after writing the answer, or
// when the answer is dropped.
//
// C is the type of fasthttp's pooled connection (HostClient.AcquireConn
// returns one of an unexported type).
type ReplyStream[C any] struct {
	side  fasthttp.Response // holds the replica's body stream (and its trailer)
	pre   []byte            // a body of unknown length: its first bytes, read before the head went out
	off   int               // next byte of pre to read
	hc    *fasthttp.HostClient
	cc    C
	br    *bufio.Reader
	n     int64
	limit int64
	// releaseConn and closeConn are HostClient's ReleaseConn and
	// CloseConn, as method expressions (no closure per reply).
	releaseConn, closeConn func(*fasthttp.HostClient, C)
	keep                   bool // the connection may be reused once the body was read whole
	done                   bool // the body was read whole
	err                    error
}

// replyStreams pools the *ReplyStream of the one C there is.
var replyStreams sync.Pool

func acquireReplyStream[C any]() *ReplyStream[C] {
	if s, ok := replyStreams.Get().(*ReplyStream[C]); ok {
		return s
	}
	return new(ReplyStream[C])
}

// Read reads the replica's body.
func (s *ReplyStream[C]) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.off < len(s.pre) {
		n := copy(p, s.pre[s.off:])
		s.off += n
		return n, nil
	}
	n, err := s.side.BodyStream().Read(p)
	s.n += int64(n)
	if s.limit > 0 && s.n > s.limit {
		s.err = ErrReplyTooLarge
		return n, s.err
	}
	switch {
	case err == io.EOF:
		s.done = true
	case err != nil:
		s.err = err
	}
	return n, err
}

// Close gives the replica's connection back, or closes it when the body
// was not read whole (the client went away, the replica broke off, the
// limit was passed).
func (s *ReplyStream[C]) Close() error {
	if s.hc == nil {
		return nil
	}
	_ = s.side.CloseBodyStream()
	s.hc.ReleaseReader(s.br)
	if s.done && s.err == nil && s.keep {
		s.releaseConn(s.hc, s.cc)
	} else {
		s.closeConn(s.hc, s.cc)
	}
	s.release()
	return nil
}

// release returns s to the pool.
func (s *ReplyStream[C]) release() {
	s.side.Reset()
	var none C
	s.hc, s.cc, s.br, s.n, s.err, s.done, s.pre, s.off = nil, none, nil, 0, nil, false, s.pre[:0], 0
	replyStreams.Put(s)
}

// readReply reads the reply to req from br into resp: its head, and its
// body whole or as a ReplyStream set as resp's body stream. It reports
// whether it left br and the connection to the stream.
func readReply[C any](hc *fasthttp.HostClient, cc C, release, closeConn func(*fasthttp.HostClient, C), br *bufio.Reader, req *fasthttp.Request, resp *fasthttp.Response, opts ReplyOpts) (streamed bool, err error) {
	head := req.Header.IsHead()
	resp.SkipBody = true // the head, and interim replies, only
	err = resp.ReadLimitBody(br, opts.Limit)
	resp.SkipBody = head
	code := resp.StatusCode()
	if err != nil || head || code < 200 || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified {
		return false, err
	}
	cl := resp.Header.ContentLength()
	if cl > opts.Limit && opts.Limit > 0 {
		return false, fasthttp.ErrBodyTooLarge
	}
	if opts.Whole || cl >= 0 && cl <= opts.Buffer {
		if err = resp.ReadBody(br, opts.Limit); err == nil && cl == -1 {
			err = resp.Header.ReadTrailer(br)
		}
		return false, err
	}
	s := acquireReplyStream[C]()
	resp.Header.CopyTo(&s.side.Header)
	s.side.StreamBody = true
	if err = s.side.ReadBody(br, 0); err != nil {
		s.release()
		return false, err
	}
	s.limit = int64(opts.Limit)
	if cl < 0 {
		// Chunked, or until the replica closes: a body that ends within
		// the buffer is read whole, its framing checked before anything
		// is relayed; a longer one is streamed, these bytes first.
		whole, err := s.prefix(opts.Buffer)
		if err != nil || whole {
			if err == nil {
				resp.SetBody(s.pre)
				resp.Header.SetContentLength(len(s.pre))
			}
			s.release()
			return false, err
		}
		cl = -1 // chunked to the client
	}
	s.hc, s.cc, s.br, s.releaseConn, s.closeConn = hc, cc, br, release, closeConn
	s.keep = !req.ConnectionClose() && !resp.ConnectionClose()
	resp.SetBodyStream(s, cl)
	return true, nil
}

// prefix reads the first max bytes of the body into pre, and reports
// whether the body ended within them.
func (s *ReplyStream[C]) prefix(max int) (whole bool, err error) {
	if cap(s.pre) < max {
		s.pre = make([]byte, 0, max)
	}
	buf := s.pre[:max]
	n := 0
	for n < max {
		m, err := s.side.BodyStream().Read(buf[n:])
		n += m
		if s.limit > 0 && int64(n) > s.limit {
			return false, fasthttp.ErrBodyTooLarge
		}
		if err == io.EOF {
			s.pre = buf[:n]
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
	s.pre = buf[:n]
	s.n = int64(n)
	return false, nil
}
