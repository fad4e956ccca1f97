// Package testnet has network helpers for tests.
package testnet

import (
	"fmt"
	"testing"
)

// RefusedAddr returns a loopback address where connections are refused
// for the rest of the test: a TCP socket is bound there and never
// listens. Unlike closing a listener and reusing its port, no other test
// (packages run in parallel) can take the port meanwhile. Off Unix it
// skips the test (reserve_other.go).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", reservePort(t))
}
