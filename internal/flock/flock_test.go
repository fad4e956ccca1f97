package flock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

func TestTryLockExcludesAndReleases(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("file locks need a Unix system")
	}
	path := filepath.Join(t.TempDir(), "lock")
	l, err := TryLock(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write([]byte(`{"pid":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := TryLock(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("second TryLock: %v, want ErrLocked", err)
	}
	held, b, err := Held(path)
	if err != nil || !held || string(b) != `{"pid":1}` {
		t.Fatalf("Held = %v %q %v, want true and the holder's content", held, b, err)
	}
	l.Close()
	if held, _, err := Held(path); err != nil || held {
		t.Fatalf("after Close: Held = %v %v, want false", held, err)
	}
	if held, _, err := Held(filepath.Join(t.TempDir(), "none")); err != nil || held {
		t.Fatalf("missing file: Held = %v %v", held, err)
	}
}

// A lock held by a process that is killed is free again: the kernel
// releases it.
func TestLockOfKilledProcessIsFree(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("file locks need a Unix system")
	}
	if os.Getenv("FLOCK_HOLD") != "" {
		if _, err := TryLock(os.Getenv("FLOCK_HOLD")); err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("held\n")
		select {}
	}
	path := filepath.Join(t.TempDir(), "lock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockOfKilledProcessIsFree$")
	cmd.Env = append(os.Environ(), "FLOCK_HOLD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("holder: %q %v", buf, err)
	}
	if held, _, _ := Held(path); !held {
		t.Fatal("lock of a living process not held")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if held, _, err := Held(path); err != nil || held {
		t.Fatalf("after kill -9: Held = %v %v, want free", held, err)
	}
}
