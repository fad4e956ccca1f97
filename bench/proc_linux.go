package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// checkPlatform reports whether the harness can measure here: on Linux
// it can (proc_other.go says why elsewhere not).
func checkPlatform() error { return nil }

// procAttr makes a started proxy receive SIGKILL when the harness dies
// (PR_SET_PDEATHSIG), so that it does not go on holding its ports.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processCPUTime reads the CPU clock of process pid (every thread, live
// and exited; clock_getcpuclockid(3)), in nanoseconds.
func processCPUTime(pid int) (int64, bool) {
	// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of the kernel's
	// posix-timers.h.
	if pid <= 0 || pid >= 1<<28 {
		return 0, false
	}
	clock := int32((^pid)<<3 | 2)
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		return 0, false
	}
	return ts.Nano(), true
}

// pinSelf pins every thread of this process to cpu. Threads created later
// inherit the mask of the thread that creates them, so the whole process
// stays there; doing it twice catches a thread started in between.
func pinSelf(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	for range 2 {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pin thread %d to cpu %d: %w", tid, cpu, err)
			}
		}
	}
	return nil
}

// raiseNoFile raises RLIMIT_NOFILE to at least want (up to the hard limit,
// or past it when the process may), and returns the soft limit in force.
// Child processes inherit it, so proxies can hold the idle connections.
func raiseNoFile(want uint64) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Max < want {
		r := syscall.Rlimit{Cur: want, Max: want}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err == nil {
			return want, nil
		}
	}
	rl.Cur = rl.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	return rl.Cur, nil
}
