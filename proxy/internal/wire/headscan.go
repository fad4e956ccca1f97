package wire

import (
	"bytes"
	"errors"

	"keyway/proxy/internal/field"
)

// The request head as the client connection delivered it. fasthttp parses
// a head only once its block holds a CRLF CRLF, and it reports little of
// what made it refuse one: HeadScan follows the head's bytes as the
// connection hands them to fasthttp, so that keyway can
//
//   - refuse at once a head that ends in a bare-LF empty line, which
//     fasthttp would otherwise wait on until server.read_timeout (it
//     reads on, looking for a CRLF CRLF that never comes);
//   - answer 414 rather than 431 when the request line alone fills
//     server.max_header_bytes;
//   - tell, for a Transfer-Encoding fasthttp refused, a coding keyway does
//     not implement (501) from framing it cannot read (400);
//   - know which header fields of interest (field.Of) the head names, as
//     field.InBlock would find them in fasthttp's raw header block, without a
//     second pass over the head: the framing check (Content-Length with
//     Transfer-Encoding) and the hop-by-hop stripping use them.
//
// fasthttp's parse decides what a request is; the scan chooses the answer
// to a head fasthttp cannot complete or refused, flags
// "Transfer-Encoding: identity", which fasthttp accepts, and says which
// fields are there. Its fields are used only when the scan followed the
// head to a CRLF CRLF end and its field block is exactly as long as
// fasthttp's (Fields): a scan that began anywhere but at the
// head's first byte does not stand in for the raw block.
//
// A scan covers one head: the connection's first, or one that starts
// after fasthttp answered the request before it (ConnState StateIdle
// resets it). A head fasthttp already had buffered when it started reading
// it (a pipelined request that came with the one before) began before the
// scan: the scan is off for it (ConnState StateActive with nothing read),
// since it could not tell that head's bytes from its body's. Such a head
// gets fasthttp's own answers (431, 400), and one ending in a bare LF
// waits for server.read_timeout as before.
//
// A HeadScan is used by one goroutine at a time: fasthttp reads a
// connection and calls ConnState from the connection's serving goroutine.
type HeadScan struct {
	st     uint8
	cr     bool // in a line: its last byte so far was CR; at a line start: the line before ended in CRLF
	seen   bool // the scan has seen bytes of this head
	http11 bool // the request line ends in HTTP/1.1
	cl     bool // a Content-Length field
	prevTE bool // the line before was a Transfer-Encoding field (folding it is not followed)
	teBad  bool // Transfer-Encoding values too long for teBuf, or folded: none kept
	// odd says that the head has a line field.InBlock cannot read: a folded
	// continuation line, a line without a colon, a name that is not a
	// token. Its fields are then not known from the scan.
	odd     bool
	te      uint8
	nameN   uint8 // hsName: bytes of the name so far (saturating)
	teLen   uint8
	tailN   uint8
	pos     uint32              // bytes of this head scanned before the current read
	block   uint32              // where the field block begins: the request line's end
	blockN  uint32              // hsDone: the field block's length, its empty line included
	fields  field.Set           // the fields named in the head so far (field.Of)
	nameBuf [field.MaxName]byte // hsName: the name so far, when it began in an earlier read
	tail    [9]byte             // the request line's last bytes: its version
	teBuf   [64]byte            // the Transfer-Encoding values, comma-joined, as sent
}

const (
	hsStart   uint8 = iota // before the request line: empty lines are skipped, as fasthttp does
	hsReqLine              // in the request line
	hsBOL                  // at the start of a header line
	hsBOLCR                // a header line that began with CR
	hsName                 // in a field name
	hsTEValue              // in a Transfer-Encoding value, kept in teBuf
	hsLine                 // in a header line of no interest
	hsDone                 // the head ended with an empty line after a CRLF-ended one; the body is not scanned
	hsBare                 // the head ended with an empty line after a bare LF, or one that is a bare LF
	hsOff                  // not scanned
)

// ErrBareLF is what a connection reads once its request's head ended in a
// bare-LF empty line and fasthttp still asks for more: fasthttp would wait
// for a CRLF CRLF the client will not send.
var ErrBareLF = errors.New("request head ends with a bare LF line: end every line of the head with CRLF")

// Reset starts the scan of a new head.
func (s *HeadScan) Reset() { *s = HeadScan{} }

// InRequestLine reports whether the scan saw the request line start and
// not end.
func (s *HeadScan) InRequestLine() bool { return s.st == hsReqLine }

// Scan follows b, the next bytes read off the connection.
func (s *HeadScan) Scan(b []byte) {
	if s.st >= hsDone || len(b) == 0 {
		return
	}
	s.seen = true
	base, total := s.pos, len(b)
	s.pos += uint32(total)
	for len(b) > 0 {
		switch s.st {
		case hsStart:
			i := 0
			for i < len(b) && (b[i] == '\r' || b[i] == '\n') {
				i++
			}
			b = b[i:]
			if len(b) > 0 {
				s.st = hsReqLine
			}
		case hsReqLine:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				s.keepTail(b)
				return
			}
			s.keepTail(b[:i])
			t := s.tail[:s.tailN]
			s.cr = len(t) > 0 && t[len(t)-1] == '\r'
			if s.cr {
				t = t[:len(t)-1]
			}
			s.http11 = bytes.HasSuffix(t, []byte("HTTP/1.1"))
			s.st = hsBOL
			b = b[i+1:]
			s.block = base + uint32(total-len(b))
		case hsLine:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				s.cr = b[len(b)-1] == '\r'
				return
			}
			if i > 0 {
				s.cr = b[i-1] == '\r'
			}
			s.st = hsBOL
			b = b[i+1:]
		case hsBOL:
			c := b[0]
			if s.prevTE {
				if c == ' ' || c == '\t' {
					// A continuation line folds into the field
					// before (obs-fold): keyway does not follow that
					// into a Transfer-Encoding value.
					s.dropTE()
				}
				s.prevTE = false
			}
			switch {
			case c == '\n':
				s.st = hsBare
				return
			case c == '\r':
				s.st = hsBOLCR
				b = b[1:]
			case field.Token[c]:
				s.st, s.nameN = hsName, 0
			default:
				// A continuation line (obs-fold), or a name that is
				// not a token: fasthttp's reading of it decides.
				s.odd = true
				s.st = hsLine
			}
		case hsBOLCR:
			if b[0] == '\n' {
				if s.cr {
					s.st = hsDone
					s.blockN = base + uint32(total-len(b)+1) - s.block
				} else {
					s.st = hsBare
				}
				return
			}
			s.odd = true
			s.st = hsLine // a bare CR, which fasthttp refuses
		case hsName:
			i := 0
			for i < len(b) && field.Token[b[i]] {
				i++
			}
			s.cr = false // the last byte taken, if any, was the name's
			if i == len(b) {
				s.keepName(b) // the name goes on in the next read
				return
			}
			if b[i] != ':' {
				// A space before the colon, or a line without one.
				s.odd = true
				s.st = hsLine // b[i] is left to hsLine: it may be the LF
				b = b[i:]
				continue
			}
			name := b[:i]
			if s.nameN > 0 {
				s.keepName(name)
				name = nil // too long for any field of interest
				if int(s.nameN) <= field.MaxName {
					name = s.nameBuf[:s.nameN]
				}
			}
			f := field.Of(name, nil)
			s.fields |= f
			b = b[i+1:]
			switch {
			case f&field.TransferEncoding != 0:
				if s.te++; s.te > 1 {
					s.keepTE([]byte{','})
				}
				s.st = hsTEValue
			case f&field.ContentLength != 0:
				s.cl = true
				s.st = hsLine
			default:
				s.st = hsLine
			}
		case hsTEValue:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				s.keepTE(b)
				s.cr = b[len(b)-1] == '\r'
				return
			}
			s.keepTE(b[:i])
			if i > 0 {
				s.cr = b[i-1] == '\r'
			}
			s.prevTE = true
			s.st = hsBOL
			b = b[i+1:]
		}
	}
}

// Done reports whether the scan followed the head to its CRLF CRLF end.
func (s *HeadScan) Done() bool { return s.st == hsDone }

// Bare reports whether the head ended in a bare-LF empty line (ErrBareLF).
func (s *HeadScan) Bare() bool { return s.st == hsBare }

// HTTP11 reports whether the request line ended in HTTP/1.1.
func (s *HeadScan) HTTP11() bool { return s.http11 }

// ContentLength reports whether the head has a Content-Length field.
func (s *HeadScan) ContentLength() bool { return s.cl }

// TransferEncoding returns how many Transfer-Encoding fields the head has,
// and their values, comma-joined as sent; ok is false where the values
// could not be kept whole (too long, or folded).
func (s *HeadScan) TransferEncoding() (n int, values []byte, ok bool) {
	return int(s.te), s.teBuf[:s.teLen], !s.teBad
}

// Fields returns the fields named in the head the scan followed to its
// end, as a reader of fasthttp's raw header block (raw,
// RequestHeader.RawHeaders) would find them, and whether the scan can
// tell: not for a head it did not follow to a CRLF CRLF end, nor one with
// a line that takes fasthttp's reading to interpret, nor one whose field
// block is not raw's length (fasthttp keeps no block for a head without
// fields: raw is empty, the scan's block is the empty line alone).
func (s *HeadScan) Fields(raw []byte) (field.Set, bool) {
	ok := s.st == hsDone && !s.odd && (int(s.blockN) == len(raw) || len(raw) == 0 && s.blockN == 2)
	return s.fields, ok
}

// keepTail keeps the last bytes of the request line seen so far.
func (s *HeadScan) keepTail(b []byte) {
	if len(b) >= len(s.tail) {
		copy(s.tail[:], b[len(b)-len(s.tail):])
		s.tailN = uint8(len(s.tail))
		return
	}
	keep := min(int(s.tailN), len(s.tail)-len(b))
	copy(s.tail[:keep], s.tail[int(s.tailN)-keep:s.tailN])
	copy(s.tail[keep:], b)
	s.tailN = uint8(keep + len(b))
}

// keepName appends b to the name kept; a name longer than any of
// interest is not kept, only counted past field.MaxName.
func (s *HeadScan) keepName(b []byte) {
	n := int(s.nameN)
	if n+len(b) > field.MaxName {
		s.nameN = uint8(field.MaxName + 1)
		return
	}
	copy(s.nameBuf[n:], b)
	s.nameN = uint8(n + len(b))
}

// keepTE appends b to the Transfer-Encoding values kept.
func (s *HeadScan) keepTE(b []byte) {
	switch {
	case s.teBad:
	case int(s.teLen)+len(b) > len(s.teBuf):
		s.dropTE()
	default:
		s.teLen += uint8(copy(s.teBuf[s.teLen:], b))
	}
}

// dropTE gives up on the Transfer-Encoding values: they cannot be kept
// whole.
func (s *HeadScan) dropTE() { s.teBad, s.teLen = true, 0 }
