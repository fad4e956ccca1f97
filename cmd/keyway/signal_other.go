//go:build !unix

package main

import "os"

// notifyReopen relays nothing off Unix: there is no SIGUSR1 there, so no
// signal reopens the access log. It must not call signal.Notify with no
// signal, which would relay every signal.
func notifyReopen(chan<- os.Signal) {}
