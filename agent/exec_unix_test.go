//go:build unix

package agent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
)

// syncBuffer is a bytes.Buffer safe for the copying goroutine of exec.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startSh(t *testing.T, script string) (Process, *syncBuffer, *syncBuffer) {
	t.Helper()
	var out, errb syncBuffer
	p, err := StartCommand(&out, &errb)([]string{"/bin/sh", "-c", script})
	if err != nil {
		t.Fatal(err)
	}
	return p, &out, &errb
}

// gone reports whether pid has exited (or is a zombie nobody reaped yet).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == syscall.ESRCH
	}
	// pid (comm) STATE ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}

func TestExecProcess(t *testing.T) {
	t.Run("exit code and output", func(t *testing.T) {
		t.Setenv("KEYWAY_GOSSIP_KEY", "c2VjcmV0c2VjcmV0c2VjcmV0")
		p, out, errb := startSh(t, `echo "out key=$KEYWAY_GOSSIP_KEY"; echo err >&2; exit 3`)
		if ex := p.Wait(); ex != (Exit{Code: 3}) {
			t.Fatalf("exit %+v, want code 3", ex)
		}
		if out.String() != "out key=\n" || errb.String() != "err\n" {
			t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
		}
		if err := p.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
			t.Fatalf("Signal after Wait: %v", err)
		}
	})
	t.Run("killed by a signal", func(t *testing.T) {
		p, _, _ := startSh(t, `kill -KILL $$`)
		if ex := p.Wait(); ex != (Exit{Code: -1, Signal: "SIGKILL"}) {
			t.Fatalf("exit %+v, want SIGKILL", ex)
		}
	})
	t.Run("own process group, signalled as a group", func(t *testing.T) {
		p, out, _ := startSh(t, `sleep 60 & echo $!; wait`)
		poll.Until(t, 5*time.Second, "the grandchild's pid", func() bool { return strings.HasSuffix(out.String(), "\n") })
		grandchild, err := strconv.Atoi(strings.TrimSpace(out.String()))
		if err != nil {
			t.Fatal(err)
		}
		if pg, err := syscall.Getpgid(p.Pid()); err != nil || pg != p.Pid() {
			t.Fatalf("process group %d (%v), want its own (%d)", pg, err, p.Pid())
		}
		if pg, err := syscall.Getpgid(grandchild); err != nil || pg != p.Pid() {
			t.Fatalf("grandchild's process group %d (%v), want %d", pg, err, p.Pid())
		}
		if pg := syscall.Getpgrp(); pg == p.Pid() {
			t.Fatal("the test shares the child's process group")
		}
		done := make(chan Exit, 1)
		go func() { done <- p.Wait() }()
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case ex := <-done:
			if ex != (Exit{Code: -1, Signal: "SIGTERM"}) {
				t.Fatalf("exit %+v, want SIGTERM", ex)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no exit within 10s of SIGTERM")
		}
		poll.Until(t, 5*time.Second, "the grandchild to be gone", func() bool { return gone(grandchild) })
	})
	t.Run("leftovers killed when it exits", func(t *testing.T) {
		// The shell exits at once, leaving a sleep in its group.
		p, out, _ := startSh(t, `sleep 60 & echo $!`)
		if ex := p.Wait(); ex != (Exit{Code: 0}) {
			t.Fatalf("exit %+v", ex)
		}
		grandchild, err := strconv.Atoi(strings.TrimSpace(out.String()))
		if err != nil {
			t.Fatalf("%q: %v", out.String(), err)
		}
		poll.Until(t, 5*time.Second, "the leftover to be gone", func() bool { return gone(grandchild) })
	})
	t.Run("cannot start", func(t *testing.T) {
		if _, err := StartCommand(nil, nil)([]string{"/nonexistent/orders-pipeline"}); err == nil {
			t.Fatal("no error")
		}
	})
}
