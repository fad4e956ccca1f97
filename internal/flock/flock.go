// Package flock holds an exclusive advisory lock on a file for as long as
// a process keeps it open (flock(2) on Unix): the kernel releases it when
// the process exits, however it exits, so a lock that can be taken has no
// living holder. The holder writes what it is into the file, for others
// to read.
package flock

import (
	"errors"
	"os"
)

// ErrLocked is returned by TryLock when another open file holds the lock
// (another process, or another TryLock of this one).
var ErrLocked = errors.New("flock: held by another process")

// Lock is a held lock. Close releases it.
type Lock struct{ f *os.File }

// TryLock opens (creating, mode 0600) and locks path without waiting. It
// fails with ErrLocked when the lock is held.
func TryLock(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := lock(f); err != nil {
		f.Close()
		return nil, err
	}
	return &Lock{f: f}, nil
}

// Write replaces the file's content with b (the holder's description).
func (l *Lock) Write(b []byte) error {
	if err := l.f.Truncate(0); err != nil {
		return err
	}
	_, err := l.f.WriteAt(b, 0)
	return err
}

// Close releases the lock. The file stays.
func (l *Lock) Close() error { return l.f.Close() }

// Held reports whether another process holds the lock on path, and
// returns the file's content (its holder's description) when it does. A
// missing file is not held.
func Held(path string) (bool, []byte, error) {
	l, err := TryLock(path)
	switch {
	case err == nil:
		l.Close()
		return false, nil, nil
	case errors.Is(err, ErrLocked):
		b, rerr := os.ReadFile(path)
		return true, b, rerr
	default:
		return false, nil, err
	}
}
