package agent

import "syscall"

// setParentDeathSignal makes the kernel SIGKILL the child when the agent
// dies (SIGKILL, a crash), so that a replica never outlives its agent
// holding its port. Linux ties this to the thread that started the child;
// Go ends a thread only when a goroutine locked to it exits, which the
// agent never does.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
