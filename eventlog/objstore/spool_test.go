package objstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// spoolFiles returns the segment files in dir, in name order, and their
// total size.
func spoolFiles(t *testing.T, dir string) (names []string, size int) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), spoolSuffix) {
			info, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, e.Name())
			size += int(info.Size())
		}
	}
	return names, size
}

// spoolEvents adds up the events the headers of dir's segment files
// announce.
func spoolEvents(t *testing.T, dir string) int {
	t.Helper()
	names, _ := spoolFiles(t, dir)
	n := 0
	for _, name := range names {
		e, err := readSpoolEntry(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		n += e.events
	}
	return n
}

func testSegment(key string, events, size int) *Segment {
	return &Segment{Key: key, Events: events, Body: bytes.Repeat([]byte("x"), size)}
}

func openTestSpool(t *testing.T, dir string, maxBytes int) (*dirSpool, int, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	d, dropped, err := openDirSpool(dir, maxBytes, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	return d, dropped, logs
}

// Segments become files named in the order they were cut, each a JSON
// header naming its key and then its body; the bound counts the files'
// bytes; a popped segment's file is gone; a new process on the directory
// finds the rest in order, under their keys, and numbers its own after
// them.
func TestDirSpool(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	d, _, _ := openTestSpool(t, dir, 1000)
	for i, key := range []string{"p/a/run-r/events-000001.jsonl", "p/~fleet/run-r/events-000001.jsonl", "p/a/run-r/events-000002.jsonl"} {
		if err := d.put(testSegment(key, i+1, 200)); err != nil {
			t.Fatal(err)
		}
	}
	names, size := spoolFiles(t, dir)
	if !slices.Equal(names, []string{"000000000001.seg", "000000000002.seg", "000000000003.seg"}) || size != d.Bytes() || d.Len() != 3 {
		t.Fatalf("files %v (%d bytes), spool %d segments %d bytes", names, size, d.Len(), d.Bytes())
	}
	b, err := os.ReadFile(filepath.Join(dir, names[1]))
	if err != nil {
		t.Fatal(err)
	}
	line, body, _ := bytes.Cut(b, []byte("\n"))
	var h spoolHeader
	if err := json.Unmarshal(line, &h); err != nil || h.Key != "p/~fleet/run-r/events-000001.jsonl" || h.Events != 2 || h.Bytes != 200 || len(body) != 200 {
		t.Fatalf("file %s: header %s (%v), body %d bytes", names[1], line, err, len(body))
	}
	// 3 files of about 290 bytes: a fourth does not fit.
	if err := d.put(testSegment("p/a/run-r/events-000003.jsonl", 1, 200)); !errors.Is(err, errSpoolFull) {
		t.Fatalf("a segment beyond the bound: %v", err)
	}
	if names, _ := spoolFiles(t, dir); len(names) != 3 {
		t.Fatalf("a refused segment left a file: %v", names)
	}
	g, err := d.oldest()
	if err != nil || g.Key != "p/a/run-r/events-000001.jsonl" || g.Events != 1 || len(g.Body) != 200 {
		t.Fatalf("oldest: %+v, %v", g, err)
	}
	d.Pop()
	if names, size := spoolFiles(t, dir); len(names) != 2 || names[0] != "000000000002.seg" || size != d.Bytes() {
		t.Fatalf("after a pop: %v, %d bytes (spool %d)", names, size, d.Bytes())
	}

	// A new process: the leftovers first, in order, read from disk.
	d2, dropped, logs := openTestSpool(t, dir, 1000)
	if dropped != 0 || d2.Len() != 2 || d2.Bytes() != d.Bytes() || d2.front != nil {
		t.Fatalf("reopened: %d segments, %d bytes, %d dropped", d2.Len(), d2.Bytes(), dropped)
	}
	if logs.FilterMessageSnippet("earlier run").Len() != 1 {
		t.Fatal("no message about the leftovers")
	}
	if err := d2.put(testSegment("p/a/run-r2/events-000001.jsonl", 5, 100)); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for g, err := d2.oldest(); g != nil; g, err = d2.oldest() {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, g.Key)
		d2.Pop()
	}
	want := []string{"p/~fleet/run-r/events-000001.jsonl", "p/a/run-r/events-000002.jsonl", "p/a/run-r2/events-000001.jsonl"}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	if names, _ := spoolFiles(t, dir); len(names) != 0 || d2.Bytes() != 0 {
		t.Fatalf("an empty spool left %v (%d bytes)", names, d2.Bytes())
	}
	// Numbering goes on after the highest file seen, not from 1 again.
	if d2.next != 5 {
		t.Fatalf("next file %d, want 5", d2.next)
	}
}

// What an earlier process left counts towards the bound: the newest
// leftovers beyond it are removed, their events counted and logged.
func TestDirSpoolLeftoversBeyondBound(t *testing.T) {
	dir := t.TempDir()
	d, _, _ := openTestSpool(t, dir, 10000)
	for i := range 3 {
		if err := d.put(testSegment(Key("p", "a", "r", i+1), 10+i, 200)); err != nil {
			t.Fatal(err)
		}
	}
	_, size := spoolFiles(t, dir)
	d2, dropped, logs := openTestSpool(t, dir, size-1)
	if d2.Len() != 2 || dropped != 12 {
		t.Fatalf("reopened with a smaller bound: %d segments, %d events dropped, want 2 and 12", d2.Len(), dropped)
	}
	if names, _ := spoolFiles(t, dir); !slices.Equal(names, []string{"000000000001.seg", "000000000002.seg"}) {
		t.Fatalf("files %v", names)
	}
	if logs.FilterMessageSnippet("exceed spool_bytes").Len() != 1 {
		t.Fatal("the drop was not logged")
	}
}

// Files that are not whole segments (a write cut short, a damaged header,
// a truncated body) are removed with one warning; files of other names
// are left alone; a body whose CRC fails is reported when it is read,
// with its key and events, for the sink to count.
func TestDirSpoolDamagedFiles(t *testing.T) {
	dir := t.TempDir()
	d, _, _ := openTestSpool(t, dir, 10000)
	for i := range 4 {
		if err := d.put(testSegment(Key("p", "a", "r", i+1), 7, 100)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := func(n string) string { return filepath.Join(dir, n) }
	write(".000000000005.seg.123456", `{"v":1,"key":"p/a/run-r/events-000`) // a crash mid-write
	write("notes.txt", "not ours")
	b, _ := os.ReadFile(path("000000000002.seg"))
	write("000000000002.seg", string(b[:len(b)-10])) // truncated
	write("000000000003.seg", "garbage\n")           // no header
	b, _ = os.ReadFile(path("000000000004.seg"))
	b[len(b)-1] = 'y' // the body, damaged
	write("000000000004.seg", string(b))

	d2, _, logs := openTestSpool(t, dir, 10000)
	if d2.Len() != 2 {
		t.Fatalf("%d segments kept, want 2 (1 and 4)", d2.Len())
	}
	warns := logs.FilterLevelExact(zap.WarnLevel).All()
	if len(warns) != 1 || !strings.Contains(warns[0].Message, "unreadable") {
		t.Fatalf("warnings: %v", warns)
	}
	for _, n := range []string{".000000000005.seg.123456", "000000000002.seg", "000000000003.seg"} {
		if _, err := os.Stat(path(n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not removed: %v", n, err)
		}
	}
	if _, err := os.Stat(path("notes.txt")); err != nil {
		t.Errorf("a file of another name was touched: %v", err)
	}
	if g, err := d2.oldest(); err != nil || g.Key != Key("p", "a", "r", 1) {
		t.Fatalf("oldest: %+v %v", g, err)
	}
	d2.Pop()
	g, err := d2.oldest()
	if err == nil || g == nil || g.Key != Key("p", "a", "r", 4) || g.Events != 7 {
		t.Fatalf("a damaged body: %+v, %v", g, err)
	}
	d2.Pop()
	if names, _ := spoolFiles(t, dir); len(names) != 0 || d2.Len() != 0 || d2.Bytes() != 0 {
		t.Fatalf("left: %v, %d segments, %d bytes", names, d2.Len(), d2.Bytes())
	}
}

// Spool file names, and those of the files being written.
func TestParseSpoolName(t *testing.T) {
	for name, want := range map[string]uint64{
		"000000000001.seg": 1, "000000000042.seg": 42, "1000000000000.seg": 1e12,
		"000000000000.seg": 0, "00000000001.seg": 0, "000000000001.seg.tmp": 0, "00000000000x.seg": 0, ".000000000001.seg.42": 0,
	} {
		n, ok := parseSpoolName(name)
		if ok != (want != 0) || n != want {
			t.Errorf("parseSpoolName(%q) = %d, %v; want %d", name, n, ok, want)
		}
	}
	if spoolName(42) != "000000000042.seg" {
		t.Errorf("spoolName(42) = %q", spoolName(42))
	}
	for name, want := range map[string]bool{
		".000000000001.seg.42": true, ".1000000000000.seg.x": true,
		"000000000001.seg": false, ".000000000001.seg": false, ".notes.seg.1": false, ".x": false,
	} {
		if isSpoolTemp(name) != want {
			t.Errorf("isSpoolTemp(%q) = %v", name, !want)
		}
	}
}
