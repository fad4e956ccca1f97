//go:build unix

package runner

import (
	"os/exec"
	"syscall"
)

// newProcessGroup puts an agent in a process group of its own: a
// terminal's Ctrl-C to the proxy does not reach it, and it outlives the
// proxy.
func newProcessGroup() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func (j *job) signalTerm() error { return syscall.Kill(j.pid, syscall.SIGTERM) }

// kill ends the agent and its group at once.
func (j *job) kill() {
	_ = syscall.Kill(-j.pid, syscall.SIGKILL)
	_ = syscall.Kill(j.pid, syscall.SIGKILL)
}

func describeExit(ee *exec.ExitError) string {
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return ee.Error()
}
