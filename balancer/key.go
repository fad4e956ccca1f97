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
)

// HashKey hashes a key in canonical form. Every source hashes its decoded
// key with it, so "abc" from a header, from "/ingest/abc" and from
// "?key=abc" land on the same replica. Proxies and the admin API must agree
// on it: it is part of the ring fingerprint (xxhash64, seed 0).
func HashKey(key []byte) uint64 { return xxhash.Sum64(key) }

// HashString is [HashKey] for a string, without copying it.
func HashString(key string) uint64 { return xxhash.Sum64String(key) }

// HashHeader hashes a header value taken as-is. An empty value is missing.
func HashHeader(v []byte) (uint64, KeyStatus) {
	if len(v) == 0 {
		return 0, KeyMissing
	}
	return xxhash.Sum64(v), KeyOK
}

// HashPathSegment hashes the n-th (1-based) segment of a raw, undecoded
// request path such as "/ingest/abc?x" (anything from '?' on is ignored).
//
// There is one canonical form: percent escapes are decoded ("%61bc" is
// "abc"), but a key that could mean something else to a replica after
// normalisation is rejected with [KeyInvalid] rather than normalised: an
// encoded slash, backslash, dot or percent sign (%2F, %5C, %2E, %25), a raw
// backslash, a malformed escape, or a dot-segment ("." or "..") anywhere up
// to and including the key segment. A missing or empty segment is
// [KeyMissing]. It does not allocate.
func HashPathSegment(path []byte, n int) (uint64, KeyStatus) {
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if len(path) == 0 || path[0] != '/' || n < 1 {
		return 0, KeyMissing
	}
	rest := path[1:]
	for i := 1; ; i++ {
		seg := rest
		j := bytes.IndexByte(rest, '/')
		if j >= 0 {
			seg, rest = rest[:j], rest[j+1:]
		}
		if isDotSegment(seg) {
			return 0, KeyInvalid
		}
		if i == n {
			return hashPathKey(seg)
		}
		if j < 0 {
			return 0, KeyMissing
		}
	}
}

func isDotSegment(s []byte) bool {
	return (len(s) == 1 && s[0] == '.') || (len(s) == 2 && s[0] == '.' && s[1] == '.')
}

func hashPathKey(seg []byte) (uint64, KeyStatus) {
	if len(seg) == 0 {
		return 0, KeyMissing
	}
	if bytes.IndexByte(seg, '\\') >= 0 {
		return 0, KeyInvalid
	}
	if bytes.IndexByte(seg, '%') < 0 {
		return xxhash.Sum64(seg), KeyOK
	}
	return hashDecoded(seg, false, true)
}

// HashQuery hashes the value of the first query parameter called name in a
// raw query string ("a=1&key=abc"). The value is decoded
// (application/x-www-form-urlencoded: %XX and '+'); a malformed escape is
// [KeyInvalid], an absent or empty value [KeyMissing]. It does not allocate.
func HashQuery(query, name []byte) (uint64, KeyStatus) {
	for len(query) > 0 {
		pair := query
		if i := bytes.IndexByte(query, '&'); i >= 0 {
			pair, query = query[:i], query[i+1:]
		} else {
			query = nil
		}
		k, v := pair, []byte(nil)
		if i := bytes.IndexByte(pair, '='); i >= 0 {
			k, v = pair[:i], pair[i+1:]
		}
		if !bytes.Equal(k, name) {
			continue
		}
		if len(v) == 0 {
			return 0, KeyMissing
		}
		if bytes.IndexByte(v, '%') < 0 && bytes.IndexByte(v, '+') < 0 {
			return xxhash.Sum64(v), KeyOK
		}
		return hashDecoded(v, true, false)
	}
	return 0, KeyMissing
}

// hashDecoded percent-decodes s into a digest in runs, without a buffer.
func hashDecoded(s []byte, plusIsSpace, strictPath bool) (uint64, KeyStatus) {
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
			if !ok1 || !ok2 {
				return 0, KeyInvalid
			}
			b := hi<<4 | lo
			if strictPath && (b == '/' || b == '\\' || b == '.' || b == '%') {
				return 0, KeyInvalid
			}
			_, _ = d.Write(s[start:i])
			one[0] = b
			_, _ = d.Write(one[:])
			i += 2
			start = i + 1
		case c == '+' && plusIsSpace:
			_, _ = d.Write(s[start:i])
			one[0] = ' '
			_, _ = d.Write(one[:])
			start = i + 1
		}
	}
	_, _ = d.Write(s[start:])
	return d.Sum64(), KeyOK
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
