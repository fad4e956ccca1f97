package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The system calls counted per request with -syscalls: the ones a proxy's
// request path makes. Each is counted only if the kernel has its
// tracepoint.
var countedSyscalls = []string{
	"read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg",
	"epoll_wait", "epoll_pwait", "epoll_ctl", "futex", "nanosleep", "accept4", "close",
	"setsockopt", "getsockopt",
}

// syscallCounter counts a process tree's system calls with `perf stat`
// during one load run.
type syscallCounter struct {
	cmd    *exec.Cmd
	out    string
	events []string
	done   chan error
}

// startSyscallCounter attaches perf stat to pids. It fails when perf is
// missing or may not trace (perf_event_paranoid, no tracefs).
func startSyscallCounter(dir string, pids []int) (*syscallCounter, error) {
	if _, err := exec.LookPath("perf"); err != nil {
		return nil, errors.New("perf not installed")
	}
	events := []string{"raw_syscalls:sys_enter", "context-switches"}
	for _, s := range countedSyscalls {
		if _, err := os.Stat("/sys/kernel/tracing/events/syscalls/sys_enter_" + s); err == nil {
			events = append(events, "syscalls:sys_enter_"+s)
		}
	}
	var ps []string
	for _, p := range pids {
		ps = append(ps, strconv.Itoa(p))
	}
	c := &syscallCounter{out: filepath.Join(dir, "perf-stat.csv"), events: events, done: make(chan error, 1)}
	c.cmd = exec.Command("perf", "stat", "-x,", "-o", c.out, "-e", strings.Join(events, ","), "-p", strings.Join(ps, ","))
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { c.done <- c.cmd.Wait() }()
	return c, nil
}

// stop ends the count (perf stat prints its totals on SIGINT) and returns
// the number of calls per name ("all" for every system call).
func (c *syscallCounter) stop() (map[string]int64, error) {
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
		return nil, errors.New("perf stat did not stop")
	}
	b, err := os.ReadFile(c.out)
	if err != nil {
		return nil, err
	}
	return parsePerfStat(string(b))
}

// parsePerfStat reads `perf stat -x,` output: count,unit,event,...
func parsePerfStat(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || strings.HasPrefix(line, "#") {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue // "<not counted>" or "<not supported>"
		}
		name := f[2]
		if name == "raw_syscalls:sys_enter" {
			name = "all"
		} else {
			name = strings.TrimPrefix(name, "syscalls:sys_enter_")
		}
		out[name] = n
	}
	if _, ok := out["all"]; !ok {
		return nil, fmt.Errorf("no syscall count in perf output: %q", tailString(s, 300))
	}
	return out, nil
}

// countSyscallsAtRate runs an extra, unrecorded open-loop run of d at
// rate against rt with perf stat attached to the proxy and returns system
// calls (and context switches) per request answered.
func (h *Harness) countSyscallsAtRate(ctx context.Context, rt *running, rate int, d time.Duration, seed uint64) (map[string]float64, error) {
	return h.countDuring(rt, func() (int64, error) {
		lr, err := runLatency(ctx, rt.addr, &h.cfg, rate, 0, d, seed, 0)
		return lr.Requests, err
	})
}

// countSyscalls runs an extra, unrecorded load run of d against rt with perf
// stat attached to the proxy and returns system calls per request by name.
func (h *Harness) countSyscalls(ctx context.Context, rt *running, d time.Duration, seed int) (map[string]float64, error) {
	return h.countDuring(rt, func() (int64, error) {
		tr, err := h.throughput(ctx, rt, loadSpec{}, d, seed)
		return tr.Requests, err
	})
}

// countDuring counts the proxy's system calls with perf stat while load
// runs, and divides them by the requests load reports.
func (h *Harness) countDuring(rt *running, load func() (requests int64, err error)) (map[string]float64, error) {
	dir, err := os.MkdirTemp(h.dir, "perf-")
	if err != nil {
		return nil, err
	}
	c, err := startSyscallCounter(dir, tree(rt.p.pid()))
	if err != nil {
		return nil, err
	}
	n, err := load()
	counts, serr := c.stop()
	if err := errors.Join(err, serr); err != nil {
		return nil, err
	}
	return perRequest(counts, n)
}

// perRequest divides counts by n.
func perRequest(counts map[string]int64, n int64) (map[string]float64, error) {
	if n == 0 {
		return nil, errors.New("no requests")
	}
	per := map[string]float64{}
	for k, v := range counts {
		if v > 0 {
			per[k] = float64(v) / float64(n)
		}
	}
	return per, nil
}
