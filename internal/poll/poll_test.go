package poll

import (
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	n := 0
	if !Within(5*time.Second, func() bool { n++; return n == 3 }) || n != 3 {
		t.Fatalf("Within stopped after %d checks, want 3", n)
	}
	start := time.Now()
	if Within(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("Within reported a condition that never held")
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Fatal("Within gave up before its deadline")
	}
}

type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = format
}

func TestUntilFails(t *testing.T) {
	r := &fatalRecorder{TB: t}
	Until(r, 30*time.Millisecond, "never", func() bool { return false })
	if r.msg == "" {
		t.Fatal("Until did not fail the test for a condition that never held")
	}
}
