package wire

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/internal/testcerts"
)

// acceptOne returns the client side of a loopback connection and the
// server side as f's listener accepted it.
func acceptOne(t *testing.T, f *Front, scan bool) (client net.Conn, server *ClientConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := f.Listen(ln, scan)
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	select {
	case c := <-acc:
		// The dial completes in the kernel's queue, perhaps before Accept
		// was called: Accepting is checked once Accept has returned.
		select {
		case <-l.Accepting():
		default:
			t.Fatal("Accepting is not closed after Accept")
		}
		cc, ok := c.(*ClientConn)
		if !ok {
			t.Fatalf("accepted %T, want *ClientConn", c)
		}
		t.Cleanup(func() { cc.Conn.Close() })
		return client, cc
	case <-time.After(5 * time.Second):
		t.Fatal("no accept")
		panic("unreachable")
	}
}

// TestLingeringClose: a connection marked with MarkLinger and closed while
// the client still sends keeps the answer written before the close: the
// client reads it whole, then EOF, not a reset; StopLingering ends the
// drain.
func TestLingeringClose(t *testing.T) {
	var f Front
	client, server := acceptOne(t, &f, false)
	answer := []byte("HTTP/1.1 413 Content Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
	// The client sends more than the server reads: unread input at close.
	sent := make(chan error, 1)
	go func() {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		_ = client.SetWriteDeadline(time.Now().Add(5 * time.Second))
		for range 16 {
			if _, err := client.Write(chunk); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	var b [1024]byte
	if _, err := io.ReadFull(server, b[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Write(answer); err != nil {
		t.Fatal(err)
	}
	MarkLinger(server)
	if err := server.Close(); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(client)
	if err != nil {
		t.Fatalf("read after a lingering close: %v (got %q)", err, got)
	}
	if !bytes.Equal(got, answer) {
		t.Fatalf("got %q, want %q", got, answer)
	}
	if err := <-sent; err != nil {
		t.Fatalf("the client's sending failed while the server lingered: %v", err)
	}
	f.StopLingering()
	if f.lingering.n != 0 {
		t.Fatalf("%d connections still lingering after StopLingering", f.lingering.n)
	}
}

// TestCloseUnmarkedIsImmediate: without MarkLinger, Close closes at once
// and registers no drain.
func TestCloseUnmarkedIsImmediate(t *testing.T) {
	var f Front
	client, server := acceptOne(t, &f, true)
	if err := server.Close(); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after close: %v, want EOF", err)
	}
	if f.lingering.n != 0 {
		t.Fatal("an unmarked close registered a drain")
	}
}

// TestClientConnScan: a plain connection's reads are scanned, and the scan
// refuses to read on past a bare-LF head; beneath TLS (scan off) nothing
// is followed.
func TestClientConnScan(t *testing.T) {
	client, server := acceptOne(t, &Front{}, true)
	if HeadOf(server) == nil {
		t.Fatal("HeadOf a scanned connection is nil")
	}
	if _, err := io.WriteString(client, "GET / HTTP/1.1\nHost: a\n\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := server.Read(buf)
	if err != nil || n == 0 {
		t.Fatalf("read %d, %v", n, err)
	}
	for n < len("GET / HTTP/1.1\nHost: a\n\n") {
		m, err := server.Read(buf[n:])
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		n += m
	}
	if !HeadOf(server).Bare() {
		t.Fatal("the scan did not see the bare-LF end")
	}
	if _, err := server.Read(buf); !errors.Is(err, ErrBareLF) {
		t.Fatalf("read past a bare-LF head: %v, want ErrBareLF", err)
	}
	ConnState(server, fasthttp.StateIdle)
	if HeadOf(server).Bare() {
		t.Fatal("StateIdle did not start a new scan")
	}

	_, beneath := acceptOne(t, &Front{}, false)
	if HeadOf(beneath) != nil {
		t.Fatal("HeadOf a connection beneath TLS is not nil")
	}
}

// TestTLSClientConn: above TLS the heads are followed, fasthttp still
// sees a TLS connection, and MarkLinger reaches the ClientConn beneath.
func TestTLSClientConn(t *testing.T) {
	ca := testcerts.New(t)
	var f Front
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := ca.IssuePEM(t, "a", testcerts.Options{}, "a.example")
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	tl := TLSListener(tls.NewListener(f.Listen(ln, false), &tls.Config{Certificates: []tls.Certificate{cert}}))
	defer tl.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := tl.Accept()
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_ = c.(*TLSClientConn).Handshake()
		}
		acc <- c
	}()
	client, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "a.example"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c := <-acc
	defer c.Close()
	tc, ok := c.(*TLSClientConn)
	if !ok {
		t.Fatalf("accepted %T, want *TLSClientConn", c)
	}
	if _, ok := c.(interface {
		Handshake() error
		ConnectionState() tls.ConnectionState
	}); !ok {
		t.Fatal("a TLSClientConn does not look like TLS to fasthttp")
	}
	if _, ok := any(&ClientConn{}).(interface{ Handshake() error }); ok {
		t.Fatal("a ClientConn looks like TLS to fasthttp")
	}
	if _, err := io.WriteString(client, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for n := 0; n < len("GET / HTTP/1.1\r\nHost: a\r\n\r\n"); {
		m, err := tc.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		n += m
	}
	if s := HeadOf(tc); s == nil || !s.Done() {
		t.Fatal("the head above TLS was not followed to its end")
	}
	MarkLinger(tc)
	beneath, ok := tc.NetConn().(*ClientConn)
	if !ok {
		t.Fatalf("beneath TLS: %T, want *ClientConn", tc.NetConn())
	}
	if !beneath.linger.Load() {
		t.Fatal("MarkLinger did not reach the connection beneath TLS")
	}
}
