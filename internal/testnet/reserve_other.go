//go:build !unix

package testnet

import (
	"runtime"
	"testing"
)

// reservePort skips the test off Unix. Windows could bind a socket
// without listening too, but a connection to it is refused with
// WSAECONNREFUSED, not the syscall.ECONNREFUSED the callers' assertions
// name, and only after the kernel has retried the connect; the other
// platforms (js, wasip1, plan9) have no such socket call.
func reservePort(t testing.TB) int {
	t.Helper()
	t.Skipf("testnet.RefusedAddr: reserving a refused port is implemented on Unix only, not on %s", runtime.GOOS)
	return 0
}
