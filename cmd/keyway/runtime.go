package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
)

// sysmonAwake is the GODEBUG setting that keeps the Go runtime's monitor
// thread (sysmon) out of deep sleep. sysmon normally parks on a futex
// once every P is idle, and the first system call after that wakes it
// again (runtime.entersyscallWakeSysmon). A proxy at a moderate rate goes
// idle between requests, so every request paid a futex wake, sysmon's
// two context switches and a few of its 20 µs naps: a third of keyway's
// CPU per request at 3,000 req/s. With schedtrace set, sysmon never parks
// (runtime/proc.go: "sysmon should not enter deep sleep if schedtrace is
// enabled"); it backs off to one 10 ms nap at a time when nothing
// happens, 100 wake-ups a second. The interval, the largest the runtime
// takes (int32 milliseconds, 24.8 days), makes the trace itself all but
// never print: once at start on a host up longer than that (the runtime
// counts from the boot-time monotonic clock), then every 24.8 days, a
// line beginning "SCHED" on stderr. The runtime reads the setting only at
// start, hence the exec.
const sysmonAwake = "schedtrace=2147483647"

// keepSysmonAwake re-executes the running binary in place (same PID, same
// arguments, same open descriptors) with sysmonAwake added to GODEBUG,
// unless deepSleep asks for the runtime's default, GODEBUG already sets
// schedtrace (the operator's choice, or this function's first pass), or
// the OS cannot replace a process's image in place (Windows: keyway runs
// with the runtime's default there, silently), or the binary cannot be
// found again (replaced on disk): then it says why on stderr and keyway
// runs on as it is. It returns only when it does not exec.
func keepSysmonAwake(deepSleep bool, stderr io.Writer) {
	godebug, set := os.LookupEnv("GODEBUG")
	if deepSleep || hasGodebug(godebug, "schedtrace") || runtime.GOOS == "windows" {
		return
	}
	exe, err := os.Executable()
	if err == nil {
		if set && godebug != "" {
			godebug += ","
		}
		env := append(withoutEnv(os.Environ(), "GODEBUG"), "GODEBUG="+godebug+sysmonAwake)
		err = syscall.Exec(exe, os.Args, env)
	}
	fmt.Fprintf(stderr, "keyway: cannot re-execute %q with GODEBUG=%s (%v); running with the Go runtime's default idle sleep, as with server.runtime_deep_sleep: true\n", exe, sysmonAwake, err)
}

// hasGodebug reports whether the GODEBUG value s sets key.
func hasGodebug(s, key string) bool {
	for _, kv := range strings.Split(s, ",") {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == key {
			return true
		}
	}
	return false
}

// withoutEnv returns env without the variable name.
func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
