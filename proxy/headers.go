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

// The Connection list is copied before headers are deleted: deleting may
// reuse the buffer it lives in. The two functions are twins rather than one
// generic function: calls through a generic header type's dictionary make
// the stack buffer escape, one 256-byte allocation per call.

// stripRequestHopByHop removes the headers named in Connection, then the
// standard hop-by-hop headers.
func stripRequestHopByHop(h *fasthttp.RequestHeader) {
	var buf [256]byte
	list := append(buf[:0], h.PeekBytes(hdrConnection)...)
	for len(list) > 0 {
		var tok []byte
		tok, list = nextToken(list)
		if removableToken(tok) {
			h.DelBytes(tok)
		}
	}
	for _, k := range hopHeaders {
		h.DelBytes(k)
	}
}

// stripResponseHopByHop is stripRequestHopByHop for a response.
func stripResponseHopByHop(h *fasthttp.ResponseHeader) {
	var buf [256]byte
	list := append(buf[:0], h.PeekBytes(hdrConnection)...)
	for len(list) > 0 {
		var tok []byte
		tok, list = nextToken(list)
		if removableToken(tok) {
			h.DelBytes(tok)
		}
	}
	for _, k := range hopHeaders {
		h.DelBytes(k)
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
	req := &ctx.Request
	clientClose = req.Header.ConnectionClose()
	http10 = !req.Header.IsHTTP11()
	stripRequestHopByHop(&req.Header)
	req.Header.DelBytes(hdrExpect) // the front end already answered 100-continue
	req.Header.ResetConnectionClose()
	if http10 {
		req.Header.SetProtocolBytes(strHTTP11)
	}

	// X-Forwarded-For: append the peer to any list the client sent.
	var buf [128]byte
	xff := buf[:0]
	if prev := req.Header.PeekBytes(hdrXFF); len(prev) > 0 {
		xff = append(xff, prev...)
		xff = append(xff, ", "...)
	}
	xff = appendIP(xff, ctx.RemoteIP())
	req.Header.SetBytesKV(hdrXFF, xff)
	if ctx.IsTLS() {
		req.Header.SetBytesKV(hdrXFProto, strHTTPS)
		req.URI().SetSchemeBytes(strHTTP) // the replica speaks plain HTTP
	} else {
		req.Header.SetBytesKV(hdrXFProto, strHTTP)
	}
	req.Header.SetBytesKV(hdrXFHost, req.Header.Host())
	if len(req.Header.PeekBytes(hdrRequestID)) == 0 {
		req.Header.SetBytesKV(hdrRequestID, appendRequestID(buf[:0]))
	}
	return clientClose, http10
}

// restoreRequest gives the client's request back its protocol version.
func restoreRequest(ctx *fasthttp.RequestCtx, http10 bool) {
	if http10 {
		ctx.Request.Header.SetProtocolBytes(strHTTP10)
	}
}

// prepareResponse cleans a replica's response before it is relayed.
func prepareResponse(ctx *fasthttp.RequestCtx, clientClose bool) {
	h := &ctx.Response.Header
	stripResponseHopByHop(h)
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
