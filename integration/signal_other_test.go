//go:build !unix

package integration

import (
	"errors"
	"runtime"
	"syscall"
	"testing"
)

// Off Unix there is no kill(2) and no SIGUSR1. TestMain skips the suite on
// Windows; these stand-ins only let it compile there, and skip a test
// that would signal.

// sigUSR1 is a placeholder that no call delivers.
const sigUSR1 = syscall.Signal(-1)

// kill skips the test: signals are Unix's.
func kill(t testing.TB, pid int, sig syscall.Signal) {
	t.Helper()
	t.Skipf("sending signal %d to process %d: no Unix signals on %s", int(sig), pid, runtime.GOOS)
}

// processGone cannot tell off Unix.
func processGone(int) (bool, error) {
	return false, errors.New("no kill(2) on " + runtime.GOOS)
}
