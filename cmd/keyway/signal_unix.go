//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"
)

// notifyReopen relays SIGUSR1, the signal that reopens the access log
// after a rotation, to c.
func notifyReopen(c chan<- os.Signal) { signal.Notify(c, syscall.SIGUSR1) }
