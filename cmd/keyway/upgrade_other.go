//go:build !unix

package main

import (
	"context"
	"os"
)

// handover off Unix: no socket activation and no binary upgrades; the
// listeners open their own sockets.
type handover struct{ *sockets }

func newHandover(bool, string) (*handover, error) { return &handover{sockets: &sockets{}}, nil }

func (h *handover) Upgrading() bool                     { return false }
func (h *handover) WaitForParent(context.Context) error { return nil }
func (h *handover) Ready() error                        { return nil }
func (h *handover) Upgrade() error                      { return errNoUpgrades }
func (h *handover) close()                              {}

// notifyUpgrade relays nothing: there is no SIGUSR2 off Unix.
func notifyUpgrade(chan<- os.Signal) {}
