//go:build !unix

package agent

import (
	"errors"
	"io"
)

// StartCommand refuses: supervising a process needs Unix process groups
// and signals.
func StartCommand(io.Writer, io.Writer) StartFunc {
	return func([]string) (Process, error) {
		return nil, errors.New("agent: supervising the replica's process (-- CMD) needs a Unix system")
	}
}
