// Package jsonstr writes strings into JSON lines: keyway's one JSON
// string escaper, shared by the access log (proxy) and the audit trail
// (eventlog). It appends to the caller's buffer and allocates nothing, so
// that a log line can be built per request.
//
// Whatever the input (a client's path, a header, bytes that are not
// UTF-8), the output is a valid JSON string that never spans lines:
// quotes, backslashes, control characters and DEL are escaped; invalid
// UTF-8 becomes U+FFFD, one per invalid byte; U+2028 and U+2029 are
// escaped, since JavaScript reads them as line terminators. Valid UTF-8
// decodes back to itself.
package jsonstr

import "unicode/utf8"

// Append appends s to dst as a quoted JSON string.
func Append[S string | []byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst, _ = AppendEscaped(dst, s, len(s))
	return append(dst, '"')
}

// AppendCut appends s, cut to at most max bytes (see AppendEscaped), to
// dst as a quoted JSON string, and reports whether it was cut.
func AppendCut[S string | []byte](dst []byte, s S, max int) ([]byte, bool) {
	dst = append(dst, '"')
	dst, cut := AppendEscaped(dst, s, max)
	return append(dst, '"'), cut
}

// AppendEscaped appends s escaped for the inside of a JSON string (no
// quotes), and reports whether it was cut: when s is longer than max
// bytes (max < 0 counts as 0), only its first max bytes are written,
// fewer (by at most 3) when max falls inside a UTF-8 sequence, so that no
// character is split into a replacement character.
func AppendEscaped[S string | []byte](dst []byte, s S, max int) ([]byte, bool) {
	cut := false
	if max < 0 {
		max = 0
	}
	if len(s) > max {
		cut = true
		n := max
		for k := 0; k < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(s[n]); k++ {
			n--
		}
		if !utf8.RuneStart(s[n]) { // not UTF-8 there anyway
			n = max
		}
		s = s[:n]
	}
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < 0x7f {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		// At most 4 bytes converted: on the stack, for either type.
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(dst, s[start:]...), cut
}

const hexDigits = "0123456789abcdef"
