package eventlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// stallingFile blocks every Write until release is closed, and reports on
// entered when a Write starts.
type stallingFile struct {
	io.WriteCloser
	entered chan<- struct{}
	release <-chan struct{}
}

func (f stallingFile) Write(p []byte) (int, error) {
	select {
	case f.entered <- struct{}{}:
	default:
	}
	<-f.release
	return f.WriteCloser.Write(p)
}

func TestEmitNeverBlocksOnAStuckWriter(t *testing.T) {
	cfg := fileConfig(t)
	cfg.Buffer = 8
	core, logs := observer.New(zap.WarnLevel)
	l, _ := newLog(t, cfg, Options{Logger: zap.New(core)})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	l.open = func(path string, size int64) (io.WriteCloser, int64, error) {
		f, n, err := openFile(path, size)
		if err != nil {
			return nil, 0, err
		}
		return stallingFile{f, entered, release}, n, nil
	}
	stop := start(t, l)

	// The writer takes event 0 and blocks writing it: nothing else is
	// queued, so it holds exactly one event.
	l.Emit(seqEvent(0))
	wait(t, entered, "the writer to start writing")

	// 8 more fill the queue; 5 beyond it are dropped. None may block.
	within(t, "Emit with the writer stuck", func() {
		for i := 1; i <= 13; i++ {
			l.Emit(seqEvent(i))
		}
	})
	if got := counter(l.m.droppedQueue); got != 5 {
		t.Errorf("dropped_total{queue_full} = %v, want 5", got)
	}
	if got := counter(l.m.events.WithLabelValues(KindStateChange)); got != 14 {
		t.Errorf("events_total = %v, want 14", got)
	}
	if got := len(l.Recent(time.Time{}, nil, 0)); got != 14 {
		t.Errorf("Recent has %d events, want all 14", got)
	}
	// One warning for five drops at one instant, four suppressed.
	if w := logs.FilterMessageSnippet("queue full").All(); len(w) != 1 {
		t.Errorf("got %d queue-full warnings, want 1: %v", len(w), w)
	}

	close(release)
	stop()
	evs, err := ReadDir(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	checkSeq(t, evs, 0, 8)
}

func TestWriteFailureWarnsCountsAndRecovers(t *testing.T) {
	// Tests run as root, so permissions cannot make a directory fail:
	// a regular file where a directory should be does.
	base := t.TempDir()
	blocker := filepath.Join(base, "not-a-dir")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Dir = filepath.Join(blocker, "audit")
	c := newClock()
	core, logs := observer.New(zap.WarnLevel)
	l, _ := newLog(t, cfg, Options{Logger: zap.New(core), Now: c.Now})
	start(t, l)

	warnings := func() []observer.LoggedEntry {
		return logs.FilterMessage("audit trail file operation failed, events not written").All()
	}
	// Run's mkdir fails (1), then each batch's (1 each).
	for i := range 3 {
		within(t, "Emit with a failing disk", func() { l.Emit(seqEvent(i)) })
		if err := flush(t, l); !errors.Is(err, syscall.ENOTDIR) {
			t.Fatalf("Flush = %v, want ENOTDIR", err)
		}
	}
	if w, d := counter(l.m.writeErrors), counter(l.m.droppedWrite); w != 4 || d != 3 {
		t.Errorf("write_errors_total = %v, dropped_total{write_error} = %v; want 4 and 3", w, d)
	}
	if got := len(warnings()); got != 1 {
		t.Fatalf("got %d warnings within 10s, want 1", got)
	}
	if f := warnings()[0].ContextMap(); f["op"] != "mkdir" || f["suppressed"] != int64(0) {
		t.Errorf("first warning fields = %v, want op mkdir, suppressed 0", f)
	}

	// 10 s later the next failure warns again, with the count suppressed.
	c.Add(warnEvery)
	l.Emit(seqEvent(3))
	flush(t, l)
	if got := len(warnings()); got != 2 {
		t.Fatalf("got %d warnings after 10s, want 2", got)
	}
	if f := warnings()[1].ContextMap(); f["suppressed"] != int64(3) || f["lost_events"] != int64(1) {
		t.Errorf("second warning fields = %v, want suppressed 3, lost_events 1", f)
	}
	if got := kindsOf(l.Recent(time.Time{}, nil, 0)); len(got) != 4 {
		t.Errorf("Recent has %d events, want all 4 despite the disk", len(got))
	}

	// The disk heals: the next event is written, in file 1.
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	l.Emit(seqEvent(4))
	if err := flush(t, l); err != nil {
		t.Fatalf("Flush after the disk healed = %v", err)
	}
	evs, err := ReadDir(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	checkSeq(t, evs, 4, 4)
	if got := files(t, l.Path()); !reflect.DeepEqual(got, names(1, 1)) {
		t.Errorf("files = %v, want %v", got, names(1, 1))
	}
}

func TestConcurrentEmit(t *testing.T) {
	const writers, each = 8, 500
	cfg := fileConfig(t)
	cfg.Buffer = writers * each // no drops, whatever the scheduling
	cfg.MaxFileBytes = 64 << 10
	cfg.Retain = 1000
	l, _ := newLog(t, cfg, Options{Now: time.Now})
	stop := start(t, l)

	var wg, reader sync.WaitGroup
	done := make(chan struct{})
	reader.Go(func() { // a reader and a flusher meanwhile
		for {
			select {
			case <-done:
				return
			default:
				l.Recent(time.Time{}, []string{"w3"}, 10)
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				if err := l.Flush(ctx); err != nil {
					t.Errorf("Flush: %v", err)
				}
				cancel()
			}
		}
	})
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				l.Emit(Event{Kind: fmt.Sprintf("w%d", g), Fields: map[string]any{"i": i}})
			}
		})
	}
	wg.Wait()
	close(done)
	reader.Wait()
	stop()

	if got := len(l.Recent(time.Time{}, nil, 0)); got != cfg.Memory {
		t.Errorf("Recent has %d events, want %d", got, cfg.Memory)
	}
	evs, err := ReadDir(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != writers*each {
		t.Fatalf("files hold %d events, want %d", len(evs), writers*each)
	}
	next := map[string]int64{}
	for _, e := range evs {
		if e.Fields["i"] != next[e.Kind] {
			t.Fatalf("%s: event %v after %d, want each writer's events in order", e.Kind, e.Fields["i"], next[e.Kind]-1)
		}
		next[e.Kind]++
	}
	if got := counter(l.m.droppedQueue) + counter(l.m.writeErrors); got != 0 {
		t.Errorf("drops + write errors = %v, want 0", got)
	}
}
