package eventlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// File naming: DIR/NODE/events-NNNNNN.jsonl, NNNNNN a sequence number of
// at least six digits (more after 999999), starting at 1.
const (
	filePrefix = "events-"
	fileSuffix = ".jsonl"
	seqDigits  = 6
)

// NodeDir returns the directory a node's files go to: dir joined with the
// node name made safe for a file name (every byte outside
// [A-Za-z0-9._-] replaced with '_'; "", "." and ".." become "_", "_" and
// "__"). Use it to find the files of a node whose [Log] you do not hold.
func NodeDir(dir, node string) string {
	return filepath.Join(dir, sanitize(node))
}

func sanitize(node string) string {
	b := []byte(node)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			b[i] = '_'
		}
	}
	switch s := string(b); s {
	case "":
		return "_"
	case ".", "..":
		// A node named ".." must not write into DIR's parent.
		return strings.Repeat("_", len(s))
	default:
		return s
	}
}

func seqPath(dir string, seq int) string {
	return filepath.Join(dir, fmt.Sprintf("%s%0*d%s", filePrefix, seqDigits, seq, fileSuffix))
}

// parseSeq returns the sequence number of a file name of the trail.
func parseSeq(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, filePrefix)
	if !ok {
		return 0, false
	}
	digits, ok = strings.CutSuffix(digits, fileSuffix)
	if !ok || len(digits) < seqDigits {
		return 0, false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 {
		return 0, false
	}
	return n, true
}

// listSeqs returns the sequence numbers of the trail's files in dir,
// ascending. Other entries are ignored.
func listSeqs(dir string) ([]int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var seqs []int
	for _, e := range entries {
		if n, ok := parseSeq(e.Name()); ok && e.Type().IsRegular() {
			seqs = append(seqs, n)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// openFile opens path for appending, creating it if needed, and returns
// its size. A file longer than size is cut back to it: after a failed
// write, the part of a line that reached the file goes before writing goes
// on. A shorter file (truncated or removed by something else) is kept as
// it is.
func openFile(path string, size int64) (io.WriteCloser, int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	cur := st.Size()
	if cur > size {
		if err := f.Truncate(size); err != nil {
			f.Close()
			return nil, 0, err
		}
		cur = size
	}
	return f, cur, nil
}

// batchBytes is how many bytes of lines the writer gathers before it
// writes them, when the queue holds that many.
const batchBytes = 64 << 10

// writer owns the files of one node. It is used by Run's goroutine only.
type writer struct {
	dir      string
	maxBytes int64
	retain   int
	open     func(path string, size int64) (io.WriteCloser, int64, error)
	fail     func(op string, err error, lost int) // counts and warns
	rotated  func()                               // counts a rotation

	f     io.WriteCloser // the current file; nil when not open
	seq   int            // the current file's number; 0 before the first
	fresh bool           // seq is a new file: apply retention once opened
	size  int64          // bytes of whole lines written to file seq

	buf     []byte   // lines not yet written
	pending int      // events in buf
	line    []byte   // scratch: the line being encoded
	keys    []string // scratch: field keys
	err     error    // first failure since the last takeErr
}

// mkdir creates the node's directory; lost is the number of events a
// failure loses.
func (w *writer) mkdir(lost int) bool {
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		w.failed("mkdir", err, lost)
		return false
	}
	return true
}

func (w *writer) failed(op string, err error, lost int) {
	if w.err == nil {
		w.err = fmt.Errorf("eventlog: %s: %w", op, err)
	}
	w.fail(op, err, lost)
}

// takeErr returns the first failure since the previous call.
func (w *writer) takeErr() error {
	err := w.err
	w.err = nil
	return err
}

// add encodes e and queues its line, writing first what is buffered when
// the line would take the current file past maxBytes (and then starting
// the next file).
func (w *writer) add(e *Event) {
	w.line, w.keys = appendEvent(w.line[:0], e, w.keys)
	w.line = append(w.line, '\n')
	used := w.size + int64(len(w.buf))
	if used > 0 && used+int64(len(w.line)) > w.maxBytes {
		w.flush()
		w.rotate()
	}
	w.buf = append(w.buf, w.line...)
	w.pending++
	if len(w.buf) >= batchBytes {
		w.flush()
	}
}

// flush writes the buffered lines to the current file, opening it first if
// needed. On failure the lines are lost (counted) and the file is closed;
// the next flush reopens it and cuts off any partial line.
func (w *writer) flush() {
	if len(w.buf) == 0 {
		return
	}
	lost := w.pending
	defer func() { w.buf, w.pending = w.buf[:0], 0 }()
	if !w.ensureOpen(lost) {
		return
	}
	n, err := w.f.Write(w.buf)
	if err == nil && n < len(w.buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		w.failed("write", err, lost)
		w.f.Close() // the write error is the one worth reporting
		w.f = nil
		return
	}
	w.size += int64(n)
}

// ensureOpen opens the current file, choosing its number first when there
// is none yet: one past the highest number in the directory, so that a
// restart continues the sequence. lost is the number of events a failure
// loses.
func (w *writer) ensureOpen(lost int) bool {
	if w.f != nil {
		return true
	}
	if !w.mkdir(lost) {
		return false
	}
	if w.fresh && w.seq != 0 {
		// Never truncate a file that is already there (two nodes given
		// the same name, or files copied in): number afresh instead.
		if _, err := os.Lstat(seqPath(w.dir, w.seq)); err == nil {
			w.seq = 0
		}
	}
	if w.seq == 0 {
		seqs, err := listSeqs(w.dir)
		if err != nil {
			w.failed("list", err, lost)
			return false
		}
		w.seq, w.size, w.fresh = 1, 0, true
		if len(seqs) > 0 {
			w.seq = seqs[len(seqs)-1] + 1
		}
	}
	f, size, err := w.open(seqPath(w.dir, w.seq), w.size)
	if err != nil {
		w.failed("create", err, lost)
		return false
	}
	w.f, w.size = f, size
	if w.fresh {
		w.fresh = false
		w.prune()
	}
	return true
}

// rotate closes the current file and moves on to the next number; the
// next flush creates it.
func (w *writer) rotate() {
	if w.seq == 0 {
		return // no file was chosen (the directory failed): nothing to rotate
	}
	w.closeFile()
	w.seq++
	w.size, w.fresh = 0, true
	w.rotated()
}

// prune deletes the oldest files beyond retain, the current one included
// in the count.
func (w *writer) prune() {
	seqs, err := listSeqs(w.dir)
	if err != nil {
		w.failed("list", err, 0)
		return
	}
	for len(seqs) > w.retain && seqs[0] < w.seq {
		if err := os.Remove(seqPath(w.dir, seqs[0])); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.failed("remove", err, 0)
		}
		seqs = seqs[1:]
	}
}

// closeFile closes the current file, if open.
func (w *writer) closeFile() {
	if w.f == nil {
		return
	}
	if err := w.f.Close(); err != nil {
		w.failed("close", err, 0)
	}
	w.f = nil
}

// shutdown writes what is buffered, syncs and closes the file.
func (w *writer) shutdown() {
	w.flush()
	if s, ok := w.f.(interface{ Sync() error }); ok {
		if err := s.Sync(); err != nil {
			w.failed("sync", err, 0)
		}
	}
	w.closeFile()
}
