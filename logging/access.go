package logging

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// accessBufferSize is the size of each of the access log's two buffers:
// while the flusher writes one, requests fill the other; a line that finds
// both in use is dropped and counted. At about 300 bytes a line, 1 MiB
// holds 3500 lines: a third of a second at 10,000 requests a second, the
// time a disk may stall (or the flusher wait for a core) before a line is
// lost, for 2 MiB of memory.
const accessBufferSize = 1 << 20

// flushInterval bounds how long a line waits in the buffer.
const flushInterval = time.Second

// Reasons a line is dropped (keyway_access_log_dropped_total's label).
const (
	dropBufferFull = iota // both buffers in use: the output is slower than the requests
	dropWriteError        // the write failed (disk full, closed pipe)
	dropReasons
)

var dropReasonNames = [dropReasons]string{"buffer_full", "write_error"}

// AccessLog writes the access log: each Write appends one line to a
// bounded in-memory buffer, and a background flusher writes the buffer out
// at least every second, when it fills, on Reopen and on Close. A request
// never waits for the disk: a line that finds no room is dropped and
// counted (keyway_access_log_dropped_total{reason="buffer_full"}). Lines
// are written whole and in the order their Writes returned.
//
// Build it with [New] (log.access_log); it is safe for concurrent use and
// must not be copied. The flusher starts with the first Write; Close stops
// it.
type AccessLog struct {
	// The buffers, guarded by mu. There are two: cur, which Write fills,
	// and one other that is either spare (empty, ready), full (handed to
	// the flusher) or held by the flusher while it writes (both nil).
	mu     sync.Mutex
	cur    []byte
	spare  []byte
	full   []byte
	closed bool

	// The output, guarded by outMu, which serializes flushes, Reopen and
	// Close. file is nil when the output is stdout.
	outMu   sync.Mutex
	out     io.Writer
	file    *os.File
	path    string
	failing bool // the last write failed (logged once, not per write)

	keyFn func(dst, key []byte) []byte // nil: the key is omitted

	log       *zap.Logger
	newTicker func(time.Duration) (<-chan time.Time, func())
	kick      chan struct{} // a buffer is full: flush now
	stop      chan struct{} // closed by Close
	done      chan struct{} // closed when the flusher returns
	started   bool          // the flusher runs (set inside startOnce)
	startOnce sync.Once
	closeOnce sync.Once

	dropped [dropReasons]atomic.Uint64
	reopens [2]atomic.Uint64 // success, failure

	droppedDesc, reopensDesc *prometheus.Desc
}

// accessOptions are newAccessLog's dependencies; tests replace the ticker.
type accessOptions struct {
	stdout    io.Writer
	log       *zap.Logger
	lookup    func(string) (string, bool) // nil: os.LookupEnv
	newTicker func(time.Duration) (<-chan time.Time, func())
	size      int // of each buffer; 0: accessBufferSize
}

// newAccessLog opens the access log's output (a file in append mode, or
// stdout) and reads the key secret.
func newAccessLog(cfg AccessConfig, o accessOptions) (*AccessLog, error) {
	size := o.size
	if size == 0 {
		size = accessBufferSize
	}
	a := &AccessLog{
		cur: make([]byte, 0, size), spare: make([]byte, 0, size),
		out: o.stdout, log: o.log, newTicker: o.newTicker,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		droppedDesc: prometheus.NewDesc("keyway_access_log_dropped_total",
			"Access-log lines lost, by reason: buffer_full (the output was slower than the requests for longer than the buffer lasts; requests never wait for it), write_error (the write failed; the error is logged).",
			[]string{"reason"}, nil),
		reopensDesc: prometheus.NewDesc("keyway_access_log_reopens_total",
			"Reopenings of the access log file (SIGUSR1, after a rotation), by result: success, or failure (the old file stays in use; the error is logged).",
			[]string{"result"}, nil),
	}
	if a.log == nil {
		a.log = zap.NewNop()
	}
	if a.newTicker == nil {
		a.newTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	switch cfg.Key {
	case KeyPlain:
		a.keyFn = func(dst, key []byte) []byte { return append(dst, key...) }
	case KeyHMAC:
		secret, err := cfg.secret(o.lookup)
		if err != nil {
			return nil, err
		}
		a.keyFn = newKeyHasher(secret).appendKey
	}
	if cfg.Path != "" && cfg.Path != "stdout" {
		f, err := openAccessFile(cfg.Path)
		if err != nil {
			return nil, fmt.Errorf("access.path: %w", err)
		}
		a.out, a.file, a.path = f, f, cfg.Path
	}
	if a.out == nil {
		a.out = io.Discard
	}
	return a, nil
}

// openAccessFile opens path for appending, creating it if needed. O_APPEND
// also keeps lines whole at the end of a file that logrotate's
// copytruncate mode truncated under us.
func openAccessFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
}

// Write appends one line (the caller ends it with '\n') to the buffer. It
// never blocks on I/O and does not retain line. It always reports
// success: a dropped line is counted, not returned as an error, since the
// request it describes has been answered. A line longer than a buffer is
// dropped.
func (a *AccessLog) Write(line []byte) (int, error) {
	a.startOnce.Do(a.start)
	a.mu.Lock()
	if a.closed {
		// keyway closes the log after its last request: nothing to count.
		a.mu.Unlock()
		return len(line), nil
	}
	if len(a.cur)+len(line) > cap(a.cur) {
		if a.spare == nil || len(line) > cap(a.spare) {
			// The flusher still holds the other buffer (it is writing,
			// or has not taken the full one yet): the output is too slow.
			a.mu.Unlock()
			a.dropped[dropBufferFull].Add(1)
			return len(line), nil
		}
		a.full, a.cur, a.spare = a.cur, a.spare, nil
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
	a.cur = append(a.cur, line...)
	a.mu.Unlock()
	return len(line), nil
}

// KeyAppender returns the function that appends the form of a request's key
// the log shows (its HMAC, or the key itself) to dst, or nil when the key
// is omitted (log.access.key).
func (a *AccessLog) KeyAppender() func(dst, key []byte) []byte { return a.keyFn }

// start runs the flusher, unless Close came first.
func (a *AccessLog) start() {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return
	}
	a.started = true
	tick, stopTick := a.newTicker(flushInterval)
	go func() {
		defer close(a.done)
		defer stopTick()
		for {
			select {
			case <-a.stop:
				return
			case <-tick:
			case <-a.kick:
			}
			a.flushOnce()
		}
	}()
}

// flushOnce writes what is buffered: the full buffer if there is one, and
// then what the current buffer holds at that moment (at most twice, so
// that a steady stream of requests cannot keep the flusher here).
func (a *AccessLog) flushOnce() {
	defer func() {
		if v := recover(); v != nil {
			a.log.Error("panic in the access log's flusher", zap.Any("panic", v), zap.ByteString("stack", debug.Stack()))
		}
	}()
	a.outMu.Lock()
	defer a.outMu.Unlock()
	for range 2 {
		if !a.flushLocked() {
			return
		}
	}
}

// flushLocked takes one buffer to write (the full one, else the current
// one if it holds anything), writes it and gives it back as the spare. It
// reports whether it wrote anything. outMu must be held.
func (a *AccessLog) flushLocked() bool {
	a.mu.Lock()
	buf := a.full
	a.full = nil
	if buf == nil && len(a.cur) > 0 && a.spare != nil {
		buf, a.cur, a.spare = a.cur, a.spare, nil
	}
	a.mu.Unlock()
	if buf == nil {
		return false
	}
	a.writeOut(buf)
	a.mu.Lock()
	a.spare = buf[:0]
	a.mu.Unlock()
	return true
}

// writeOut writes buf to the output; lines it could not write are counted
// and the first failure of a run is logged. outMu must be held.
func (a *AccessLog) writeOut(buf []byte) {
	n, err := a.out.Write(buf)
	if err == nil && n < len(buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		lost := bytes.Count(buf[n:], []byte{'\n'})
		a.dropped[dropWriteError].Add(uint64(lost))
		if !a.failing {
			a.failing = true
			a.log.Error("access log write failed; lines are lost until it succeeds again (keyway_access_log_dropped_total{reason=\"write_error\"})",
				zap.String("path", a.path), zap.Int("lost_lines", lost), zap.Error(err))
		}
		return
	}
	if a.failing {
		a.failing = false
		a.log.Info("access log writes succeed again", zap.String("path", a.path))
	}
}

// Reopen writes out what is buffered to the current file, then opens the
// file at the configured path again and writes there from now on: after
// logrotate (create mode) renamed the file, the new lines go to a new file
// of the old name. Call it on SIGUSR1. It waits for a write in progress.
// On an error the old file stays in use. With stdout it does nothing.
func (a *AccessLog) Reopen() error {
	if a.path == "" {
		return nil
	}
	a.outMu.Lock()
	defer a.outMu.Unlock()
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil
	}
	for range 2 {
		if !a.flushLocked() {
			break
		}
	}
	f, err := openAccessFile(a.path)
	if err != nil {
		a.reopens[1].Add(1)
		a.log.Error("access log not reopened; writing on to the old file", zap.String("path", a.path), zap.Error(err))
		return fmt.Errorf("reopen access log: %w", err)
	}
	old := a.file
	a.out, a.file = f, f
	a.reopens[0].Add(1)
	if err := old.Close(); err != nil {
		a.log.Warn("closing the old access log file failed", zap.String("path", a.path), zap.Error(err))
	}
	a.log.Info("access log reopened", zap.String("path", a.path))
	return nil
}

// Close stops the flusher, writes out every buffered line and closes the
// file. Later Writes are dropped. It is idempotent.
func (a *AccessLog) Close() error {
	var err error
	a.closeOnce.Do(func() {
		a.mu.Lock()
		a.closed = true
		a.mu.Unlock()
		a.startOnce.Do(func() {}) // a later Write starts no flusher
		if a.started {
			close(a.stop)
			<-a.done
		}
		a.outMu.Lock()
		defer a.outMu.Unlock()
		for a.flushLocked() {
		}
		if a.file != nil {
			err = a.file.Close()
		}
	})
	return err
}

// Dropped returns how many lines were dropped because the buffer was full
// and because a write failed.
func (a *AccessLog) Dropped() (bufferFull, writeError uint64) {
	return a.dropped[dropBufferFull].Load(), a.dropped[dropWriteError].Load()
}

// Describe implements prometheus.Collector.
func (a *AccessLog) Describe(ch chan<- *prometheus.Desc) {
	ch <- a.droppedDesc
	ch <- a.reopensDesc
}

// Collect implements prometheus.Collector.
func (a *AccessLog) Collect(ch chan<- prometheus.Metric) {
	for i, name := range dropReasonNames {
		ch <- prometheus.MustNewConstMetric(a.droppedDesc, prometheus.CounterValue, float64(a.dropped[i].Load()), name)
	}
	ch <- prometheus.MustNewConstMetric(a.reopensDesc, prometheus.CounterValue, float64(a.reopens[0].Load()), "success")
	ch <- prometheus.MustNewConstMetric(a.reopensDesc, prometheus.CounterValue, float64(a.reopens[1].Load()), "failure")
}

var _ prometheus.Collector = (*AccessLog)(nil)

// keyHashLen is how many bytes of the HMAC are logged (16 hex digits):
// 64 bits make an accidental collision between two keys unlikely below
// billions of distinct keys, and keep lines short.
const keyHashLen = 8

// keyHasher computes truncated HMAC-SHA256s of keys with one secret. An
// HMAC, not a plain hash: keys are often short or guessable (customer
// numbers, order ids), and anyone can hash every candidate and compare;
// without the secret they cannot. Safe for concurrent use.
type keyHasher struct{ pool sync.Pool }

type keyHash struct {
	mac hash.Hash
	sum []byte
}

func newKeyHasher(secret []byte) *keyHasher {
	k := &keyHasher{}
	s := bytes.Clone(secret)
	k.pool.New = func() any { return &keyHash{mac: hmac.New(sha256.New, s), sum: make([]byte, 0, sha256.Size)} }
	return k
}

// appendKey appends the first keyHashLen bytes of HMAC-SHA256(secret,
// key), in lower-case hex, to dst.
func (k *keyHasher) appendKey(dst, key []byte) []byte {
	h := k.pool.Get().(*keyHash)
	h.mac.Reset()
	h.mac.Write(key)
	h.sum = h.mac.Sum(h.sum[:0])
	dst = hex.AppendEncode(dst, h.sum[:keyHashLen])
	k.pool.Put(h)
	return dst
}
