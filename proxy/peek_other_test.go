//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package proxy

import (
	"net"
	"testing"
)

// skipWithoutPeek skips a test of the stale check: keyway has no peek
// here (wire.ReplicaConn), so a pooled connection the replica closed is
// found only when a request is sent on it.
func skipWithoutPeek(t testing.TB) {
	t.Helper()
	t.Skip("no MSG_PEEK on this OS: the stale check is off")
}

func peerClosed(net.Conn) bool                 { return true }
func peerSpoke(net.Conn) (first byte, ok bool) { return 0, true }
