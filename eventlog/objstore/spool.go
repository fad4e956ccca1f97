package objstore

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"keyway/internal/atomicfile"
)

// spooler keeps the segments cut and not uploaded yet, oldest first,
// within a bound on their bytes. The sink's one goroutine owns it: no
// implementation is safe for concurrent use. *Spool keeps them in memory,
// *dirSpool in files that outlive the process.
type spooler interface {
	// put spools g after the others; errSpoolFull when it does not fit,
	// another error when it could not be kept. Either way it is not
	// spooled and the caller counts the drop.
	put(g *Segment) error
	// oldest returns the oldest spooled segment with its body, or nil.
	// An error means its body could not be read back: the segment
	// returned still carries its Key and Events, for the caller to count
	// the drop before it Pops it.
	oldest() (*Segment, error)
	// Pop removes the oldest spooled segment (uploaded, or unreadable).
	Pop()
	// Len and Bytes say what is spooled.
	Len() int
	Bytes() int
}

var (
	_ spooler = (*Spool)(nil)
	_ spooler = (*dirSpool)(nil)
)

// errSpoolFull is put's answer for a segment beyond the bound.
var errSpoolFull = errors.New("objstore: spool full")

// File naming in a spool directory. Each segment is one file,
// NNNNNNNNNNNN.seg: a number of at least twelve digits, from 1, that
// goes on from the highest found when a process opens the directory, so
// that the names sort in the order the segments were cut, across
// processes. A file's first line is a JSON header (spoolHeader) that
// records the segment's object key, the number of events and the
// length and CRC-32C of the body; the body (the segment's JSONL lines)
// follows. A file is written beside its name, as .NAME.RANDOM, and
// renamed once complete and synced (package atomicfile), so a name ending
// in .seg is a whole segment unless the disk lost it, and a .NAME.RANDOM
// one is a write a crash cut short. The key is in the header, not the
// name: with a long prefix or node name, an escaped key could exceed the
// 255 bytes a file name may have.
const (
	spoolSuffix    = ".seg"
	spoolDigits    = 12
	spoolHeaderMax = 64 << 10 // keys are short: a longer first line is not a header
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// spoolHeader is the first line of a spool file.
type spoolHeader struct {
	V      int    `json:"v"` // 1
	Key    string `json:"key"`
	Events int    `json:"events"`
	Bytes  int    `json:"bytes"`  // of the body
	CRC    uint32 `json:"crc32c"` // of the body
}

// spoolEntry is what a dirSpool keeps in memory of one file: never its
// body, so that memory does not grow with the spool.
type spoolEntry struct {
	name   string // in the directory
	key    string
	events int
	size   int // of the file, header included
}

// dirSpool is a spool in a directory of its own (see the file naming
// above). It bounds the bytes of its files, headers included, and reads a
// segment's body back only to upload it, keeping that one body until it
// is popped (a retry does not read it again). Not safe for concurrent
// use; one process per directory.
type dirSpool struct {
	dir      string
	maxBytes int
	log      *zap.Logger

	queue []spoolEntry
	bytes int
	next  uint64 // number of the next file
	front []byte // body of queue[0], once read; nil before
}

// openDirSpool opens the spool in dir, creating it if needed, with the
// segments an earlier process left there first, oldest first. Files that
// cannot be read as whole segments (a write cut short by a crash, a
// damaged header) are removed, with one warning for them all; so are the
// newest leftovers beyond maxBytes, whose events are returned as dropped.
// Files of other names are left alone. An error means the directory is
// unusable.
func openDirSpool(dir string, maxBytes int, log *zap.Logger) (d *dirSpool, dropped int, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	d = &dirSpool{dir: dir, maxBytes: maxBytes, log: log, next: 1}
	type leftover struct {
		n uint64
		e spoolEntry
	}
	var bad []string
	var found []leftover
	for _, e := range ents {
		name := e.Name()
		if isSpoolTemp(name) && !e.IsDir() {
			bad = append(bad, name)
			continue
		}
		n, ok := parseSpoolName(name)
		if !ok || e.IsDir() {
			continue
		}
		d.next = max(d.next, n+1)
		ent, err := readSpoolEntry(filepath.Join(dir, name))
		if err != nil {
			bad = append(bad, name)
			continue
		}
		found = append(found, leftover{n, ent})
	}
	if len(bad) > 0 {
		for _, name := range bad {
			_ = os.Remove(filepath.Join(dir, name))
		}
		log.Warn("audit sink: unreadable files in the spool directory skipped and removed (a write cut short by a crash, or damage)",
			zap.String("dir", dir), zap.Strings("files", bad))
	}
	// By number: names sort as numbers only up to twelve digits.
	slices.SortFunc(found, func(a, b leftover) int { return cmp.Compare(a.n, b.n) })
	var over, overEvents int
	for _, f := range found {
		ent := f.e
		if d.bytes+ent.size > maxBytes {
			// The bound holds across restarts: what an earlier process
			// left counts, and the newest that do not fit go, as a
			// segment that does not fit goes.
			_ = os.Remove(filepath.Join(dir, ent.name))
			over++
			overEvents += ent.events
			continue
		}
		d.queue = append(d.queue, ent)
		d.bytes += ent.size
	}
	if over > 0 {
		log.Warn("audit sink: segments left in the spool by an earlier run exceed spool_bytes; the newest dropped",
			zap.String("dir", dir), zap.Int("segments", over), zap.Int("events", overEvents), zap.Int("spool_bytes", maxBytes))
	}
	if len(d.queue) > 0 {
		log.Info("audit sink: uploading first the segments an earlier run left in the spool",
			zap.String("dir", dir), zap.Int("segments", len(d.queue)), zap.Int("bytes", d.bytes))
	}
	return d, overEvents, nil
}

func spoolName(n uint64) string {
	return fmt.Sprintf("%0*d%s", spoolDigits, n, spoolSuffix)
}

// parseSpoolName returns the number of a spool file's name.
func parseSpoolName(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, spoolSuffix)
	if !ok || len(digits) < spoolDigits {
		return 0, false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n < 1 {
		return 0, false
	}
	return n, true
}

// isSpoolTemp reports whether name is a spool file being written, or cut
// short by a crash: .NAME.RANDOM.
func isSpoolTemp(name string) bool {
	rest, ok := strings.CutPrefix(name, ".")
	i := strings.Index(rest, spoolSuffix+".")
	if !ok || i < 0 {
		return false
	}
	_, ok = parseSpoolName(rest[:i+len(spoolSuffix)])
	return ok
}

// readSpoolEntry reads a spool file's header and checks that the file
// holds the whole body it announces (the body's CRC is checked when it is
// read to be uploaded, so that opening a large spool reads little).
func readSpoolEntry(path string) (spoolEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return spoolEntry{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return spoolEntry{}, err
	}
	line, err := bufio.NewReaderSize(io.LimitReader(f, spoolHeaderMax), 4096).ReadBytes('\n')
	if err != nil {
		return spoolEntry{}, fmt.Errorf("read header: %w", err)
	}
	h, err := parseSpoolHeader(line)
	if err != nil {
		return spoolEntry{}, err
	}
	if int64(len(line)+h.Bytes) != st.Size() {
		return spoolEntry{}, fmt.Errorf("%d bytes, header says %d", st.Size(), len(line)+h.Bytes)
	}
	return spoolEntry{name: filepath.Base(path), key: h.Key, events: h.Events, size: int(st.Size())}, nil
}

func parseSpoolHeader(line []byte) (spoolHeader, error) {
	var h spoolHeader
	if err := json.Unmarshal(line, &h); err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	if h.V != 1 || h.Key == "" || h.Events < 0 || h.Bytes < 0 {
		return h, fmt.Errorf("header: not a version-1 segment header")
	}
	return h, nil
}

func (d *dirSpool) put(g *Segment) error {
	hdr, err := json.Marshal(spoolHeader{V: 1, Key: g.Key, Events: g.Events, Bytes: len(g.Body), CRC: crc32.Checksum(g.Body, castagnoli)})
	if err != nil {
		return err
	}
	hdr = append(hdr, '\n')
	size := len(hdr) + len(g.Body)
	if d.bytes+size > d.maxBytes {
		return errSpoolFull
	}
	name := spoolName(d.next)
	// One buffer for the header and the body: one segment, for the
	// time of the write.
	if err := atomicfile.Write(filepath.Join(d.dir, name), append(hdr, g.Body...)); err != nil {
		return err
	}
	d.next++
	if len(d.queue) == 0 {
		// The segment is uploaded next, most often right away: no need to
		// read back what is in hand.
		d.front = g.Body
	}
	d.queue = append(d.queue, spoolEntry{name: name, key: g.Key, events: g.Events, size: size})
	d.bytes += size
	return nil
}

func (d *dirSpool) oldest() (*Segment, error) {
	if len(d.queue) == 0 {
		return nil, nil
	}
	e := d.queue[0]
	g := &Segment{Key: e.key, Events: e.events}
	if d.front == nil {
		body, err := readSpoolBody(filepath.Join(d.dir, e.name), e.key)
		if err != nil {
			return g, fmt.Errorf("spool file %s: %w", e.name, err)
		}
		d.front = body
	}
	g.Body = d.front
	return g, nil
}

// readSpoolBody reads back the body of the spool file at path, checking
// it against its header.
func readSpoolBody(path, key string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	line, body, ok := bytes.Cut(b, []byte("\n"))
	if !ok {
		return nil, errors.New("no header")
	}
	h, err := parseSpoolHeader(line)
	switch {
	case err != nil:
		return nil, err
	case h.Key != key:
		return nil, fmt.Errorf("header names %q, not %q", h.Key, key)
	case len(body) != h.Bytes || crc32.Checksum(body, castagnoli) != h.CRC:
		return nil, errors.New("body damaged: its length or CRC differs from the header's")
	}
	return body, nil
}

func (d *dirSpool) Pop() {
	if len(d.queue) == 0 {
		return
	}
	e := d.queue[0]
	if err := os.Remove(filepath.Join(d.dir, e.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		// Left behind, it would be uploaded again by the next run: the
		// same key and body, which the store overwrites with themselves.
		d.log.Warn("audit sink: an uploaded segment's spool file could not be removed", zap.String("file", e.name), zap.Error(err))
	}
	d.bytes -= e.size
	d.queue[0] = spoolEntry{}
	d.queue = d.queue[1:]
	d.front = nil
}

func (d *dirSpool) Len() int   { return len(d.queue) }
func (d *dirSpool) Bytes() int { return d.bytes }
