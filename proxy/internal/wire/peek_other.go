//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package wire

// peekSupported is false where keyway does not peek at sockets (Windows):
// a pooled connection the replica closed is found when the request is
// sent on it, as a reused connection lost before its reply (the request
// is then sent again only if it is replayable).
const peekSupported = false

func peekFD(uintptr) bool { return false }

// inputFD: without a peek, no input is seen (a stopping server closes a
// waiting connection whatever arrived on it).
func inputFD(uintptr) bool { return false }
