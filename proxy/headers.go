package proxy

import (
	"bytes"
	"math/rand/v2"
	"net"
	"net/netip"

	"github.com/valyala/fasthttp"
)

// Hop-by-hop headers (RFC 9110 §7.6.1, plus the de-facto Proxy-Connection
// and Keep-Alive): they describe one connection and are never forwarded.
var hopHeaders = [][]byte{
	[]byte("Connection"), []byte("Proxy-Connection"), []byte("Keep-Alive"),
	[]byte("Proxy-Authenticate"), []byte("Proxy-Authorization"), []byte("Te"),
	[]byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
}

var (
	hdrConnection = []byte("Connection")
	hdrXFF        = []byte("X-Forwarded-For")
	hdrXFProto    = []byte("X-Forwarded-Proto")
	hdrXFHost     = []byte("X-Forwarded-Host")
	hdrRequestID  = []byte("X-Request-Id")
	hdrExpect     = []byte("Expect")
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

// fields is a set of the header fields keyway rewrites or reads, one bit
// each: the nine hop-by-hop headers (bit i is hopHeaders[i]), Expect,
// X-Forwarded-For, X-Request-Id and a replica set's pressure header.
// Knowing which are present lets the rewriting skip the lookups and
// deletions of the absent ones, which are almost all of them: each
// fasthttp lookup or deletion copies and normalises the name, then walks
// every field. fieldsAll makes every lookup and deletion happen.
type fields uint32

const (
	fConnection fields = 1 << iota
	fProxyConnection
	fKeepAlive
	fProxyAuthenticate
	fProxyAuthorization
	fTE
	fTrailer
	fTransferEncoding
	fUpgrade
	fExpect
	fXFF
	fRequestID
	fPressure

	fieldsAll = fPressure<<1 - 1
)

// fieldOf returns the field name names (any case), or 0 for one keyway
// does not rewrite. pressure is the set's pressure header, or nil.
func fieldOf(name, pressure []byte) fields {
	var f fields
	switch len(name) {
	case 2:
		if bytes.EqualFold(name, hopHeaders[5]) {
			f = fTE
		}
	case 6:
		if bytes.EqualFold(name, hdrExpect) {
			f = fExpect
		}
	case 7:
		if bytes.EqualFold(name, hopHeaders[6]) {
			f = fTrailer
		} else if bytes.EqualFold(name, hopHeaders[8]) {
			f = fUpgrade
		}
	case 10:
		if bytes.EqualFold(name, hopHeaders[0]) {
			f = fConnection
		} else if bytes.EqualFold(name, hopHeaders[2]) {
			f = fKeepAlive
		}
	case 12:
		if bytes.EqualFold(name, hdrRequestID) {
			f = fRequestID
		}
	case 15:
		if bytes.EqualFold(name, hdrXFF) {
			f = fXFF
		}
	case 16:
		if bytes.EqualFold(name, hopHeaders[1]) {
			f = fProxyConnection
		}
	case 17:
		if bytes.EqualFold(name, hopHeaders[7]) {
			f = fTransferEncoding
		}
	case 18:
		if bytes.EqualFold(name, hopHeaders[3]) {
			f = fProxyAuthenticate
		}
	case 19:
		if bytes.EqualFold(name, hopHeaders[4]) {
			f = fProxyAuthorization
		}
	}
	if len(pressure) > 0 && len(name) == len(pressure) && bytes.EqualFold(name, pressure) {
		f |= fPressure
	}
	return f
}

// requestFields returns the fields of a request whose head fasthttp
// parsed: those named in its raw header block (RawHeaders, the field lines
// exactly as received), or fieldsAll where the block cannot tell. Every
// field fasthttp keeps came from a line of that block, so a field absent
// from it is absent from the request. The block cannot tell for a chunked
// request (trailer fields come after the body, outside the block), an
// empty block, and lines it would take fasthttp's reading to interpret
// (a folded continuation line, a line without a colon): fieldsAll.
func requestFields(h *fasthttp.RequestHeader) fields {
	raw := h.RawHeaders()
	if len(raw) == 0 || h.ContentLength() == -1 {
		return fieldsAll
	}
	var f fields
	for len(raw) > 0 {
		var line []byte
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			line, raw = raw, nil
		}
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		if len(line) == 0 {
			continue // the empty line that ends the head
		}
		if line[0] == ' ' || line[0] == '\t' {
			return fieldsAll
		}
		i := bytes.IndexByte(line, ':')
		if i < 0 {
			return fieldsAll
		}
		f |= fieldOf(line[:i], nil)
	}
	return f
}

// scanReply reports whether a replica's reply, as fasthttp read it, may be
// relayed, and which of the fields it has. fasthttp refuses most malformed
// replies itself (a 502 follows); it takes any HTTP/<digit>.<digit>
// version and a space inside a header name, which keyway must not pass
// on. pressure is the set's pressure header, or nil. A chunked reply gets
// fieldsAll: its trailer fields are not among the header's fields.
func scanReply(h *fasthttp.ResponseHeader, pressure []byte) (bool, fields) {
	if p := h.Protocol(); len(p) != len("HTTP/1.1") || !bytes.HasPrefix(p, strHTTP1Prefix) {
		return false, 0
	}
	var f fields
	for k := range h.All() {
		for _, c := range k {
			if !tokenChars[c] {
				return false, 0
			}
		}
		f |= fieldOf(k, pressure)
	}
	if h.ContentLength() == -1 {
		f = fieldsAll
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
	if f&fConnection != 0 {
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
	if f&fConnection != 0 {
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

// prepareRequest turns the client's request into the one sent upstream:
// hop-by-hop headers out, forwarding headers in, and keyway's own protocol
// version (RFC 9110 §2.5: an intermediary sends its own HTTP-version; an
// HTTP/1.0 request would otherwise close the pooled replica connection).
// It returns whether the client asked to close its connection and whether
// it spoke HTTP/1.0; restoreRequest undoes the version change, which the
// front end reads after the handler to frame its answer.
func prepareRequest(ctx *fasthttp.RequestCtx) (clientClose, http10 bool) {
	return rewriteRequest(ctx, requestFields(&ctx.Request.Header))
}

// rewriteRequest is prepareRequest for a request whose fields are f.
func rewriteRequest(ctx *fasthttp.RequestCtx, f fields) (clientClose, http10 bool) {
	req := &ctx.Request
	clientClose = req.Header.ConnectionClose()
	http10 = !req.Header.IsHTTP11()
	stripRequestHopByHop(&req.Header, f)
	if f&fExpect != 0 {
		req.Header.DelBytes(hdrExpect) // the front end already answered 100-continue
	}
	req.Header.ResetConnectionClose()
	if http10 {
		req.Header.SetProtocolBytes(strHTTP11)
	}

	// X-Forwarded-For: append the peer to any list the client sent.
	var buf [128]byte
	xff := buf[:0]
	if f&fXFF != 0 {
		if prev := req.Header.PeekBytes(hdrXFF); len(prev) > 0 {
			xff = append(xff, prev...)
			xff = append(xff, ", "...)
		}
	}
	xff = appendIP(xff, ctx.RemoteIP())
	// The names are in canonical form: SetCanonical spares normalising them.
	req.Header.SetCanonical(hdrXFF, xff)
	if ctx.IsTLS() {
		req.Header.SetCanonical(hdrXFProto, strHTTPS)
		req.URI().SetSchemeBytes(strHTTP) // the replica speaks plain HTTP
	} else {
		req.Header.SetCanonical(hdrXFProto, strHTTP)
	}
	req.Header.SetCanonical(hdrXFHost, req.Header.Host())
	if f&fRequestID == 0 || len(req.Header.PeekBytes(hdrRequestID)) == 0 {
		req.Header.SetCanonical(hdrRequestID, appendRequestID(buf[:0]))
	}
	return clientClose, http10
}

// restoreRequest gives the client's request back its protocol version.
func restoreRequest(ctx *fasthttp.RequestCtx, http10 bool) {
	if http10 {
		ctx.Request.Header.SetProtocolBytes(strHTTP10)
	}
}

// prepareResponse cleans a replica's response, whose fields are f (from
// scanReply), before it is relayed.
func prepareResponse(ctx *fasthttp.RequestCtx, clientClose bool, f fields) {
	h := &ctx.Response.Header
	stripResponseHopByHop(h, f)
	h.ResetConnectionClose() // a replica closing its connection must not close the client's
	if clientClose {
		ctx.SetConnectionClose()
	}
}

func appendIP(dst []byte, ip net.IP) []byte {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return append(dst, "unknown"...)
	}
	return a.Unmap().AppendTo(dst)
}

const hexDigits = "0123456789abcdef"

// appendRequestID appends 32 random hex digits.
func appendRequestID(dst []byte) []byte {
	for _, v := range [2]uint64{rand.Uint64(), rand.Uint64()} {
		for i := 60; i >= 0; i -= 4 {
			dst = append(dst, hexDigits[(v>>uint(i))&0xf])
		}
	}
	return dst
}
