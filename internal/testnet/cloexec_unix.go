//go:build unix && !linux

package testnet

import "syscall"

// socketCloexec opens a TCP socket that a child process (a test's
// keyway) does not inherit. Not every Unix has SOCK_CLOEXEC (macOS has
// not), so the flag is set after socket(2), under syscall.ForkLock so that
// no fork sees the descriptor in between, as package net does there.
func socketCloexec() (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	return fd, err
}
