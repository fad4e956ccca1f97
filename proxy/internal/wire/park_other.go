//go:build !linux

package wire

import "errors"

// Parker parks nothing where there is no epoll: idle connections keep
// their goroutine (see park.go), and Start says so.
type Parker struct{ parkerBase }

func newParker() *Parker { return &Parker{} }

// Start fails: parking needs epoll.
func (pk *Parker) Start() error {
	return errors.New("parking idle connections needs Linux's epoll")
}

func (pk *Parker) park(*ClientConn) bool { return false }

// Stop does nothing: nothing parks.
func (pk *Parker) Stop() {}

// Wait does nothing: nothing parks.
func (pk *Parker) Wait() {}
