package eventlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// seqEvent is event i of a run: every such line has the same length.
func seqEvent(i int) Event {
	return Event{Kind: KindStateChange, Set: "orders", Replica: "orders-0",
		Fields: map[string]any{"i": fmt.Sprintf("%05d", i), "to": "ready"}}
}

// perFile returns how many seqEvent lines fit in a 4096-byte file, and
// the length of one line.
func perFile() (n, lineLen int) {
	e := seqEvent(0)
	e.Time, e.Node = t0, "proxy-1"
	line, _ := appendEvent(nil, &e, nil)
	return 4096 / (len(line) + 1), len(line) + 1
}

// files returns the names of the trail's files in dir, in sequence order.
func files(t *testing.T, dir string) []string {
	t.Helper()
	seqs, err := listSeqs(dir)
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	var out []string
	for _, s := range seqs {
		out = append(out, filepath.Base(seqPath(dir, s)))
	}
	return out
}

func names(from, to int) []string {
	var out []string
	for s := from; s <= to; s++ {
		out = append(out, fmt.Sprintf("events-%06d.jsonl", s))
	}
	return out
}

// checkSeq checks that evs are events from..to of seqEvent, in order.
func checkSeq(t *testing.T, evs []Event, from, to int) {
	t.Helper()
	if len(evs) != to-from+1 {
		t.Fatalf("got %d events, want %d (%d..%d)", len(evs), to-from+1, from, to)
	}
	for k, e := range evs {
		if want := fmt.Sprintf("%05d", from+k); e.Fields["i"] != want || e.Node != "proxy-1" {
			t.Fatalf("event %d = %+v, want i=%s node proxy-1", k, e, want)
		}
	}
}

func TestRotationAndRetention(t *testing.T) {
	cfg := fileConfig(t)
	cfg.MaxFileBytes = 4096
	cfg.Retain = 3
	l, _ := newLog(t, cfg, Options{})
	perFile, lineLen := perFile()
	const n = 500
	totalFiles := (n + perFile - 1) / perFile
	if totalFiles < 5 {
		t.Fatalf("test too small: %d files", totalFiles)
	}

	start(t, l)
	for i := range n {
		l.Emit(seqEvent(i))
	}
	if err := flush(t, l); err != nil {
		t.Fatalf("Flush: %v", err)
	}

	dir := filepath.Join(cfg.Dir, "proxy-1")
	if l.Path() != dir {
		t.Errorf("Path() = %q, want %q", l.Path(), dir)
	}
	if got, want := files(t, dir), names(totalFiles-2, totalFiles); !reflect.DeepEqual(got, want) {
		t.Fatalf("files = %v, want %v (retain 3 of %d)", got, want, totalFiles)
	}
	for _, name := range files(t, dir) {
		st, _ := os.Stat(filepath.Join(dir, name))
		if st.Size() > cfg.MaxFileBytes || st.Size()%int64(lineLen) != 0 {
			t.Errorf("%s is %d bytes, want whole %d-byte lines within %d", name, st.Size(), lineLen, cfg.MaxFileBytes)
		}
		if name != names(totalFiles, totalFiles)[0] && st.Size() != int64(perFile*lineLen) {
			t.Errorf("%s is %d bytes, want a full file of %d lines", name, st.Size(), perFile)
		}
	}
	evs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkSeq(t, evs, (totalFiles-3)*perFile, n-1)
	if got := counter(l.m.rotations); got != float64(totalFiles-1) {
		t.Errorf("file_rotations_total = %v, want %d", got, totalFiles-1)
	}
	if got := counter(l.m.writeErrors); got != 0 {
		t.Errorf("write_errors_total = %v, want 0", got)
	}
}

func TestRestartContinuesSequence(t *testing.T) {
	cfg := fileConfig(t)
	cfg.MaxFileBytes = 4096
	dir := filepath.Join(cfg.Dir, "proxy-1")

	// First run: enough for three files.
	per, _ := perFile()
	l1, _ := newLog(t, cfg, Options{})
	stop := start(t, l1)
	for i := range 3 * per {
		l1.Emit(seqEvent(i))
	}
	stop()
	first := files(t, dir)
	if len(first) != 3 {
		t.Fatalf("first run wrote %v, want 3 files", first)
	}
	// Foreign files are neither numbered after nor deleted.
	for _, name := range []string{"events-99.jsonl", "events-000009.json", "notes.txt", "events-00000x.jsonl"} {
		os.WriteFile(filepath.Join(dir, name), []byte("x\n"), 0o644)
	}

	// Second run: a started Log that emits nothing creates no file.
	l2, _ := newLog(t, cfg, Options{})
	stop = start(t, l2)
	if err := flush(t, l2); err != nil {
		t.Fatal(err)
	}
	if got := files(t, dir); !reflect.DeepEqual(got, first) {
		t.Errorf("an idle run changed the files: %v, want %v", got, first)
	}
	l2.Emit(seqEvent(3 * per))
	stop()
	if got := files(t, dir); !reflect.DeepEqual(got, names(1, 4)) {
		t.Fatalf("after restart: files %v, want %v", got, names(1, 4))
	}
	evs, err := ReadFile(filepath.Join(dir, "events-000004.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	checkSeq(t, evs, 3*per, 3*per)

	// Third run with retain 2: its first file prunes down to two.
	cfg.Retain = 2
	l3, _ := newLog(t, cfg, Options{})
	stop = start(t, l3)
	l3.Emit(seqEvent(3*per + 1))
	stop()
	if got := files(t, dir); !reflect.DeepEqual(got, names(4, 5)) {
		t.Fatalf("after restart with retain 2: files %v, want %v", got, names(4, 5))
	}
	evs, err = ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkSeq(t, evs, 3*per, 3*per+1)
	for _, name := range []string{"events-99.jsonl", "events-000009.json", "notes.txt", "events-00000x.jsonl"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("foreign file %s: %v", name, err)
		}
	}
}

func TestShutdownDrainsQueue(t *testing.T) {
	cfg := fileConfig(t)
	cfg.Buffer = 50
	l, _ := newLog(t, cfg, Options{})
	// Before Run: the queue holds 50, the rest are dropped and counted.
	for i := range 60 {
		l.Emit(seqEvent(i))
	}
	if got := counter(l.m.droppedQueue); got != 10 {
		t.Errorf("dropped_total{queue_full} = %v, want 10", got)
	}
	// A Run whose context is already done writes what is queued first.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	within(t, "Run with a done context", func() {
		if err := l.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	evs, err := ReadDir(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	checkSeq(t, evs, 0, 49)
}

func TestExistingFileNeverTruncated(t *testing.T) {
	cfg := fileConfig(t)
	cfg.MaxFileBytes = 4096
	l, _ := newLog(t, cfg, Options{})
	start(t, l)
	l.Emit(seqEvent(0))
	if err := flush(t, l); err != nil {
		t.Fatal(err)
	}
	// Someone puts file 2 in place while file 1 is being written: the
	// rotation must number past it, not truncate it.
	other := filepath.Join(l.Path(), "events-000002.jsonl")
	os.WriteFile(other, []byte("keep me\n"), 0o644)
	per, _ := perFile()
	for i := 1; i < 2*per; i++ { // fills files 1 and 3
		l.Emit(seqEvent(i))
	}
	if err := flush(t, l); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(other); string(b) != "keep me\n" {
		t.Errorf("events-000002.jsonl = %q, was truncated or appended to", b)
	}
	if got := files(t, l.Path()); !reflect.DeepEqual(got, names(1, 3)) {
		t.Errorf("files = %v, want %v", got, names(1, 3))
	}
	if evs, err := ReadFile(filepath.Join(l.Path(), "events-000003.jsonl")); err != nil || len(evs) != per {
		t.Errorf("events-000003.jsonl: %d events, %v; want the second file's %d", len(evs), err, per)
	}
}

// failingFile fails the next Write after writing half of it, once.
type failingFile struct {
	io.WriteCloser
	failNext *atomic.Bool
}

func (f failingFile) Write(p []byte) (int, error) {
	if f.failNext.CompareAndSwap(true, false) {
		n, _ := f.WriteCloser.Write(p[:len(p)/2])
		return n, syscall.ENOSPC
	}
	return f.WriteCloser.Write(p)
}

func TestPartialWriteIsCutOff(t *testing.T) {
	cfg := fileConfig(t)
	l, _ := newLog(t, cfg, Options{})
	var failNext atomic.Bool
	var opens atomic.Int32
	l.open = func(path string, size int64) (io.WriteCloser, int64, error) {
		opens.Add(1)
		f, n, err := openFile(path, size)
		if err != nil {
			return nil, 0, err
		}
		return failingFile{f, &failNext}, n, nil
	}
	start(t, l)

	l.Emit(seqEvent(0))
	if err := flush(t, l); err != nil {
		t.Fatal(err)
	}
	failNext.Store(true)
	l.Emit(seqEvent(1))
	if err := flush(t, l); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Flush after a failed write = %v, want ENOSPC", err)
	}
	l.Emit(seqEvent(2))
	if err := flush(t, l); err != nil {
		t.Fatalf("Flush after recovery = %v", err)
	}

	// Half of line 1 reached the file; the reopen cut it off.
	if got := files(t, l.Path()); !reflect.DeepEqual(got, names(1, 1)) {
		t.Errorf("files = %v, want the same file reopened", got)
	}
	evs, err := ReadDir(l.Path())
	if err != nil {
		t.Fatalf("ReadDir: %v (a partial line was left)", err)
	}
	if len(evs) != 2 || evs[0].Fields["i"] != "00000" || evs[1].Fields["i"] != "00002" {
		t.Errorf("events = %+v, want 0 and 2", evs)
	}
	if opens.Load() != 2 {
		t.Errorf("file opened %d times, want 2", opens.Load())
	}
	if w, d := counter(l.m.writeErrors), counter(l.m.droppedWrite); w != 1 || d != 1 {
		t.Errorf("write_errors_total = %v, dropped_total{write_error} = %v; want 1 and 1", w, d)
	}
	if got := len(l.Recent(time.Time{}, nil, 0)); got != 3 {
		t.Errorf("Recent has %d events, want all 3", got)
	}
}

func TestFileTruncatedByOthers(t *testing.T) {
	// logrotate's copytruncate, say: the file shrinks under the writer.
	// Appending keeps the file free of a hole of NUL bytes.
	l, _ := newLog(t, fileConfig(t), Options{})
	start(t, l)
	l.Emit(seqEvent(0))
	if err := flush(t, l); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(l.Path(), "events-000001.jsonl")
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	l.Emit(seqEvent(1))
	if err := flush(t, l); err != nil {
		t.Fatal(err)
	}
	evs, err := ReadFile(path)
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	checkSeq(t, evs, 1, 1)
}
