package eventlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// warnEvery is the least time between two warnings of one kind of failure.
const warnEvery = 10 * time.Second

// Options are the dependencies of a [Log]. The zero value works.
type Options struct {
	// Logger receives the warnings (a failed write, a full queue), at
	// most one per warnEvery (10 s) per kind of failure. If nil, nothing
	// is logged.
	Logger *zap.Logger
	// Registerer gets the keyway_audit_* metrics. If nil, they are not
	// registered.
	Registerer prometheus.Registerer
	// Now is the clock: event times and warning rate limits. If nil,
	// time.Now is used.
	Now func() time.Time
	// Sink, when not nil, gets every event's line (its JSON, without
	// newline) as well, from Emit: it must copy the line and never block
	// (the object-storage sink, eventlog/objstore).
	Sink LineSink
}

// LineSink takes events' lines, by the set they concern ("" for none).
type LineSink interface {
	Write(set string, line []byte) bool
}

// Log is one node's audit trail: the events in memory for [Log.Recent]
// and, when Config.Dir is set, in files written by [Log.Run].
//
// Emit, Record, Recent and Flush are safe for concurrent use by any number
// of goroutines; Run runs once at a time. A nil *Log discards events:
// Emit and Record do nothing, Recent returns nil, Flush returns nil.
// A Log must not be copied (go vet's copylocks check reports copies).
type Log struct {
	node   string
	dir    string // DIR/NODE; "" when files are off
	log    *zap.Logger
	now    func() time.Time
	m      *metrics
	queue  chan Event      // nil when files are off
	flushc chan chan error // Flush → Run

	// open opens a file for the writer; tests replace it to stall or fail
	// writes deterministically.
	open func(path string, size int64) (io.WriteCloser, int64, error)

	running atomic.Bool
	cfg     Config

	mu    sync.Mutex // guards the fields below; never held during I/O
	ring  []Event    // the last len(ring) events; next is where the next goes
	next  int
	count int
	warn  limiter                       // queue-full warnings
	kinds map[string]prometheus.Counter // keyway_audit_events_total by kind

	sink    LineSink // nil: none
	sinkBuf []byte   // the line given to sink, reused (the sink copies it)
}

// New validates cfg and returns a Log for node (the name written in every
// event's "node" and, made safe, the directory under cfg.Dir). It
// registers the metrics but does not touch the disk: [Log.Run] does.
func New(cfg Config, node string, opts Options) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("eventlog: %w", err)
	}
	if node == "" {
		return nil, errors.New("eventlog: empty node name")
	}
	l := &Log{
		node:   node,
		log:    opts.Logger,
		now:    opts.Now,
		m:      newMetrics(),
		flushc: make(chan chan error),
		open:   openFile,
		cfg:    cfg,
		ring:   make([]Event, cfg.Memory),
		warn:   newLimiter(),
		kinds:  map[string]prometheus.Counter{},
		sink:   opts.Sink,
	}
	if l.log == nil {
		l.log = zap.NewNop()
	}
	if l.now == nil {
		l.now = time.Now
	}
	if cfg.Dir != "" {
		l.dir = NodeDir(cfg.Dir, node)
		l.queue = make(chan Event, cfg.Buffer)
	}
	if opts.Registerer != nil {
		if err := l.m.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("eventlog: register metrics: %w", err)
		}
	}
	return l, nil
}

// Path returns the directory the log's files go to (DIR/NODE), or "" when
// files are off.
func (l *Log) Path() string {
	if l == nil {
		return ""
	}
	return l.dir
}

// Emit records e. It never waits for I/O: it sets e.Time to the log's
// clock if zero (and converts it to UTC), sets e.Node, keeps e in memory
// for Recent, and queues it for Run. When the queue is full (the writer
// is stuck, slow or not running) the event is not written to a file; it
// is counted in keyway_audit_dropped_total{reason="queue_full"} and a
// warning is logged (rate-limited). Emit only holds a mutex for a few
// memory operations.
//
// The log keeps e.Fields and the values in it: do not modify them after
// the call. The writer encodes them later, on its own goroutine.
func (l *Log) Emit(e Event) {
	if l == nil {
		return
	}
	var now time.Time
	if e.Time.IsZero() {
		now = l.now()
		e.Time = now
	}
	e.Time = e.Time.UTC() // also drops the monotonic reading
	e.Node = l.node

	dropped, warn, suppressed := false, false, 0
	l.mu.Lock()
	if n := len(l.ring); n > 0 {
		l.ring[l.next] = e
		if l.next++; l.next == n {
			l.next = 0
		}
		if l.count < n {
			l.count++
		}
	}
	// Sending under mu keeps the file's order identical to Recent's.
	if l.queue != nil {
		select {
		case l.queue <- e:
		default:
			dropped = true
			if now.IsZero() {
				now = l.now()
			}
			warn, suppressed = l.warn.allow(dropQueueFull, now)
		}
	}
	if l.sink != nil {
		// Under mu too: the sink sees the events in Recent's order.
		b, _ := appendEvent(l.sinkBuf[:0], &e, nil)
		l.sinkBuf = b
		l.sink.Write(e.Set, b)
	}
	c := l.kinds[e.Kind]
	if c == nil {
		// Resolve the label child once per kind: the lookup costs more
		// than the rest of Emit.
		c = l.m.kind(e.Kind)
		l.kinds[e.Kind] = c
	}
	l.mu.Unlock()

	c.Inc()
	if dropped {
		l.m.droppedQueue.Inc()
		if warn {
			l.log.Warn("audit queue full, events not written to the file",
				zap.String("kind", e.Kind), zap.Int("buffer", cap(l.queue)),
				zap.Int("suppressed", suppressed))
		}
	}
}

// Record is Emit(Event{Kind: kind, Set: set, Replica: replica, Fields:
// fields}). Its signature uses only built-in types so that a package that
// may not import eventlog (design.md's import direction) can declare
//
//	type Recorder interface {
//		Record(kind, set, replica string, fields map[string]any)
//	}
//
// and be given a *Log.
func (l *Log) Record(kind, set, replica string, fields map[string]any) {
	l.Emit(Event{Kind: kind, Set: set, Replica: replica, Fields: fields})
}

// Recent returns the events kept in memory, oldest first, that are not
// before since (a zero since keeps all) and whose kind is in kinds (empty
// keeps all kinds): the newest limit of them when limit > 0, all of them
// otherwise. The returned slice is the caller's; the events' Fields maps
// are shared with the log and must not be modified. Recent scans under the
// mutex Emit takes: with the default Memory (1000), a few microseconds.
func (l *Log) Recent(since time.Time, kinds []string, limit int) []Event {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	n := len(l.ring)
	for i := 1; i <= l.count; i++ { // newest first
		e := &l.ring[(l.next-i+n)%n]
		if !since.IsZero() && e.Time.Before(since) {
			continue
		}
		if len(kinds) > 0 && !slices.Contains(kinds, e.Kind) {
			continue
		}
		out = append(out, *e)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	slices.Reverse(out)
	return out
}

// Flush waits until every event emitted before the call has been handed
// to the operating system (written, not synced), or ctx is done. It needs
// Run to be running. It returns the first file error since the previous
// Flush (or since Run started), which, like every file error, has also
// been counted and logged; nil means no file operation failed since then
// (events dropped because the queue was full are counted, not returned).
// It returns nil at once when files are off.
func (l *Log) Flush(ctx context.Context) error {
	if l == nil || l.queue == nil {
		return nil
	}
	c := make(chan error, 1)
	select {
	case l.flushc <- c:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-c:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run is the single writer: it creates the node's directory, then writes
// each queued event as one line to DIR/NODE/events-NNNNNN.jsonl, starting
// a new file when the next line would take the current one past
// MaxFileBytes and deleting the oldest beyond Retain. The first file it
// writes is numbered one past the highest already in the directory, so a
// restart never appends to an old file. Lines are written in batches,
// whenever the queue is empty and every 64 KiB in a burst; files are
// synced only on shutdown.
//
// File errors are counted and logged, never returned: the events are lost
// to the file (counted as dropped), and the next batch tries again. When
// ctx is done Run writes what is queued, syncs and closes the file, and
// returns nil. With files off it only waits for ctx. It returns an error
// if called while already running.
func (l *Log) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("eventlog: Run is already running")
	}
	defer l.running.Store(false)
	if l.queue == nil {
		<-ctx.Done()
		return nil
	}
	wl := newLimiter()
	w := &writer{
		dir:      l.dir,
		maxBytes: l.cfg.MaxFileBytes,
		retain:   l.cfg.Retain,
		open:     l.open,
		rotated:  l.m.rotations.Inc,
		fail: func(op string, err error, lost int) {
			l.m.writeErrors.Inc()
			if lost > 0 {
				l.m.droppedWrite.Add(float64(lost))
			}
			if ok, suppressed := wl.allow(op, l.now()); ok {
				l.log.Warn("audit trail file operation failed, events not written",
					zap.String("op", op), zap.Error(err),
					zap.Int("lost_events", lost), zap.Int("suppressed", suppressed))
			}
		},
	}
	w.mkdir(0)
	defer w.shutdown()
	for !l.step(ctx, w) {
	}
	return nil
}

// step waits for one thing to do and does it; it reports whether ctx is
// done. A panic (a bug) is logged with its stack and loses the batch
// being written, but not the writer.
func (l *Log) step(ctx context.Context, w *writer) (done bool) {
	var flushed chan error
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("audit writer panicked", zap.Any("panic", r), zap.Stack("stack"))
			w.buf, w.pending = w.buf[:0], 0
			if flushed != nil {
				select { // cap 1: full only if the answer went out already
				case flushed <- fmt.Errorf("eventlog: writer panicked: %v", r):
				default:
				}
			}
		}
	}()
	select {
	case e := <-l.queue:
		w.add(&e)
		l.drain(w)
		w.flush()
	case flushed = <-l.flushc:
		l.drain(w)
		w.flush()
		flushed <- w.takeErr()
	case <-ctx.Done():
		l.drain(w)
		return true
	}
	return false
}

// drain adds what the queue holds, at most one queue's worth so that
// emitters cannot keep it busy forever.
func (l *Log) drain(w *writer) {
	for range cap(l.queue) {
		select {
		case e := <-l.queue:
			w.add(&e)
		default:
			return
		}
	}
}

// limiter allows one warning per kind of failure per warnEvery and counts
// the ones it suppresses. It is not safe for concurrent use.
type limiter struct {
	last       map[string]time.Time
	suppressed map[string]int
}

func newLimiter() limiter {
	return limiter{last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// allow reports whether a warning of kind may be logged at now, and how
// many were suppressed since the last one.
func (r *limiter) allow(kind string, now time.Time) (bool, int) {
	if last, ok := r.last[kind]; ok && now.Sub(last) < warnEvery && now.Sub(last) >= 0 {
		r.suppressed[kind]++
		return false, 0
	}
	n := r.suppressed[kind]
	r.suppressed[kind] = 0
	r.last[kind] = now
	return true, n
}
