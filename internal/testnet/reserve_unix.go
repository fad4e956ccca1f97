//go:build unix

package testnet

import (
	"syscall"
	"testing"
)

// reservePort binds a TCP socket to a free loopback port without
// listening on it, closes it when the test ends, and returns the port.
func reservePort(t testing.TB) int {
	t.Helper()
	fd, err := socketCloexec()
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}
