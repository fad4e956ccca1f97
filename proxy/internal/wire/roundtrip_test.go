package wire

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// fakeConn is a net.Conn whose writes are kept, for headWriter alone.
type fakeConn struct {
	net.Conn
	buf   bytes.Buffer
	limit int // a write stops after this many bytes (0: none)
}

func (c *fakeConn) Write(p []byte) (int, error) {
	if c.limit > 0 && len(p) > c.limit {
		c.buf.Write(p[:c.limit])
		return c.limit, errors.New("short write")
	}
	return c.buf.Write(p)
}

// TestHeadWriter: the lines go before the head's last CRLF in the first
// write, later writes pass through; a first write without a head end is
// refused; a short write reports the bytes of p it took.
func TestHeadWriter(t *testing.T) {
	c := &fakeConn{}
	w := &headWriter{conn: c, lines: []byte("X-F: 1\r\n")}
	if n, err := w.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\nbody")); n != 31 || err != nil {
		t.Fatalf("first write: %d %v", n, err)
	}
	if n, err := w.Write([]byte("more")); n != 4 || err != nil {
		t.Fatalf("second write: %d %v", n, err)
	}
	if got, want := c.buf.String(), "GET / HTTP/1.1\r\nHost: a\r\nX-F: 1\r\n\r\nbodymore"; got != want {
		t.Errorf("wrote %q, want %q", got, want)
	}

	w = &headWriter{conn: &fakeConn{}, lines: []byte("X-F: 1\r\n")}
	if _, err := w.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\n")); !errors.Is(err, ErrNoHeadEnd) {
		t.Errorf("a first write without the head's end: %v, want ErrNoHeadEnd", err)
	}

	for _, limit := range []int{5, 28, 30, 36} {
		w = &headWriter{conn: &fakeConn{limit: limit}, lines: []byte("X-F: 1\r\n")}
		p := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\nbody")
		n, err := w.Write(p)
		// The head's last CRLF is at 25; the lines, 8 bytes, go before it.
		want := limit
		switch {
		case limit > 25+8:
			want = limit - 8
		case limit > 25:
			want = 25
		}
		if err == nil || n != want {
			t.Errorf("short write after %d bytes: %d %v, want %d and the error", limit, n, err, want)
		}
	}
}
