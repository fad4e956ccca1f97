package testnet

import "syscall"

// socketCloexec opens a TCP socket that a child process (a test's
// keyway) does not inherit, atomically (SOCK_CLOEXEC).
func socketCloexec() (int, error) {
	return syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}
