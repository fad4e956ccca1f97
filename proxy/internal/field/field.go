// Package field knows the HTTP header fields keyway rewrites or reads,
// one bit each, and finds them by name without allocating: the client
// connection's head scan (package wire) and the proxy's rewriting share
// it.
package field

import (
	"bytes"
	"encoding/binary"
)

// Set is a set of the header fields keyway rewrites or reads, one bit
// each: the nine hop-by-hop headers (bit i is HopNames[i]), Expect,
// X-Forwarded-For, X-Request-Id, X-Forwarded-Proto, X-Forwarded-Host,
// Content-Length and a replica set's pressure header.
// Knowing which are present lets the rewriting skip the lookups and
// deletions of the absent ones, which are almost all of them: each
// fasthttp lookup or deletion copies and normalises the name, then walks
// every field. All makes every lookup and deletion happen.
type Set uint32

const (
	Connection Set = 1 << iota
	ProxyConnection
	KeepAlive
	ProxyAuthenticate
	ProxyAuthorization
	TE
	Trailer
	TransferEncoding
	Upgrade
	Expect
	XFF
	RequestID
	XFProto
	XFHost
	ContentLength
	Pressure

	All = Pressure<<1 - 1
	// Hop are the hop-by-hop headers' bits (bit i is HopNames[i]).
	Hop = Upgrade<<1 - 1
)

// HopNames are the hop-by-hop headers (RFC 9110 §7.6.1, plus the de-facto
// Proxy-Connection and Keep-Alive): they describe one connection and are
// never forwarded. Bit i of Hop is HopNames[i].
var HopNames = [][]byte{
	[]byte("Connection"), []byte("Proxy-Connection"), []byte("Keep-Alive"),
	[]byte("Proxy-Authenticate"), []byte("Proxy-Authorization"), []byte("Te"),
	[]byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
}

// names are the fields' names in their usual case, by bit (Pressure has
// none: each set names its own).
var names = func() (t [16][]byte) {
	copy(t[:], HopNames)
	for f, n := range map[Set]string{
		Expect: "Expect", XFF: "X-Forwarded-For", RequestID: "X-Request-Id",
		XFProto: "X-Forwarded-Proto", XFHost: "X-Forwarded-Host", ContentLength: "Content-Length",
	} {
		t[bit(f)] = []byte(n)
	}
	return t
}()

func bit(f Set) int {
	for i := range 32 {
		if f == 1<<i {
			return i
		}
	}
	panic("field: not one field")
}

// Name returns the name of the one field f, in its usual case; nil for
// Pressure. The caller must not modify it.
func Name(f Set) []byte { return names[bit(f)] }

// MaxName is the longest name Of knows (Proxy-Authorization): a longer
// name is no field of interest.
const MaxName = len("Proxy-Authorization")

// Token are the bytes allowed in a header name (RFC 9110 §5.6.2).
var Token = func() (t [256]bool) {
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

// known is a field of interest, ready for Of's comparison: a name of
// eight bytes or more is compared a word at a time, at the offsets off
// (the last word overlapping the one before where the length is no
// multiple of eight). A byte of a word matches when, with the bits of mask
// set, it equals want's: mask has the ASCII case bit (0x20) for a letter
// and no bit for any other byte, so a letter matches in either case and
// any other byte only itself, as EqualFold compares.
type known struct {
	name []byte
	f    Set
	nw   uint8 // words compared; 0: a name shorter than a word, compared bytewise
	off  [3]uint8
	want [3]uint64
	mask [3]uint64
}

// byLen lists the fields by the length of their names: most names of a
// request have a length no field of interest has, and cost Of one table
// lookup.
var byLen = func() (t [MaxName + 1][]known) {
	for i, name := range names {
		if len(name) == 0 {
			continue
		}
		if len(name) > MaxName {
			panic("field: name " + string(name) + " is longer than MaxName")
		}
		c := known{name: name, f: 1 << i}
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
	return t
}()

// lens has bit n set where a field of interest has a name n bytes long.
var lens = func() (m uint32) {
	for n, cs := range byLen {
		if len(cs) > 0 {
			m |= 1 << n
		}
	}
	return m
}()

// Of returns the field called name (in any case), or 0 for a field keyway
// neither rewrites nor reads. pressure is the set's pressure header, or
// nil. Most names have a length no field of interest has: Of, inlined,
// tells them by one bit of lens.
func Of(name, pressure []byte) Set {
	if lens>>uint(len(name))&1 == 0 && len(pressure) == 0 {
		return 0
	}
	return ofLen(name, pressure)
}

// ofLen is Of for a name that may be of interest.
func ofLen(name, pressure []byte) Set {
	if len(name) == 0 {
		return 0
	}
	var f Set
	if len(name) <= MaxName {
	names:
		for i := range byLen[len(name)] {
			c := &byLen[len(name)][i]
			if c.nw == 0 {
				if EqualFold(name, c.name) {
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
	if len(pressure) == len(name) && name[0]|0x20 == pressure[0]|0x20 && EqualFold(name, pressure) {
		f |= Pressure
	}
	return f
}

// EqualFold reports whether a and b are equal but for the case of ASCII
// letters. Unlike bytes.EqualFold, it takes no two bytes that are not
// UTF-8 for equal, nor a non-ASCII letter for an ASCII one.
func EqualFold(a, b []byte) bool {
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

// InBlock returns the fields named in a request's raw header block
// (RawHeaders: the field lines exactly as received, and the empty line
// that ends them), and whether the block could tell. Every field fasthttp
// keeps came from a line of that block, so a field absent from it is
// absent from the request. It cannot tell for an empty block, or a line
// that would take fasthttp's reading to interpret (a folded continuation
// line, a line without a colon), or a name that is not a token (which
// keyway refuses).
func InBlock(raw []byte) (Set, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	var f Set
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
			if !Token[c] {
				return 0, false // a space or tab first: a folded line
			}
		}
		f |= Of(name, nil)
	}
	return f, true
}
