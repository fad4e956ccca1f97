//go:build !unix

package runner

import (
	"errors"
	"os/exec"
	"syscall"
)

var errUnix = errors.New("runner: running replicas (a set's run section) needs a Unix system")

func newProcessGroup() *syscall.SysProcAttr { return nil }

func (j *job) signalTerm() error { return errUnix }

func (j *job) kill() {}

func describeExit(ee *exec.ExitError) string { return ee.Error() }
