// Package poll is the tests' one way to wait for something: poll a
// condition with a deadline instead of sleeping for a guessed time.
package poll

import (
	"testing"
	"time"
)

// Interval is the pause between two checks of a condition.
const Interval = 20 * time.Millisecond

// Until checks cond every Interval until it returns true, and fails the
// test (t.Fatalf, naming what) if d passes first. Call it from the test's
// goroutine.
func Until(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(d, cond) {
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
}

// Within checks cond every Interval until it returns true (true) or d
// passes (false). For waits whose failure the caller reports itself, or
// from goroutines other than the test's.
func Within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-time.After(Interval)
	}
	return true
}
