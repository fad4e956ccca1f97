//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/cloudflare/tableflip"
	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
)

// handover is a proxy process's sockets and its part in upgrades: the
// sockets systemd passed, and tableflip's Upgrader, which passes them on
// to an upgrade's new process (SIGUSR2) and tells the old one when the
// new one is ready.
type handover struct {
	*sockets
	upg *tableflip.Upgrader // nil: upgrades off (not a keyway process of its own)
}

// newHandover takes the sockets systemd passed (LISTEN_FDS) and, when
// upgrades is set, starts tableflip's Upgrader: once per process, in the
// process keyway's main runs (tests running the command in-process get
// no upgrades). pidFile, if set, receives the PID of the process that
// serves, once it is ready (after an upgrade, the new one's).
func newHandover(upgrades bool, pidFile string) (*handover, error) {
	h := &handover{sockets: &sockets{}}
	named, err := activation.ListenersWithNames()
	if err != nil {
		return nil, fmt.Errorf("systemd socket activation: %w", err)
	}
	for name, lns := range named {
		for _, ln := range lns {
			h.activated = append(h.activated, activated{name: name, ln: ln})
		}
	}
	if !upgrades {
		return h, nil
	}
	h.upg, err = tableflip.New(tableflip.Options{PIDFile: pidFile, UpgradeTimeout: upgradeTimeout})
	if err != nil {
		h.close()
		return nil, fmt.Errorf("binary upgrades: %w", err)
	}
	h.upgrades = fds{h.upg.Fds}
	if h.upg.HasParent() {
		h.inheritHeld()
	}
	return h, nil
}

// fds is tableflip's Fds as sockets' upgrader.
type fds struct{ f *tableflip.Fds }

func (f fds) Listener(network, key string) (net.Listener, error) { return f.f.Listener(network, key) }

func (f fds) Listen(network, key, addr string) (net.Listener, error) {
	return f.f.ListenWithCallback(network, key, func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) })
}

func (f fds) AddListener(network, key string, ln net.Listener) error {
	tl, ok := ln.(tableflip.Listener)
	if !ok {
		return fmt.Errorf("the socket %s cannot be passed on to an upgrade", key)
	}
	return f.f.AddListener(network, key, tl)
}

// Upgrading reports whether this process is an upgrade's new process.
func (h *handover) Upgrading() bool { return h.upg != nil && h.upg.HasParent() }

// Ready says this process serves: an upgrade's old process then stops
// accepting and drains; the PID file names this process; systemd
// (Type=notify) learns the PID that serves now.
func (h *handover) Ready() error {
	var err error
	if h.upg != nil {
		err = h.upg.Ready()
	}
	if _, nerr := daemon.SdNotify(false, "READY=1\nMAINPID="+strconv.Itoa(os.Getpid())); nerr != nil && err == nil {
		err = fmt.Errorf("telling systemd: %w", nerr)
	}
	return err
}

// WaitForParent waits until an upgrade's old process has exited (at
// once when this process is no upgrade).
func (h *handover) WaitForParent(ctx context.Context) error {
	if h.upg == nil {
		return nil
	}
	return h.upg.WaitForParent(ctx)
}

// Upgrade starts the binary at the path this process was started from,
// passing it the listening sockets, and waits until it is ready (or
// failed, or upgradeTimeout passed). On success this process must stop.
func (h *handover) Upgrade() error {
	if h.upg == nil {
		return errors.New("binary upgrades are off in this process")
	}
	return h.upg.Upgrade()
}

// close stops upgrades, closing the copies of the sockets kept to pass
// on, and closes the activated sockets no listener took. Safe to call
// more than once.
func (h *handover) close() {
	if h.upg != nil {
		h.upg.Stop() // closes its copies of the sockets (once)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range h.activated {
		_ = a.ln.Close()
	}
	h.activated = nil
}

// notifyUpgrade relays SIGUSR2, the signal that upgrades the binary.
func notifyUpgrade(c chan<- os.Signal) { signal.Notify(c, syscall.SIGUSR2) }
