package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// freePort returns a loopback TCP port that was free a moment ago: it
// binds 127.0.0.1:0 and closes the listener. Callers that hand the port to
// another process retry with a fresh one if that process cannot bind it.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

// proc is a process the harness started (a proxy under test). Only the
// harness stops it, by PID.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been reaped
	err    error         // Wait's error, valid after exited is closed
	exitAt time.Time     // when Wait returned, valid after exited is closed
	logs   string        // file holding the process's stdout and stderr
}

// startProc starts argv with extra environment variables, pinned to cpu
// when cpu >= 0 (through taskset, which execs, so the PID is the target's
// own). Output goes to a file in dir.
func startProc(name, dir string, cpu int, env []string, argv ...string) (*proc, error) {
	return startProcFiles(name, dir, cpu, env, nil, argv...)
}

// startProcFiles is startProc with files passed to the process as file
// descriptors 3, 4, ... (exec.Cmd's ExtraFiles), as systemd passes
// listening sockets.
func startProcFiles(name, dir string, cpu int, env []string, files []*os.File, argv ...string) (*proc, error) {
	if cpu >= 0 {
		argv = append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
	}
	logs := filepath.Join(dir, name+".log")
	f, err := os.Create(logs)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.ExtraFiles = files
	// If the harness dies, its proxies die with it rather than holding
	// their ports (on Linux only: procAttr).
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), logs: logs}
	go func() {
		p.err = cmd.Wait()
		p.exitAt = time.Now()
		close(p.exited)
	}()
	return p, nil
}

// pid returns the process ID.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// alive reports whether the process has not exited yet.
func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process (only to it, by PID), waits up to
// grace for it to exit, then sends SIGKILL.
func (p *proc) stop(grace time.Duration) {
	if !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// tail returns the last n bytes of the process's output, for error messages.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logs)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// clockTicks is the kernel's USER_HZ, the unit of utime and stime in
// /proc/PID/stat, read from the auxiliary vector (AT_CLKTCK) rather than
// assumed to be 100.
var clockTicks = func() float64 {
	b, err := os.ReadFile("/proc/self/auxv")
	if err == nil {
		for i := 0; i+16 <= len(b); i += 16 {
			k, v := binary.LittleEndian.Uint64(b[i:]), binary.LittleEndian.Uint64(b[i+8:])
			if k == 17 && v > 0 { // AT_CLKTCK
				return float64(v)
			}
		}
	}
	return 100
}()

// procStat is the part of /proc/PID/stat the harness uses.
type procStat struct {
	ppid       int
	cpuSeconds float64 // utime + stime
	sysSeconds float64 // stime: in the kernel on the process's behalf
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name is in parentheses and may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ppid, _ := strconv.Atoi(f[1])
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return procStat{ppid: ppid, cpuSeconds: (ut + st) / clockTicks, sysSeconds: st / clockTicks}, nil
}

// preciseCPU replaces st's CPU seconds of process pid with its CPU clock's
// when it can be read. /proc's figures are whole clock ticks (10 ms): at
// 1,000 req/s over 5 s that is 2 µs per request. The process's CPU clock
// is the scheduler's own count in nanoseconds; the kernel's part is split
// off it in the ticks' proportion, as the kernel splits it.
func preciseCPU(pid int, st procStat) procStat {
	ns, ok := processCPUTime(pid)
	if !ok {
		return st
	}
	cpu := float64(ns) / 1e9
	sys := 0.0
	if st.cpuSeconds > 0 {
		sys = cpu * st.sysSeconds / st.cpuSeconds
	}
	st.cpuSeconds, st.sysSeconds = cpu, sys
	return st
}

// tree returns pid and all its live descendants (nginx's master forks its
// worker; the others are one process).
func tree(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []int{pid}
	}
	children := map[int][]int{}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(n); err == nil {
			children[st.ppid] = append(children[st.ppid], n)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out) && i < 1000; i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// treeCPU returns the CPU time (user + system, in seconds) used so far by
// pid and its live descendants.
func treeCPU(pid int) (float64, error) {
	cpu, _, err := treeCPUSys(pid)
	return cpu, err
}

// treeCPUSys is treeCPU with the system part (stime) of it.
func treeCPUSys(pid int) (cpu, sys float64, err error) {
	for i, p := range tree(pid) {
		st, err := readStat(p)
		if err != nil {
			if i == 0 {
				return 0, 0, err
			}
			continue // a child that just exited
		}
		st = preciseCPU(p, st)
		cpu += st.cpuSeconds
		sys += st.sysSeconds
	}
	return cpu, sys, nil
}

// memStatus holds VmRSS and VmHWM (peak RSS) in bytes.
type memStatus struct{ rss, hwm int64 }

func readMem(pid int) (memStatus, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memStatus{}, err
	}
	defer f.Close()
	var m memStatus
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			continue
		}
		if k == "VmRSS" {
			m.rss = n << 10
		} else {
			m.hwm = n << 10
		}
	}
	return m, sc.Err()
}

// treeMem sums VmRSS and VmHWM over pid and its live descendants.
func treeMem(pid int) (memStatus, error) {
	var sum memStatus
	for i, p := range tree(pid) {
		m, err := readMem(p)
		if err != nil {
			if i == 0 {
				return memStatus{}, err
			}
			continue
		}
		sum.rss += m.rss
		sum.hwm += m.hwm
	}
	return sum, nil
}

// loadAvg returns the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
