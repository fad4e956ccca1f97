//go:build !linux

package proxy

import (
	"errors"

	"go.uber.org/zap"
)

// parker parks nothing where there is no epoll: idle connections keep
// their goroutine (see park.go).
type parker struct{ parkerBase }

func newParker(p *Proxy, cfg parkConfig, log *zap.Logger) *parker {
	return &parker{parkerBase: parkerBase{p: p, cfg: cfg, log: log}}
}

func (pk *parker) start() error {
	return errors.New("parking idle connections needs Linux's epoll")
}

func (pk *parker) park(*lingerConn) bool { return false }
func (pk *parker) stop()                 {}
func (pk *parker) wait()                 {}
