package wire

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"keyway/proxy/internal/field"
)

// TestHeadScan feeds request heads to a HeadScan whole, split in two at
// every byte, and a byte at a time: where a read ends must not change what
// the scan finds.
func TestHeadScan(t *testing.T) {
	cases := []struct {
		name   string
		raw    string
		st     uint8
		http11 bool
		te     string // the Transfer-Encoding values kept, comma-joined, trimmed of CR
		cl     bool
		teBad  bool
	}{
		{name: "CRLF head", raw: "GET /a HTTP/1.1\r\nHost: a\r\nX-Key: k\r\n\r\nbody\n\n", st: hsDone, http11: true},
		{name: "no fields", raw: "GET /a HTTP/1.1\r\n\r\n", st: hsDone, http11: true},
		{name: "HTTP/1.0", raw: "GET /a HTTP/1.0\r\nHost: a\r\n\r\n", st: hsDone},
		{name: "leading empty lines", raw: "\r\n\n\r\nGET /a HTTP/1.1\r\nHost: a\r\n\r\n", st: hsDone, http11: true},
		{name: "bare LF head", raw: "GET /a HTTP/1.1\nHost: a\n\n", st: hsBare, http11: true},
		{name: "bare LF empty line after CRLF", raw: "GET /a HTTP/1.1\r\nHost: a\r\n\nrest", st: hsBare, http11: true},
		{name: "CRLF empty line after bare LF", raw: "GET /a HTTP/1.1\r\nHost: a\n\r\n", st: hsBare, http11: true},
		{name: "bare LF lines, CRLF end", raw: "GET /a HTTP/1.1\nHost: a\r\n\r\n", st: hsDone, http11: true},
		{name: "request line only", raw: "GET /" + strings.Repeat("a", 100), st: hsReqLine},
		{name: "in a field", raw: "GET /a HTTP/1.1\r\nX-A: bbb", st: hsLine, http11: true},
		{name: "bare CR line", raw: "GET /a HTTP/1.1\r\n\rX: y\r\n\r\n", st: hsDone, http11: true},
		{name: "bare LF after a name's first byte", raw: "GET /a HTTP/1.1\r\nC\n\r\n", st: hsBare, http11: true},
		{name: "bare LF after a name", raw: "GET /a HTTP/1.1\r\ncontent-length:\n\r\n", st: hsBare, http11: true, cl: true},
		{name: "bare LF after a TE value", raw: "GET /a HTTP/1.1\r\nTransfer-Encoding:x\n\r\n", st: hsBare, http11: true, te: "x"},
		{name: "TE", raw: "POST /a HTTP/1.1\r\nTransfer-Encoding:  gzip, chunked \r\nHost: a\r\n\r\n", st: hsDone, http11: true, te: "  gzip, chunked "},
		{name: "TE case", raw: "POST /a HTTP/1.1\r\ntRANSFER-eNCODING: gzip\r\n\r\n", st: hsDone, http11: true, te: " gzip"},
		{name: "TE two fields", raw: "POST /a HTTP/1.1\r\nTransfer-Encoding: gzip\r\nX: y\r\nTransfer-Encoding: chunked\r\n\r\n", st: hsDone, http11: true, te: " gzip, chunked"},
		{name: "TE folded", raw: "POST /a HTTP/1.1\r\nTransfer-Encoding: gzip,\r\n chunked\r\n\r\n", st: hsDone, http11: true, te: " gzip,", teBad: true},
		{name: "TE too long", raw: "POST /a HTTP/1.1\r\nTransfer-Encoding: " + strings.Repeat("g", 100) + "\r\n\r\n", st: hsDone, http11: true, teBad: true},
		{name: "not TE", raw: "POST /a HTTP/1.1\r\nTE: trailers\r\nTraceparent: x\r\nTransfer-Encodings: x\r\nTransfer-Encoding : x\r\n\r\n", st: hsDone, http11: true},
		{name: "CL", raw: "POST /a HTTP/1.1\r\nContent-Type: x\r\nconnection: close\r\nContent-length: 3\r\n\r\nabc", st: hsDone, http11: true, cl: true},
		{name: "not CL", raw: "POST /a HTTP/1.1\r\nContent-Type: x\r\nContent-Lengths: 3\r\nC\r\n\r\n", st: hsDone, http11: true},
		{name: "fields after the head are body", raw: "POST /a HTTP/1.1\r\nHost: a\r\n\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\n\n", st: hsDone, http11: true},
	}
	type result struct {
		st            uint8
		http11, cl    bool
		teBad         bool
		te            string
		seen, teCount bool
	}
	get := func(s *HeadScan) result {
		te := ""
		if !s.teBad {
			te = strings.ReplaceAll(string(s.teBuf[:s.teLen]), "\r", "")
		}
		return result{s.st, s.http11, s.cl, s.teBad, te, s.seen, s.te > 0}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var whole HeadScan
			whole.Scan([]byte(c.raw))
			te := c.te
			if c.teBad {
				te = ""
			}
			want := result{c.st, c.http11, c.cl, c.teBad, te, true, c.te != "" || c.teBad}
			if got := get(&whole); got != want {
				t.Fatalf("whole: %+v, want %+v", got, want)
			}
			for i := 1; i < len(c.raw); i++ {
				var s HeadScan
				s.Scan([]byte(c.raw[:i]))
				s.Scan([]byte(c.raw[i:]))
				if got := get(&s); got != want {
					t.Fatalf("split at %d (%q | %q): %+v, want %+v", i, c.raw[:i], c.raw[i:], got, want)
				}
			}
			var s HeadScan
			for i := range len(c.raw) {
				s.Scan([]byte{c.raw[i]})
			}
			if got := get(&s); got != want {
				t.Fatalf("a byte at a time: %+v, want %+v", got, want)
			}
		})
	}
}

// FuzzHeadScan: where a read ends never changes what the scan finds, and
// the scan sees a head end where fasthttp does, with the same kind of
// line ending: a head fasthttp ends with CRLF CRLF is never taken for a
// bare-LF one (keyway would refuse it), nor the other way round.
func FuzzHeadScan(f *testing.F) {
	for _, s := range []string{
		"GET /a HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /a HTTP/1.1\nHost: a\n\n",
		"\r\nPOST /a HTTP/1.0\r\nTransfer-Encoding: gzip,\r\n chunked\r\ncontent-length: 1\r\n\r\nx",
		"POST /a HTTP/1.1\r\nTransfer-Encoding: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: a\r\nConnection: x, keep-alive\r\nX-Forwarded-For: 1.2.3.4\r\nProxy-Authorization: b\r\nProxy-Authorizations: c\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: a\r\nX-A b: c\r\nNoColon\r\n\tfolded\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(7))
	}
	f.Fuzz(func(t *testing.T, raw []byte, cut uint16) {
		var whole, split HeadScan
		whole.Scan(raw)
		i := 0
		if len(raw) > 0 {
			i = int(cut) % len(raw)
		}
		split.Scan(raw[:i])
		split.Scan(raw[i:])
		// A byte-at-a-time scan of the first part too.
		var bytewise HeadScan
		for _, c := range raw[:i] {
			bytewise.Scan([]byte{c})
		}
		bytewise.Scan(raw[i:])
		if w, s, b := whole.view(), split.view(), bytewise.view(); s != w || b != w {
			t.Fatalf("%q split at %d: %s and %s, whole %s", raw, i, s, b, w)
		}
		var h fasthttp.RequestHeader
		br := bufio.NewReader(bytes.NewReader(raw))
		if err := h.Read(br); err != nil {
			return
		}
		head := raw[:len(raw)-br.Buffered()]
		crlf := bytes.HasSuffix(head, []byte("\r\n\r\n"))
		switch {
		case crlf && whole.st != hsDone:
			t.Fatalf("fasthttp read the head %q ending in CRLF CRLF, the scan ended in state %d", head, whole.st)
		case !crlf && whole.st != hsBare:
			t.Fatalf("fasthttp read the head %q ending in a bare LF, the scan ended in state %d", head, whole.st)
		}
		// The fields the scan found are rawFields' on fasthttp's block.
		// An empty block (no fields at all) rawFields cannot tell from
		// one it was not given; the scan can.
		block := h.RawHeaders()
		rf, rok := field.InBlock(block)
		if len(block) == 0 && whole.st == hsDone {
			rf, rok = 0, true
		}
		if sf, sok := whole.Fields(block); sok != (rok && whole.st == hsDone) || sok && sf != rf {
			t.Fatalf("%q: the scan found fields %#x (known %v), rawFields %#x (known %v) in %q", head, sf, sok, rf, rok, block)
		}
	})
}

// view is what a scan found: not the bytes its buffers hold beyond their
// lengths, nor a name's progress once it is over (a name read whole is
// not copied).
func (s *HeadScan) view() string {
	name := ""
	switch {
	case s.st == hsName && int(s.nameN) > field.MaxName:
		name = "too long" // not kept
	case s.st == hsName:
		name = fmt.Sprintf("%q", s.nameBuf[:s.nameN])
	}
	return fmt.Sprintf("st %d cr %v seen %v http11 %v cl %v prevTE %v teBad %v odd %v fields %#x te %d name %s tail %q teBuf %q",
		s.st, s.cr, s.seen, s.http11, s.cl, s.prevTE, s.teBad, s.odd, s.fields, s.te, name, s.tail[:s.tailN], s.teBuf[:s.teLen])
}

// TestHeadScanFields: the fields a scan finds in a head, whole, split at
// every byte and a byte at a time, are those rawFields finds in
// fasthttp's raw block, and a head with a line rawFields cannot read
// leaves them unknown.
func TestHeadScanFields(t *testing.T) {
	for _, c := range []struct {
		raw   string
		want  field.Set
		known bool
	}{
		{"GET /a HTTP/1.1\r\nHost: a\r\nX-Key: k\r\n\r\n", 0, true},
		{"POST /a HTTP/1.1\r\nhost: a\r\nCONTENT-LENGTH: 3\r\nExpect: 100-continue\r\n\r\nabc", field.ContentLength | field.Expect, true},
		{"GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\nKeep-Alive: 5\r\nTE: trailers\r\nTrailer: x\r\nUpgrade: h2c\r\n\r\n",
			field.Connection | field.KeepAlive | field.TE | field.Trailer | field.Upgrade, true},
		{"GET /a HTTP/1.1\r\nHost: a\r\nProxy-Connection: x\r\nProxy-Authorization: y\r\nProxy-Authenticate: z\r\nX-Forwarded-For: 1.2.3.4\r\nX-Request-Id: r\r\n\r\n",
			field.ProxyConnection | field.ProxyAuthorization | field.ProxyAuthenticate | field.XFF | field.RequestID, true},
		{"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", field.TransferEncoding, true},
		{"GET /a HTTP/1.1\r\nHost: a\r\nProxy-Authorizations: y\r\nX-Forwarded-Fo: z\r\nAn-Unusually-Long-Field-Name-Here: q\r\n\r\n", 0, true},
		{"GET /a HTTP/1.0\r\n\r\n", 0, true},
		{"GET /a HTTP/1.1\r\nX A: b\r\n\r\n", 0, false},
		{"GET /a HTTP/1.1\r\nConnection : close\r\n\r\n", 0, false},
		{"GET /a HTTP/1.1\r\nX-A: b\r\n folded\r\n\r\n", 0, false},
		{"GET /a HTTP/1.1\r\nNoColon\r\n\r\n", 0, false},
		{"GET /a HTTP/1.1\r\n: empty name\r\n\r\n", 0, false},
		{"GET /a HTTP/1.1\r\nHost: a\n\n", 0, false}, // bare LF: not followed to a CRLF end
	} {
		var h fasthttp.RequestHeader
		var raw []byte
		if h.Read(bufio.NewReader(strings.NewReader(c.raw))) == nil {
			raw = h.RawHeaders()
		} else if c.known {
			t.Fatalf("%q: fasthttp refuses the head", c.raw)
		}
		check := func(how string, s *HeadScan) {
			t.Helper()
			f, known := s.Fields(raw)
			if known != c.known || known && f != c.want {
				t.Fatalf("%q %s: fields %#x (known %v), want %#x (known %v)", c.raw, how, f, known, c.want, c.known)
			}
			if rf, ok := field.InBlock(raw); known && len(raw) > 0 && (!ok || rf != f) {
				t.Fatalf("%q %s: the scan found %#x, rawFields %#x (known %v)", c.raw, how, f, rf, ok)
			}
		}
		var whole HeadScan
		whole.Scan([]byte(c.raw))
		check("whole", &whole)
		for i := 1; i < len(c.raw); i++ {
			var s HeadScan
			s.Scan([]byte(c.raw[:i]))
			s.Scan([]byte(c.raw[i:]))
			check(fmt.Sprintf("split at %d", i), &s)
		}
		var s HeadScan
		for i := range len(c.raw) {
			s.Scan([]byte{c.raw[i]})
		}
		check("a byte at a time", &s)
	}

	// A scan whose field block is not fasthttp's (it began elsewhere in
	// the head) does not stand in for the raw block.
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader("GET /a HTTP/1.1\r\nUpgrade: h2c\r\nHost: a\r\n\r\n"))); err != nil {
		t.Fatal(err)
	}
	var s HeadScan
	s.Scan([]byte("GET /a HTTP/1.1\r\nHost: a\r\n\r\n"))
	if f, known := s.Fields(h.RawHeaders()); known {
		t.Fatalf("a scan of another block: fields %#x taken as known for %q", f, h.RawHeaders())
	}
}

// BenchmarkHeadScan is the scan's cost for a typical keyed POST head: what
// each well-formed request pays for HeadScan on the front end.
func BenchmarkHeadScan(b *testing.B) {
	head := []byte("POST /ingest HTTP/1.1\r\nHost: orders.example\r\nContent-Type: application/json\r\nContent-Length: 48\r\n" +
		"X-Key: customer-42\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nUser-Agent: producer/1.0\r\n\r\n")
	b.SetBytes(int64(len(head)))
	b.ReportAllocs()
	var s HeadScan
	for b.Loop() {
		s.Reset()
		s.Scan(head)
	}
	if s.st != hsDone || !s.cl {
		b.Fatalf("scan ended in state %d", s.st)
	}
}
