package balancer

import (
	"bytes"

	"github.com/cespare/xxhash/v2"
)

// KeyStatus is the outcome of looking for a key in one source.
type KeyStatus uint8

const (
	KeyMissing KeyStatus = iota // the source is absent or empty: try the next one
	KeyOK                       // a key was found and hashed
	KeyInvalid                  // the source holds a key in a non-canonical form: reject the request
	// KeyDuplicate says the source names the key more than once (two
	// query parameters of the name): reject the request, since a replica
	// that reads another occurrence, or all of them, works on a different
	// key than the one the request was routed by.
	KeyDuplicate
)

// HashKey hashes a key in canonical form. Every source hashes its decoded
// key with it, so "abc" from a header, from "/ingest/abc" and from
// "?key=abc" land on the same replica. Proxies and the admin API must agree
// on it: it is part of the ring fingerprint (xxhash64, seed 0).
//
// All Hash functions are pure: safe for concurrent use, no allocation, and
// they do not retain their arguments.
func HashKey(key []byte) uint64 { return xxhash.Sum64(key) }

// HashString is [HashKey] for a string, without copying it.
func HashString(key string) uint64 { return xxhash.Sum64String(key) }

// Every source has a Hash function, which routing calls per request, and
// an Append function, which appends the key in canonical form (the bytes
// HashKey hashes to the Hash function's hash) for whoever must show it,
// such as the access log. Both are built on one search of the source
// (pathSegmentKey, queryKey) and one set of escape rules (escapes), so
// they agree on every key and status. An Append function returns dst
// unchanged unless the status is KeyOK.

// HashHeader hashes a header value taken as-is (no decoding, no trimming:
// the HTTP parser already trimmed it). An empty value is [KeyMissing].
func HashHeader(v []byte) (uint64, KeyStatus) {
	if len(v) == 0 {
		return 0, KeyMissing
	}
	return xxhash.Sum64(v), KeyOK
}

// HashHeaderValues is [HashHeader] for every value of the key's header
// field that a request carries, in order: two fields or more are
// [KeyDuplicate], whatever their values.
func HashHeaderValues(vs [][]byte) (uint64, KeyStatus) {
	switch len(vs) {
	case 0:
		return 0, KeyMissing
	case 1:
		return HashHeader(vs[0])
	}
	return 0, KeyDuplicate
}

// AppendHeaderValuesKey appends the key [HashHeaderValues] hashes: the
// one value itself.
func AppendHeaderValuesKey(dst []byte, vs [][]byte) ([]byte, KeyStatus) {
	switch len(vs) {
	case 0:
		return dst, KeyMissing
	case 1:
		return AppendHeaderKey(dst, vs[0])
	}
	return dst, KeyDuplicate
}

// AppendHeaderKey appends the key [HashHeader] hashes: v itself.
func AppendHeaderKey(dst, v []byte) ([]byte, KeyStatus) {
	if len(v) == 0 {
		return dst, KeyMissing
	}
	return append(dst, v...), KeyOK
}

// HashPathSegment hashes the n-th (1-based) segment of a raw, undecoded
// request path such as "/ingest/abc?x" (anything from '?' on is ignored).
//
// There is one canonical form: percent escapes are decoded ("%61bc" is
// "abc"), but a path whose key could mean something else to a replica
// after normalisation is rejected with [KeyInvalid] rather than normalised:
//   - in the key segment: an encoded slash, backslash, dot or percent sign
//     (%2F, %5C, %2E, %25, either case), a raw backslash, a malformed
//     escape ("%4", "%zz");
//   - in the key segment or any segment before it: a dot-segment, raw or
//     encoded ("." "..", "%2e", ".%2E", ...);
//   - in a segment before the key: anything that moves the key to another
//     segment index when a replica normalises the path: an empty segment
//     ("//", which many servers collapse), a raw backslash, %2F or %5C;
//   - an empty key segment followed by more path ("/ingest//abc" with n=2).
//
// A missing key segment, or an empty last one ("/ingest/"), is
// [KeyMissing]. Segments after the key are not looked at. It does not
// allocate and is safe for concurrent use.
func HashPathSegment(path []byte, n int) (uint64, KeyStatus) {
	seg, st := pathSegmentKey(path, n)
	if st != KeyOK {
		return 0, st
	}
	if bytes.IndexByte(seg, '%') < 0 {
		return xxhash.Sum64(seg), KeyOK
	}
	return hashDecoded(seg, pathEscapes)
}

// AppendPathSegmentKey appends the key [HashPathSegment] hashes: the
// segment with its escapes decoded.
func AppendPathSegmentKey(dst, path []byte, n int) ([]byte, KeyStatus) {
	seg, st := pathSegmentKey(path, n)
	if st != KeyOK {
		return dst, st
	}
	return appendDecoded(dst, seg, pathEscapes)
}

// pathSegmentKey finds the raw key segment of HashPathSegment, and checks
// every rule but those on the key's escapes (pathEscapes has those).
func pathSegmentKey(path []byte, n int) ([]byte, KeyStatus) {
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if len(path) == 0 || path[0] != '/' || n < 1 {
		return nil, KeyMissing
	}
	rest := path[1:]
	for i := 1; ; i++ {
		seg := rest
		j := bytes.IndexByte(rest, '/')
		if j >= 0 {
			seg, rest = rest[:j], rest[j+1:]
		}
		if isDotSegment(seg) {
			return nil, KeyInvalid
		}
		if i == n {
			switch {
			case len(seg) == 0 && j >= 0:
				return nil, KeyInvalid
			case len(seg) == 0:
				return nil, KeyMissing
			case bytes.IndexByte(seg, '\\') >= 0:
				return nil, KeyInvalid
			}
			return seg, KeyOK
		}
		if j < 0 {
			return nil, KeyMissing
		}
		if shiftsSegments(seg) {
			return nil, KeyInvalid
		}
	}
}

// isDotSegment reports whether a raw segment is "." or ".." once decoded.
func isDotSegment(s []byte) bool {
	dots := 0
	for len(s) > 0 && dots < 3 {
		switch {
		case s[0] == '.':
			s = s[1:]
		case len(s) >= 3 && s[0] == '%' && s[1] == '2' && (s[2] == 'e' || s[2] == 'E'):
			s = s[3:]
		default:
			return false
		}
		dots++
	}
	return len(s) == 0 && dots > 0 && dots < 3
}

// shiftsSegments reports whether a segment before the key could split or
// vanish when a server normalises the path: empty ("//"), or holding a
// backslash, raw or encoded, or an encoded slash.
func shiftsSegments(s []byte) bool {
	if len(s) == 0 || bytes.IndexByte(s, '\\') >= 0 {
		return true
	}
	for i := bytes.IndexByte(s, '%'); i >= 0 && i+2 < len(s); {
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if b := hi<<4 | lo; ok1 && ok2 && (b == '/' || b == '\\') {
			return true
		}
		j := bytes.IndexByte(s[i+1:], '%')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// HashQuery hashes the value of the first query parameter called name in a
// raw query string ("a=1&key=abc"), like Go's url.Values.Get: a repeated
// name uses its first occurrence, even when that one is empty. The name is
// compared raw (undecoded); the value is decoded
// (application/x-www-form-urlencoded: %XX and '+' for space, so %2F is
// allowed here and "a/b" is a valid key). A malformed escape is
// [KeyInvalid]; an absent or empty value, or a name without '=', is
// [KeyMissing]; a name that occurs twice or more is [KeyDuplicate],
// whatever the values. It does not allocate.
func HashQuery(query, name []byte) (uint64, KeyStatus) {
	v, dup := queryKey(query, name)
	if dup {
		return 0, KeyDuplicate
	}
	if len(v) == 0 {
		return 0, KeyMissing
	}
	if bytes.IndexByte(v, '%') < 0 && bytes.IndexByte(v, '+') < 0 {
		return xxhash.Sum64(v), KeyOK
	}
	return hashDecoded(v, queryEscapes)
}

// AppendQueryKey appends the key [HashQuery] hashes: the value with its
// escapes decoded and '+' as a space.
func AppendQueryKey(dst, query, name []byte) ([]byte, KeyStatus) {
	v, dup := queryKey(query, name)
	if dup {
		return dst, KeyDuplicate
	}
	if len(v) == 0 {
		return dst, KeyMissing
	}
	return appendDecoded(dst, v, queryEscapes)
}

// queryKey finds the raw value of HashQuery's parameter's first
// occurrence, empty when it is missing, and whether the name occurs again.
func queryKey(query, name []byte) (v []byte, dup bool) {
	found := false
	for len(query) > 0 {
		pair := query
		if i := bytes.IndexByte(query, '&'); i >= 0 {
			pair, query = query[:i], query[i+1:]
		} else {
			query = nil
		}
		k, val := pair, []byte(nil)
		if i := bytes.IndexByte(pair, '='); i >= 0 {
			k, val = pair[:i], pair[i+1:]
		}
		if bytes.Equal(k, name) {
			if found {
				return v, true
			}
			v, found = val, true
		}
	}
	return v, false
}

// escapes says how a source's raw key is decoded: percent escapes always,
// '+' as a space in a query value (plusIsSpace). A malformed escape is
// refused, and in a path segment (strict) also an escaped '/', backslash,
// '.' or '%'.
type escapes struct{ plusIsSpace, strict bool }

var (
	pathEscapes  = escapes{strict: true}
	queryEscapes = escapes{plusIsSpace: true}
)

// refuses reports whether the byte b an escape stands for is refused.
func (e escapes) refuses(b byte) bool {
	return e.strict && (b == '/' || b == '\\' || b == '.' || b == '%')
}

// hashDecoded hashes the raw key s decoded, streaming the runs between
// escapes and the decoded bytes through a digest, without a buffer.
//
// hashDecoded and appendDecoded are one loop written twice: shared, it
// would cost the hash a call per escape. TestAppendKeys and the fuzz
// targets check that they agree.
func hashDecoded(s []byte, e escapes) (uint64, KeyStatus) {
	var d xxhash.Digest
	d.Reset()
	var one [1]byte
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) {
				return 0, KeyInvalid
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			b := hi<<4 | lo
			if !ok1 || !ok2 || e.refuses(b) {
				return 0, KeyInvalid
			}
			_, _ = d.Write(s[start:i])
			one[0] = b
			_, _ = d.Write(one[:])
			i += 2
			start = i + 1
		case c == '+' && e.plusIsSpace:
			_, _ = d.Write(s[start:i])
			one[0] = ' '
			_, _ = d.Write(one[:])
			start = i + 1
		}
	}
	_, _ = d.Write(s[start:])
	return d.Sum64(), KeyOK
}

// appendDecoded appends the raw key s decoded to dst, as hashDecoded
// hashes it (dst unchanged when an escape is refused).
func appendDecoded(dst, s []byte, e escapes) ([]byte, KeyStatus) {
	n := len(dst)
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) {
				return dst[:n], KeyInvalid
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			b := hi<<4 | lo
			if !ok1 || !ok2 || e.refuses(b) {
				return dst[:n], KeyInvalid
			}
			dst = append(dst, s[start:i]...)
			dst = append(dst, b)
			i += 2
			start = i + 1
		case c == '+' && e.plusIsSpace:
			dst = append(dst, s[start:i]...)
			dst = append(dst, ' ')
			start = i + 1
		}
	}
	return append(dst, s[start:]...), KeyOK
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
