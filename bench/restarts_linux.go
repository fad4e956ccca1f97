package main

import (
	"errors"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The signals of the restart mode's operations.
var (
	sigUpgrade os.Signal = syscall.SIGUSR2 // keyway's binary upgrade, HAProxy's master-worker reload
	sigReload  os.Signal = syscall.SIGHUP  // keyway's configuration reload
)

// setSubreaper makes the harness the parent of the processes its
// children leave behind (PR_SET_CHILD_SUBREAPER): an upgrade's new
// process, whose parent (the old one) exits, so that the harness can reap
// it once it has stopped it.
func setSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// watchExit returns a channel that receives the time process pid exits,
// whoever its parent is (a pidfd becomes readable then). Process IDs are
// not reused while the pidfd is open.
func watchExit(pid int) (<-chan time.Time, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	ch := make(chan time.Time, 1)
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		ch <- time.Now()
		reap(pid)
	}()
	return ch, nil
}

// reap collects pid's exit status if it became the harness's child
// (setSubreaper); for any other process it does nothing.
func reap(pid int) {
	var ws unix.WaitStatus
	_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
}

// stopPID stops a process the harness did not start (only it, by PID):
// SIGTERM, then SIGKILL after grace.
func stopPID(pid int, grace time.Duration) {
	exited, err := watchExit(pid)
	if err != nil {
		return // gone already
	}
	_ = unix.Kill(pid, unix.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
		return
	case <-t.C:
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	<-exited
}
