package proxy

import (
	"bytes"
	"errors"
	"net"

	"github.com/valyala/fasthttp"
)

// The request head as the client connection delivered it. fasthttp parses
// a head only once its block holds a CRLF CRLF, and it reports little of
// what made it refuse one: headScan follows the head's bytes as the
// connection hands them to fasthttp, so that keyway can
//
//   - refuse at once a head that ends in a bare-LF empty line, which
//     fasthttp would otherwise wait on until server.read_timeout (it
//     reads on, looking for a CRLF CRLF that never comes);
//   - answer 414 rather than 431 when the request line alone fills
//     server.max_header_bytes;
//   - tell, for a Transfer-Encoding fasthttp refused, a coding keyway does
//     not implement (501) from framing it cannot read (400).
//
// It never decides what is forwarded: fasthttp's parse does. It only
// chooses the answer to a head fasthttp cannot complete or refused, and
// flags "Transfer-Encoding: identity", which fasthttp accepts.
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
// A headScan is used by one goroutine at a time: fasthttp reads a
// connection and calls ConnState from the connection's serving goroutine.
type headScan struct {
	st     uint8
	cr     bool // in a line: its last byte so far was CR; at a line start: the line before ended in CRLF
	seen   bool // the scan has seen bytes of this head
	http11 bool // the request line ends in HTTP/1.1
	cl     bool // a Content-Length field
	prevTE bool // the line before was a Transfer-Encoding field (folding it is not followed)
	teBad  bool // Transfer-Encoding values too long for teBuf, or folded: none kept
	te     uint8
	name   uint8 // hsName: bytes of want matched so far
	want   uint8 // hsName: the field name matched (nameTE, nameCL)
	teLen  uint8
	tailN  uint8
	tail   [9]byte  // the request line's last bytes: its version
	teBuf  [64]byte // the Transfer-Encoding values, comma-joined, as sent
}

const (
	hsStart   uint8 = iota // before the request line: empty lines are skipped, as fasthttp does
	hsReqLine              // in the request line
	hsBOL                  // at the start of a header line
	hsBOLCR                // a header line that began with CR
	hsName                 // matching a field name of interest
	hsTEValue              // in a Transfer-Encoding value, kept in teBuf
	hsLine                 // in a header line of no interest
	hsDone                 // the head ended with an empty line after a CRLF-ended one; the body is not scanned
	hsBare                 // the head ended with an empty line after a bare LF, or one that is a bare LF
	hsOff                  // not scanned
)

const (
	nameTE = iota
	nameCL
)

// fieldNames are the field names the scan notes, lower case, colon
// included: fasthttp refuses a space before the colon as a bad name.
var fieldNames = [...]string{nameTE: "transfer-encoding:", nameCL: "content-length:"}

// fieldFolds has, for each byte of a field name, the bit that ORed into a
// received byte makes it lower case: 0x20 for a letter, none for '-' and
// ':' (which that bit would confuse with CR and a control byte).
var fieldFolds = func() (f [len(fieldNames)][]byte) {
	for i, name := range fieldNames {
		f[i] = make([]byte, len(name))
		for j := range len(name) {
			if 'a' <= name[j] && name[j] <= 'z' {
				f[i][j] = 0x20
			}
		}
	}
	return f
}()

// errBareLF is what a connection reads once its request's head ended in a
// bare-LF empty line and fasthttp still asks for more: fasthttp would wait
// for a CRLF CRLF the client will not send.
var errBareLF = errors.New("request head ends with a bare LF line: end every line of the head with CRLF")

// reset starts the scan of a new head.
func (s *headScan) reset() { *s = headScan{} }

// inRequestLine reports whether the scan saw the request line start and
// not end.
func (s *headScan) inRequestLine() bool { return s.st == hsReqLine }

// scan follows b, the next bytes read off the connection.
func (s *headScan) scan(b []byte) {
	if s.st >= hsDone || len(b) == 0 {
		return
	}
	s.seen = true
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
			s.http11 = bytes.HasSuffix(t, strHTTP11)
			s.st = hsBOL
			b = b[i+1:]
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
			case c == 'T' || c == 't':
				s.st, s.want, s.name = hsName, nameTE, 1
				b = b[1:]
			case c == 'C' || c == 'c':
				s.st, s.want, s.name = hsName, nameCL, 1
				b = b[1:]
			default:
				s.st = hsLine
			}
		case hsBOLCR:
			if b[0] == '\n' {
				if s.cr {
					s.st = hsDone
				} else {
					s.st = hsBare
				}
				return
			}
			s.st = hsLine // a bare CR, which fasthttp refuses
		case hsName:
			want, fold := fieldNames[s.want], fieldFolds[s.want]
			j, k := int(s.name), 0
			for k < len(b) && j < len(want) && b[k]|fold[j] == want[j] {
				j++
				k++
			}
			b = b[k:]
			s.cr = false // the last byte taken, if any, was the name's
			switch {
			case j < len(want) && len(b) == 0:
				s.name = uint8(j) // the name goes on in the next read
			case j < len(want):
				s.st = hsLine // b[0] is left to hsLine: it may be the LF
			case s.want == nameCL:
				s.cl = true
				s.st = hsLine
			default:
				if s.te++; s.te > 1 {
					s.keepTE([]byte{','})
				}
				s.st = hsTEValue
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

// keepTail keeps the last bytes of the request line seen so far.
func (s *headScan) keepTail(b []byte) {
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

// keepTE appends b to the Transfer-Encoding values kept.
func (s *headScan) keepTE(b []byte) {
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
func (s *headScan) dropTE() { s.teBad, s.teLen = true, 0 }

// headScanOf returns the scan of a client connection, or nil for one
// keyway does not scan (ciphertext beneath TLS, a connection keyway did
// not accept itself: tests that drive the handler directly).
func headScanOf(c net.Conn) *headScan {
	switch c := c.(type) {
	case *lingerConn:
		if c.scan {
			return &c.head
		}
	case *headConn:
		return &c.head
	case *tlsHeadConn:
		return &c.head
	}
	return nil
}

// connState is fasthttp's ConnState hook: it starts a new scan for each
// request on a connection (see headScan).
func connState(c net.Conn, state fasthttp.ConnState) {
	if lc, ok := c.(*lingerConn); ok && state == fasthttp.StateIdle {
		lc.ps.idleNext = true // the next read deadline is the idle wait's (park.go)
	}
	s := headScanOf(c)
	if s == nil {
		return
	}
	switch state {
	case fasthttp.StateIdle:
		// The request was answered: what the connection reads next
		// belongs to the next request's head.
		s.reset()
	case fasthttp.StateActive:
		// fasthttp has the head's first byte. If the scan did not see
		// it, the head came with the request before it (pipelined) and
		// began before the scan, which cannot follow it.
		if !s.seen {
			s.st = hsOff
		}
	}
}
