//go:build unix

package integration

import (
	"syscall"
	"testing"
)

// sigUSR1 makes keyway reopen its access log (none off Unix:
// signal_other_test.go).
const sigUSR1 = syscall.SIGUSR1

// kill sends sig to process pid (kill(2)); the test fails if it cannot.
func kill(t testing.TB, pid int, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
}

// processGone reports whether process pid no longer exists: kill(pid, 0)
// fails with ESRCH. It returns kill's error for the test's message.
func processGone(pid int) (bool, error) {
	err := syscall.Kill(pid, 0)
	return err == syscall.ESRCH, err
}
