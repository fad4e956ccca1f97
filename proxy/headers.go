package proxy

import (
	"bytes"
	"encoding/binary"

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
// X-Forwarded-For, X-Request-Id, X-Forwarded-Proto, X-Forwarded-Host,
// Content-Length (for checkFraming) and a
// replica set's pressure header.
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
	fXFProto
	fXFHost
	fContentLength
	fPressure

	fieldsAll = fPressure<<1 - 1
	// hopFields are the hop-by-hop headers' bits (bit i is hopHeaders[i]).
	hopFields = fUpgrade<<1 - 1
)

// fieldName is a field of interest, ready for fieldOf's comparison: a
// name of eight bytes or more is compared a word at a time, at the
// offsets off (the last word overlapping the one before where the length
// is no multiple of eight). A byte of a word matches when, with the bits
// of mask set, it equals want's: mask has the ASCII case bit (0x20) for a
// letter and no bit for any other byte, so a letter matches in either
// case and any other byte only itself, as asciiEqualFold compares.
type fieldName struct {
	name []byte
	f    fields
	nw   uint8 // words compared; 0: a name shorter than a word, compared bytewise
	off  [3]uint8
	want [3]uint64
	mask [3]uint64
}

// fieldsByLen lists the fields by the length of their names: most names
// of a request have a length no field of interest has, and cost fieldOf
// one table lookup.
var fieldsByLen = func() (t [maxFieldName + 1][]fieldName) {
	add := func(name []byte, f fields) {
		if len(name) > maxFieldName {
			panic("proxy: field name " + string(name) + " is longer than maxFieldName")
		}
		c := fieldName{name: name, f: f}
		if n := len(name); n >= 8 {
			for o := 0; ; o += 8 {
				if o+8 > n {
					o = n - 8
				}
				var want, mask uint64
				for k := 7; k >= 0; k-- {
					b := name[o+k]
					m := byte(0)
					if b|0x20 >= 'a' && b|0x20 <= 'z' {
						m = 0x20
					}
					want, mask = want<<8|uint64(b|m), mask<<8|uint64(m)
				}
				c.off[c.nw], c.want[c.nw], c.mask[c.nw] = uint8(o), want, mask
				c.nw++
				if o+8 == n {
					break
				}
			}
		}
		t[len(name)] = append(t[len(name)], c)
	}
	for i, name := range hopHeaders {
		add(name, 1<<i)
	}
	add(hdrExpect, fExpect)
	add(hdrXFF, fXFF)
	add(hdrRequestID, fRequestID)
	add(hdrXFProto, fXFProto)
	add(hdrXFHost, fXFHost)
	add(hdrContentLength, fContentLength)
	return t
}()

// fieldLens has bit n set where a field of interest has a name n bytes
// long.
var fieldLens = func() (m uint32) {
	for n, cs := range fieldsByLen {
		if len(cs) > 0 {
			m |= 1 << n
		}
	}
	return m
}()

// fieldOf returns the field called name (in any case), or 0 for a field
// keyway neither rewrites nor reads. pressure is the set's pressure header, or nil.
// Most names have a length no field of interest has: fieldOf, inlined,
// tells them by one bit of fieldLens.
func fieldOf(name, pressure []byte) fields {
	if fieldLens>>uint(len(name))&1 == 0 && len(pressure) == 0 {
		return 0
	}
	return fieldOfLen(name, pressure)
}

// fieldOfLen is fieldOf for a name that may be of interest.
func fieldOfLen(name, pressure []byte) fields {
	if len(name) == 0 {
		return 0
	}
	var f fields
	if len(name) <= maxFieldName {
	names:
		for i := range fieldsByLen[len(name)] {
			c := &fieldsByLen[len(name)][i]
			if c.nw == 0 {
				if asciiEqualFold(name, c.name) {
					f = c.f
					break
				}
				continue
			}
			for k := range c.nw {
				o := int(c.off[k])
				if binary.LittleEndian.Uint64(name[o:o+8])|c.mask[k] != c.want[k] {
					continue names
				}
			}
			f = c.f
			break
		}
	}
	if len(pressure) == len(name) && name[0]|0x20 == pressure[0]|0x20 && asciiEqualFold(name, pressure) {
		f |= fPressure
	}
	return f
}

// asciiEqualFold reports whether a and b are equal but for the case of
// ASCII letters. Unlike bytes.EqualFold, it takes no two bytes that are
// not UTF-8 for equal, nor a non-ASCII letter for an ASCII one.
func asciiEqualFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z' {
			return false
		}
	}
	return true
}

// rawFields returns the fields named in a request's raw header block
// (RawHeaders: the field lines exactly as received, and the empty line
// that ends them), and whether the block could tell. Every field fasthttp
// keeps came from a line of that block, so a field absent from it is
// absent from the request. It cannot tell for an empty block, or a line
// that would take fasthttp's reading to interpret (a folded continuation
// line, a line without a colon), or a name that is not a token (which
// checkFraming refuses).
func rawFields(raw []byte) (fields, bool) {
	if len(raw) == 0 {
		return 0, false
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
		i := bytes.IndexByte(line, ':')
		if i <= 0 {
			return 0, false
		}
		name := line[:i]
		for _, c := range name {
			if !tokenChars[c] {
				return 0, false // a space or tab first: a folded line
			}
		}
		f |= fieldOf(name, nil)
	}
	return f, true
}

// requestFields returns the fields of a request whose head fasthttp
// parsed, from its raw header block (rawFields), or fieldsAll where that
// cannot tell, and for a chunked request (its trailer fields come after
// the body, outside the block).
func requestFields(h *fasthttp.RequestHeader) fields {
	if h.ContentLength() == -1 {
		return fieldsAll
	}
	f, ok := rawFields(h.RawHeaders())
	if !ok {
		return fieldsAll
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
	if f&hopFields == 0 {
		return // almost every message: none of them
	}
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
	if f&hopFields == 0 {
		return // almost every message: none of them
	}
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
