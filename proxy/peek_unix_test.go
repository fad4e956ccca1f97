//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package proxy

import (
	"net"
	"syscall"
	"testing"
)

// skipWithoutPeek skips a test of the stale check where keyway has no
// peek (wire.ReplicaConn): never here.
func skipWithoutPeek(testing.TB) {}

// peerClosed reports whether the peer's FIN or RST has reached c: a
// non-blocking peek finds the end of the stream or a reset.
func peerClosed(c net.Conn) bool {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	if err := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (err == nil && n == 0) || err == syscall.ECONNRESET
	}); err != nil {
		return true
	}
	return closed
}

// peerSpoke reports whether anything from the peer waits on c's socket:
// bytes (a TLS record), its FIN or a reset.
func peerSpoke(c net.Conn) (first byte, ok bool) {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return 0, true
	}
	if err := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = err == nil || err == syscall.ECONNRESET
		first = b[0]
		_ = n
	}); err != nil {
		return 0, true
	}
	return first, ok
}
