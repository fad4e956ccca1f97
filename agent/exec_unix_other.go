//go:build unix && !linux

package agent

import "syscall"

// setParentDeathSignal does nothing here: only Linux can kill the child
// when the agent dies. Elsewhere a replica outlives an agent killed with
// SIGKILL.
func setParentDeathSignal(*syscall.SysProcAttr) {}
