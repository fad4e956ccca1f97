// Package testnet has network helpers for tests.
package testnet

import (
	"fmt"
	"net"
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

// FreePort returns a loopback port that was free for both TCP and UDP
// when it looked, for a test whose component must be configured with a
// fixed port (a gossip port, which memberlist binds for both). Another
// process may take it before the test binds it: rare, and the test then
// fails to bind, loudly.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no loopback port free for both TCP and UDP")
	return 0
}
