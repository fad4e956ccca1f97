//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wire

import "syscall"

// peekSupported says that the stale check can peek at a socket here.
const peekSupported = true

// peekFD peeks at a socket without blocking and reports a connection the
// peer closed or reset, or one with bytes it sent unasked: one
// recvfrom(MSG_PEEK|MSG_DONTWAIT), nothing read, nothing allocated.
// TestContractPeek holds the kernel to it.
func peekFD(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == nil && n == 0: // orderly shutdown by the peer
		return true
	case err == nil: // unasked bytes: a TLS close_notify, or anything else
		return true
	case err == syscall.ECONNRESET || err == syscall.EPIPE:
		return true
	}
	return false // EAGAIN: open and quiet
}

// inputFD reports whether a socket has bytes the peer sent that nobody
// has read yet: one recvfrom(MSG_PEEK|MSG_DONTWAIT), nothing read. A
// closed or reset socket has none.
func inputFD(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == nil && n > 0
}
