//go:build unix

package agent

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"keyway/membership"
)

// waitDelay bounds how long Wait waits, once the process has exited, for
// the copying of its output to end when stdout or stderr is not a file
// (a descendant may hold the pipe open).
const waitDelay = time.Second

// StartCommand returns the StartFunc that runs argv as a real process:
//
//   - in a process group of its own, so that a terminal's Ctrl-C (SIGINT
//     to the foreground group) reaches the agent only, which drains first;
//     and signals reach the whole group;
//   - with stdin from /dev/null, stdout and stderr passed through to the
//     given writers (as file descriptors when they are files);
//   - with the agent's environment minus KEYWAY_GOSSIP_KEY (the replica
//     has no use for the gossip key);
//   - on Linux, killed (SIGKILL) if the agent itself dies without
//     stopping it (see setParentDeathSignal).
//
// When the process exits, whatever it left running in its group is
// killed, so that a restart starts clean and nothing outlives the agent.
func StartCommand(stdout, stderr io.Writer) StartFunc {
	return func(argv []string) (Process, error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = stdout, stderr
		cmd.Env = childEnv(os.Environ())
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		setParentDeathSignal(cmd.SysProcAttr)
		cmd.WaitDelay = waitDelay
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return &execProcess{cmd: cmd, pid: cmd.Process.Pid}, nil
	}
}

// childEnv is env without the gossip key.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, membership.KeyEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// execProcess is a Process started by StartCommand.
type execProcess struct {
	cmd *exec.Cmd
	pid int // also the process group ID

	mu     sync.Mutex
	waited bool // Wait has reaped it: the group ID may no longer be ours
}

func (p *execProcess) Pid() int { return p.pid }

func (p *execProcess) Wait() Exit {
	_ = p.cmd.Wait() // the exit status is in ProcessState
	p.mu.Lock()
	p.waited = true
	// Leftovers of the group, if any; ESRCH when there are none.
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	p.mu.Unlock()
	ps := p.cmd.ProcessState
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return Exit{Code: -1, Signal: unix.SignalName(ws.Signal())}
	}
	return Exit{Code: ps.ExitCode()}
}

// Signal signals the process group, unless Wait has already returned.
func (p *execProcess) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waited {
		return os.ErrProcessDone
	}
	return syscall.Kill(-p.pid, sig)
}
