package proxy

import (
	"bytes"

	"keyway/proxy/internal/field"

	"github.com/valyala/fasthttp"
)

// hopHeaders are the hop-by-hop headers (field.HopNames): they describe
// one connection and are never forwarded.
var hopHeaders = field.HopNames

var (
	hdrConnection = field.Name(field.Connection)
	hdrXFF        = field.Name(field.XFF)
	hdrXFProto    = field.Name(field.XFProto)
	hdrXFHost     = field.Name(field.XFHost)
	hdrRequestID  = field.Name(field.RequestID)
	hdrExpect     = field.Name(field.Expect)
	strHTTP       = []byte("http")
	strClose      = []byte("close")
	strHTTP10     = []byte("HTTP/1.0")
	strHTTP11     = []byte("HTTP/1.1")
	strKeepAlive  = []byte("keep-alive")
	strHTTPS      = []byte("https")
)

// protected headers are never removed because a Connection header lists
// them: framing and routing depend on them.
func protectedHeader(name []byte) bool {
	return bytes.EqualFold(name, []byte("Host")) || bytes.EqualFold(name, []byte("Content-Length")) ||
		bytes.EqualFold(name, hdrXFF) || bytes.EqualFold(name, hdrXFProto) ||
		bytes.EqualFold(name, hdrXFHost) || bytes.EqualFold(name, hdrRequestID)
}

// fields is a set of the header fields keyway rewrites or reads
// (field.Set).
type fields = field.Set

// requestFields returns the fields of a request whose head fasthttp
// parsed, from its raw header block (field.InBlock), or field.All where that
// cannot tell, and for a chunked request (its trailer fields come after
// the body, outside the block).
func requestFields(h *fasthttp.RequestHeader) fields {
	if h.ContentLength() == -1 {
		return field.All
	}
	f, ok := field.InBlock(h.RawHeaders())
	if !ok {
		return field.All
	}
	return f
}

// scanReply reports whether a replica's reply, as fasthttp read it, may be
// relayed, and which of the fields it has. fasthttp refuses most malformed
// replies itself (a 502 follows); it takes any HTTP/<digit>.<digit>
// version and a space inside a header name, which keyway must not pass
// on. pressure is the set's pressure header, or nil. A chunked reply gets
// field.All: its trailer fields are not among the header's fields.
func scanReply(h *fasthttp.ResponseHeader, pressure []byte) (bool, fields) {
	if p := h.Protocol(); len(p) != len("HTTP/1.1") || !bytes.HasPrefix(p, strHTTP1Prefix) {
		return false, 0
	}
	var f fields
	for k := range h.All() {
		for _, c := range k {
			if !field.Token[c] {
				return false, 0
			}
		}
		f |= field.Of(k, pressure)
	}
	if h.ContentLength() == -1 {
		f = field.All
	}
	return true, f
}

// The Connection list is copied before headers are deleted: deleting may
// reuse the buffer it lives in. The two functions are twins rather than one
// generic function: calls through a generic header type's dictionary make
// the stack buffer escape, one 256-byte allocation per call.

// stripRequestHopByHop removes the headers named in Connection, then the
// standard hop-by-hop headers, of those in f.
func stripRequestHopByHop(h *fasthttp.RequestHeader, f fields) {
	if f&field.Hop == 0 {
		return // almost every message: none of them
	}
	if f&field.Connection != 0 {
		var buf [256]byte
		list := append(buf[:0], h.PeekBytes(hdrConnection)...)
		for len(list) > 0 {
			var tok []byte
			tok, list = nextToken(list)
			if removableToken(tok) {
				h.DelBytes(tok)
			}
		}
	}
	for i, k := range hopHeaders {
		if f&(1<<i) != 0 {
			h.DelBytes(k)
		}
	}
}

// stripResponseHopByHop is stripRequestHopByHop for a response.
func stripResponseHopByHop(h *fasthttp.ResponseHeader, f fields) {
	if f&field.Hop == 0 {
		return // almost every message: none of them
	}
	if f&field.Connection != 0 {
		var buf [256]byte
		list := append(buf[:0], h.PeekBytes(hdrConnection)...)
		for len(list) > 0 {
			var tok []byte
			tok, list = nextToken(list)
			if removableToken(tok) {
				h.DelBytes(tok)
			}
		}
	}
	for i, k := range hopHeaders {
		if f&(1<<i) != 0 {
			h.DelBytes(k)
		}
	}
}

// nextToken splits the first element off a comma-separated list.
func nextToken(list []byte) (tok, rest []byte) {
	if i := bytes.IndexByte(list, ','); i >= 0 {
		return bytes.TrimSpace(list[:i]), list[i+1:]
	}
	return bytes.TrimSpace(list), nil
}

// removableToken reports whether a header named in Connection may be
// deleted: not the connection options themselves, not a protected header.
func removableToken(tok []byte) bool {
	return len(tok) > 0 && !bytes.EqualFold(tok, strClose) && !bytes.EqualFold(tok, strKeepAlive) && !protectedHeader(tok)
}
