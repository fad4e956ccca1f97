//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wire

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// within waits for a value on ch for d, failing the test after.
func within[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %s waiting for %s", d, what)
		panic("unreachable")
	}
}

// tcpPair returns a connected client and server connection on loopback.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = within(t, acc, 5*time.Second, "accept")
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// exchangeBytes writes a one-byte request on the wrapped client connection
// and reads the one-byte answer the server sends: afterwards the
// connection is one that fasthttp would put back into its pool.
func exchangeBytes(t *testing.T, w, server net.Conn) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		var b [1]byte
		if _, err := io.ReadFull(server, b[:]); err != nil {
			done <- err
			return
		}
		_, err := server.Write([]byte("a"))
		done <- err
	}()
	if _, err := w.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := io.ReadFull(w, b[:]); err != nil {
		t.Fatal(err)
	}
	if err := within(t, done, 5*time.Second, "the server's side of the exchange"); err != nil {
		t.Fatal(err)
	}
}

// peek peeks at c's socket without blocking: the first byte waiting, and
// whether anything (bytes, a FIN, a reset) is there.
func peek(c net.Conn) (first byte, spoke, closed bool) {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return 0, true, true
	}
	if err := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		spoke = err == nil || err == syscall.ECONNRESET
		closed = (err == nil && n == 0) || err == syscall.ECONNRESET
		first = b[0]
	}); err != nil {
		return 0, true, true
	}
	return first, spoke, closed
}

func peerClosed(c net.Conn) bool { _, _, closed := peek(c); return closed }
func peerSpoke(c net.Conn) bool  { _, spoke, _ := peek(c); return spoke }

// sendOn sends a one-byte request on w and reads its answer, as fasthttp
// does. It returns the first error.
func sendOn(w net.Conn) error {
	if _, err := w.Write([]byte("q")); err != nil {
		return err
	}
	var b [1]byte
	_, err := w.Read(b[:])
	return err
}
