//go:build !linux

package main

import (
	"errors"
	"os"
	"runtime"
	"time"
)

// Off Linux the restart mode never runs (checkPlatform); these stand in
// for restarts_linux.go so that the package builds.
var (
	sigUpgrade os.Signal = os.Interrupt
	sigReload  os.Signal = os.Interrupt
)

func setSubreaper() error { return errors.New("no subreaper on " + runtime.GOOS) }

func watchExit(int) (<-chan time.Time, error) {
	return nil, errors.New("watching another process's exit needs Linux's pidfd, not available on " + runtime.GOOS)
}

func stopPID(int, time.Duration) {}
