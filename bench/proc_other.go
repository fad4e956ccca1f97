//go:build !linux

package main

import (
	"errors"
	"runtime"
	"syscall"
)

// checkPlatform says why the harness cannot measure here: it reads each
// proxy's CPU time and memory from Linux's /proc (readStat, readMem) and
// pins with sched_setaffinity and taskset. Run refuses to start rather
// than fail at the first measurement. The package still builds, so that
// the module builds and vets off Linux; the tests that run the harness
// skip (skipOffLinux). The stubs below are what Run would meet past
// that check.
func checkPlatform() error {
	return errors.New("the harness measures proxies through Linux's /proc: it runs on Linux only, not on " + runtime.GOOS)
}

// procAttr asks for no parent-death signal off Linux (Go has Pdeathsig
// on Linux and FreeBSD only): a proxy whose harness is killed outlives
// it, holding its port until it is stopped by hand.
func procAttr() *syscall.SysProcAttr { return nil }

// processCPUTime reads no clock off Linux (the clock ID it builds is
// Linux's MAKE_PROCESS_CPUCLOCK): it reports none, and preciseCPU keeps
// the figures it has.
func processCPUTime(int) (int64, bool) { return 0, false }

// pinSelf does not pin off Linux (no sched_setaffinity): the harness
// notes "not pinned" and runs unpinned.
func pinSelf(int) error {
	return errors.New("pinning to a CPU needs Linux's sched_setaffinity, not available on " + runtime.GOOS)
}

// raiseNoFile leaves the descriptor limit as it is off Linux, and says
// so (syscall.Rlimit's field types differ between the Unixes, and
// Windows has none).
func raiseNoFile(uint64) (uint64, error) {
	return 0, errors.New("raising RLIMIT_NOFILE is implemented on Linux only, not on " + runtime.GOOS)
}
