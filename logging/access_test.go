package logging

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"keyway/internal/metricstest"
	"keyway/internal/poll"
)

// syncBuffer is an output safe to read while the flusher writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// manualTicker hands the access log a tick channel the test drives, and
// records the interval asked for.
type manualTicker struct {
	c        chan time.Time
	interval time.Duration
}

func newManualTicker() *manualTicker { return &manualTicker{c: make(chan time.Time)} }

func (m *manualTicker) newTicker(d time.Duration) (<-chan time.Time, func()) {
	m.interval = d
	return m.c, func() {}
}

func accessCfg(mod func(*AccessConfig)) AccessConfig {
	c := DefaultConfig().Access
	if mod != nil {
		mod(&c)
	}
	return c
}

// line is a test line of fixed length (11 bytes).
func line(i int) []byte { return fmt.Appendf(nil, `{"n":%04d}`+"\n", i) }

// TestAccessLogFlushesEverySecond: lines wait in the buffer until the
// flusher's tick, which comes every second.
func TestAccessLogFlushesEverySecond(t *testing.T) {
	var out syncBuffer
	tk := newManualTicker()
	a, err := newAccessLog(accessCfg(nil), accessOptions{stdout: &out, newTicker: tk.newTicker})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, _ = a.Write(line(1))
	_, _ = a.Write(line(2))
	if tk.interval != time.Second {
		t.Fatalf("flush interval %s, want 1s", tk.interval)
	}
	if out.String() != "" {
		t.Fatalf("written before the tick: %q", out.String())
	}
	tk.c <- time.Now() // received: the flusher is flushing
	poll.Until(t, 5*time.Second, "the lines after a tick", func() bool { return out.String() == string(line(1))+string(line(2)) })
	_, _ = a.Write(line(3))
	tk.c <- time.Now()
	poll.Until(t, 5*time.Second, "the third line after the next tick", func() bool { return strings.Count(out.String(), "\n") == 3 })
}

// TestAccessLogRealTicker: with the real clock a line reaches the output
// within about a second, without Close.
func TestAccessLogRealTicker(t *testing.T) {
	var out syncBuffer
	a, err := newAccessLog(accessCfg(nil), accessOptions{stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, _ = a.Write(line(1))
	poll.Until(t, 3*time.Second, "the line on the output", func() bool { return out.String() == string(line(1)) })
}

// blockingWriter blocks every Write until release is closed.
type blockingWriter struct {
	entered chan struct{}
	release chan struct{}
	out     syncBuffer
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.release
	return w.out.Write(p)
}

// TestAccessLogDropsWhenFull: with the output stuck, Write never blocks;
// once both buffers are in use lines are dropped and counted, and what
// was buffered is written whole when the output moves again.
func TestAccessLogDropsWhenFull(t *testing.T) {
	w := &blockingWriter{entered: make(chan struct{}, 1), release: make(chan struct{})}
	tk := newManualTicker()
	size := 10 * len(line(0))
	a, err := newAccessLog(accessCfg(nil), accessOptions{stdout: w, newTicker: tk.newTicker, size: size})
	if err != nil {
		t.Fatal(err)
	}
	// 10 lines fill the first buffer; the 11th hands it to the flusher,
	// which blocks in the output.
	for i := range 11 {
		_, _ = a.Write(line(i))
	}
	<-w.entered
	// 9 more fill the second buffer; the 5 after them find no room.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 11; i < 25; i++ {
			_, _ = a.Write(line(i))
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Write blocked on a stuck output")
	}
	if full, failed := a.Dropped(); full != 5 || failed != 0 {
		t.Fatalf("dropped %d (buffer full), %d (write error), want 5, 0", full, failed)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a)
	metricstest.Lint(t, reg)
	want := `# HELP keyway_access_log_dropped_total Access-log lines lost, by reason: buffer_full (the output was slower than the requests for longer than the buffer lasts; requests never wait for it), write_error (the write failed; the error is logged).
# TYPE keyway_access_log_dropped_total counter
keyway_access_log_dropped_total{reason="buffer_full"} 5
keyway_access_log_dropped_total{reason="write_error"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "keyway_access_log_dropped_total"); err != nil {
		t.Fatal(err)
	}
	close(w.release)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	var wantOut strings.Builder
	for i := range 20 {
		wantOut.Write(line(i))
	}
	if got := w.out.String(); got != wantOut.String() {
		t.Fatalf("output after the stall:\n%s\nwant lines 0-19 in order", got)
	}
}

// failingWriter fails every Write; with half set it writes half of it.
type failingWriter struct {
	half bool
	out  syncBuffer
}

func (w *failingWriter) Write(p []byte) (int, error) {
	n := 0
	if w.half {
		n, _ = w.out.Write(p[:len(p)/2])
	}
	return n, errors.New("disk full")
}

// TestAccessLogWriteError: lines a failed write lost are counted, and the
// failure is logged once, not per flush; a success is logged again.
func TestAccessLogWriteError(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	w := &failingWriter{}
	tk := newManualTicker()
	a, err := newAccessLog(accessCfg(nil), accessOptions{stdout: w, newTicker: tk.newTicker, log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		for i := range 4 {
			_, _ = a.Write(line(i))
		}
		tk.c <- time.Now()
		poll.Until(t, 5*time.Second, "the lost lines counted", func() bool {
			_, failed := a.Dropped()
			return failed == uint64(4*(round+1))
		})
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessageSnippet("access log write failed").Len(); n != 1 {
		t.Fatalf("%d error lines, want 1: %v", n, logs.All())
	}
	// A partial write loses the lines it did not finish; the next good
	// write is logged.
	w.half = true
	a.outMu.Lock()
	a.writeOut([]byte(string(line(1)) + string(line(2)) + string(line(3)) + string(line(4)))) // 22 of 44 bytes: 2 lines lost
	a.out = &syncBuffer{}
	a.writeOut(line(5))
	a.outMu.Unlock()
	if full, failed := a.Dropped(); full != 0 || failed != 10 {
		t.Fatalf("dropped %d, %d; want 0 (buffer full), 10 (write error)", full, failed)
	}
	if logs.FilterMessage("access log writes succeed again").Len() != 1 {
		t.Fatalf("the recovery was not logged: %v", logs.All())
	}
}

// TestAccessLogReopen: after the file is renamed (logrotate's create
// mode), Reopen writes what was buffered to the renamed file and the lines
// after it to a new file at the configured path.
func TestAccessLogReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	core, logs := observer.New(zap.InfoLevel)
	tk := newManualTicker()
	a, err := newAccessLog(accessCfg(func(c *AccessConfig) { c.Path = path }), accessOptions{newTicker: tk.newTicker, log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a)
	_, _ = a.Write(line(1))
	tk.c <- time.Now()
	_, _ = a.Write(line(2)) // buffered at the rename
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Reopen(); err != nil {
		t.Fatal(err)
	}
	_, _ = a.Write(line(3))
	// A failed reopen (the directory is gone) keeps the open file.
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Rename(dir+".moved", dir) })
	if err := a.Reopen(); err == nil {
		t.Fatal("Reopen succeeded without a directory")
	}
	_, _ = a.Write(line(4))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got, want := read(path+".1"), string(line(1))+string(line(2)); got != want {
		t.Fatalf("rotated file %q, want %q", got, want)
	}
	if got, want := read(path), string(line(3))+string(line(4)); got != want {
		t.Fatalf("new file %q, want %q", got, want)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("new file mode %v (%v), want 0640", fi.Mode().Perm(), err)
	}
	want := `# HELP keyway_access_log_reopens_total Reopenings of the access log file (SIGUSR1, after a rotation), by result: success, or failure (the old file stays in use; the error is logged).
# TYPE keyway_access_log_reopens_total counter
keyway_access_log_reopens_total{result="failure"} 1
keyway_access_log_reopens_total{result="success"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "keyway_access_log_reopens_total"); err != nil {
		t.Fatal(err)
	}
	if logs.FilterMessage("access log not reopened; writing on to the old file").Len() != 1 {
		t.Fatalf("the failed reopen was not logged: %v", logs.All())
	}
}

// TestAccessLogClose: Close writes out the buffer, is idempotent, and a
// Write after it writes nothing and starts nothing.
func TestAccessLogClose(t *testing.T) {
	var out syncBuffer
	a, err := newAccessLog(accessCfg(nil), accessOptions{stdout: &out, newTicker: newManualTicker().newTicker})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = a.Write(line(1))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, _ = a.Write(line(2))
	if out.String() != string(line(1)) {
		t.Fatalf("output %q, want the first line only", out.String())
	}
	// Never written to: Close works without a flusher.
	b, err := newAccessLog(accessCfg(nil), accessOptions{stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil || b.started {
		t.Fatalf("Close: %v, started %v", err, b.started)
	}
	_, _ = b.Write(line(3))
	if b.started || out.String() != string(line(1)) {
		t.Fatal("a Write after Close started the flusher or wrote")
	}
}

// TestAccessLogConcurrent: lines written from many goroutines come out
// whole, each once, or are counted as dropped.
func TestAccessLogConcurrent(t *testing.T) {
	var out syncBuffer
	a, err := newAccessLog(accessCfg(nil), accessOptions{stdout: &out, size: 4096})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 2000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				_, _ = a.Write(line(w*each + i))
			}
		})
	}
	wg.Wait()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var n int
		if _, err := fmt.Sscanf(l, `{"n":%d}`, &n); err != nil || seen[l] {
			t.Fatalf("line %q torn or repeated", l)
		}
		seen[l] = true
	}
	full, failed := a.Dropped()
	if len(seen)+int(full) != writers*each || failed != 0 {
		t.Fatalf("%d lines out + %d dropped, want %d in all (%d write errors)", len(seen), full, writers*each, failed)
	}
}

// TestKeyHasherKnownVector: RFC 4231's HMAC-SHA256 test cases 2 and 6,
// the first 16 hex digits.
func TestKeyHasherKnownVector(t *testing.T) {
	k := newKeyHasher([]byte("Jefe"))
	if got := string(k.appendKey([]byte("x="), []byte("what do ya want for nothing?"))); got != "x=5bdcc146bf60754e" {
		t.Fatalf("HMAC = %s, want x=5bdcc146bf60754e", got)
	}
	// Through a secret file (131 bytes of 0xaa, then a newline) and New.
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, append(bytes.Repeat([]byte{0xaa}, 131), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.AccessLog = true
	cfg.Access.Key = KeyHMAC
	cfg.Access.KeySecretFile = secret
	t.Setenv(KeySecretEnv, "")
	l, err := New(cfg, io.Discard, &syncBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := string(l.Access.KeyAppender()(nil, []byte("Test Using Larger Than Block-Size Key - Hash Key First"))); got != "60e431591ee0b67f" {
		t.Fatalf("HMAC = %s, want 60e431591ee0b67f", got)
	}
	// The environment's secret takes precedence over the file.
	t.Setenv(KeySecretEnv, "  Jefe-Jefe-Jefe-Jefe \n")
	l2, err := New(cfg, io.Discard, &syncBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	want := string(newKeyHasher([]byte("Jefe-Jefe-Jefe-Jefe")).appendKey(nil, []byte("k")))
	if got := string(l2.Access.KeyAppender()(nil, []byte("k"))); got != want {
		t.Fatalf("with the environment's secret: %s, want %s", got, want)
	}
}

// TestKeyModes: omit leaves the key out, plain appends it as is.
func TestKeyModes(t *testing.T) {
	for mode, want := range map[string]string{KeyOmit: "<nil>", KeyPlain: "p:cust-42"} {
		a, err := newAccessLog(accessCfg(func(c *AccessConfig) { c.Key = mode }), accessOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := "<nil>"
		if f := a.KeyAppender(); f != nil {
			got = string(f([]byte("p:"), []byte("cust-42")))
		}
		if got != want {
			t.Errorf("%s: %s, want %s", mode, got, want)
		}
	}
}

func BenchmarkKeyHMAC(b *testing.B) {
	k := newKeyHasher([]byte("0123456789abcdef0123456789abcdef"))
	dst, key := make([]byte, 0, 64), []byte("customer-42")
	b.ReportAllocs()
	for b.Loop() {
		dst = k.appendKey(dst[:0], key)
	}
}

// BenchmarkAccessLogWrite compares the buffered writer with a write(2)
// per line to the same file, from one goroutine and from all of them: the
// measurement behind buffering (docs/logging.md). The buffered writer
// takes lines far faster than a disk does: dropped/op is the share it had
// to drop, and ns/op mixes kept and dropped lines.
func BenchmarkAccessLogWrite(b *testing.B) {
	l := bytes.Repeat([]byte("x"), 299)
	l = append(l, '\n')
	b.Run("buffered", func(b *testing.B) {
		a, err := newAccessLog(accessCfg(func(c *AccessConfig) { c.Path = filepath.Join(b.TempDir(), "a.log") }), accessOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer a.Close()
		b.ReportAllocs()
		for b.Loop() {
			_, _ = a.Write(l)
		}
		full, _ := a.Dropped()
		b.ReportMetric(float64(full)/float64(b.N), "dropped/op")
	})
	b.Run("buffered_discard", func(b *testing.B) {
		// Output to io.Discard: the flusher keeps up, and ns/op is the
		// cost of a line that is kept.
		a, err := newAccessLog(accessCfg(nil), accessOptions{stdout: io.Discard})
		if err != nil {
			b.Fatal(err)
		}
		defer a.Close()
		b.ReportAllocs()
		for b.Loop() {
			_, _ = a.Write(l)
		}
		full, _ := a.Dropped()
		b.ReportMetric(float64(full)/float64(b.N), "dropped/op")
	})
	b.Run("buffered_parallel", func(b *testing.B) {
		a, err := newAccessLog(accessCfg(func(c *AccessConfig) { c.Path = filepath.Join(b.TempDir(), "a.log") }), accessOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer a.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, _ = a.Write(l)
			}
		})
		full, _ := a.Dropped()
		b.ReportMetric(float64(full)/float64(b.N), "dropped/op")
	})
	b.Run("write_per_line", func(b *testing.B) {
		f, err := openAccessFile(filepath.Join(b.TempDir(), "a.log"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		b.ReportAllocs()
		for b.Loop() {
			_, _ = f.Write(l)
		}
	})
	b.Run("write_per_line_parallel", func(b *testing.B) {
		f, err := openAccessFile(filepath.Join(b.TempDir(), "a.log"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, _ = f.Write(l)
			}
		})
	})
}
