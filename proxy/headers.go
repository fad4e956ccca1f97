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
	strHTTPS      = []byte("https")
)

// protected headers are never removed because a Connection header lists
// them: framing and routing depend on them.
func protectedHeader(name []byte) bool {
	return bytes.EqualFold(name, []byte("Host")) || bytes.EqualFold(name, []byte("Content-Length")) ||
		bytes.EqualFold(name, hdrXFF) || bytes.EqualFold(name, hdrXFProto) ||
		bytes.EqualFold(name, hdrXFHost) || bytes.EqualFold(name, hdrRequestID)
}

// headerDeleter is the common part of Request- and ResponseHeader.
type headerDeleter interface {
	Peek(string) []byte
	PeekBytes([]byte) []byte
	DelBytes([]byte)
}

// stripHopByHop removes the headers named in Connection, then the standard
// hop-by-hop headers. The Connection list is copied first: deleting headers
// may reuse the buffer it lives in.
func stripHopByHop[H headerDeleter](h H) {
	var buf [256]byte
	list := append(buf[:0], h.PeekBytes(hdrConnection)...)
	for len(list) > 0 {
		tok := list
		if i := bytes.IndexByte(list, ','); i >= 0 {
			tok, list = list[:i], list[i+1:]
		} else {
			list = nil
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) == 0 || bytes.EqualFold(tok, []byte("close")) || bytes.EqualFold(tok, []byte("keep-alive")) || protectedHeader(tok) {
			continue
		}
		h.DelBytes(tok)
	}
	for _, k := range hopHeaders {
		h.DelBytes(k)
	}
}

// prepareRequest turns the client's request into the one sent upstream:
// hop-by-hop headers out, forwarding headers in. It returns whether the
// client asked to close its connection.
func prepareRequest(ctx *fasthttp.RequestCtx) (clientClose bool) {
	req := &ctx.Request
	clientClose = req.Header.ConnectionClose()
	stripHopByHop(&req.Header)
	req.Header.DelBytes(hdrExpect) // the front end already answered 100-continue
	req.Header.ResetConnectionClose()

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
	return clientClose
}

// prepareResponse cleans a replica's response before it is relayed.
func prepareResponse(ctx *fasthttp.RequestCtx, clientClose bool) {
	h := &ctx.Response.Header
	stripHopByHop(h)
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
