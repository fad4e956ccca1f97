package objstore

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// SinkConfig shapes a Sink.
type SinkConfig struct {
	// Prefix and Run place the segments (Key).
	Prefix, Run string
	// SegmentBytes and SegmentAge cut a set's segment when it reaches
	// that size, or when its first event is that old.
	SegmentBytes int
	SegmentAge   time.Duration
	// SpoolBytes bounds the segments waiting for the store; Queue the
	// events waiting for the sink's goroutine. Beyond either, events are
	// dropped, counted and logged.
	SpoolBytes int
	Queue      int
	// SpoolDir, when not "", keeps the spool in files in that directory
	// (created if needed) rather than in memory: the segments cut and
	// not uploaded survive a stop or a crash, and the next Run on the
	// same directory uploads them first, in order, under their keys.
	// SpoolBytes bounds the files' bytes. One process per directory. A
	// directory that cannot be opened is logged, and the spool is in
	// memory. Default "": in memory.
	SpoolDir string
	// PutTimeout bounds one upload; FinalTimeout the uploads at shutdown.
	PutTimeout, FinalTimeout time.Duration
}

// DefaultSinkConfig is what an incident review needs: segments of at most
// 1 MiB or 10 s (a crash loses at most the last 10 s), 64 MiB spooled
// (hours of a busy fleet's events through an outage), 8192 events queued.
func DefaultSinkConfig() SinkConfig {
	return SinkConfig{SegmentBytes: 1 << 20, SegmentAge: 10 * time.Second, SpoolBytes: 64 << 20, Queue: 8192,
		PutTimeout: 30 * time.Second, FinalTimeout: 5 * time.Second}
}

type sinkLine struct {
	set  string
	line []byte
}

// Sink uploads a node's audit events to a Store as segments, in order,
// from one goroutine (Run). Write never blocks: an event that finds the
// queue full is dropped and counted, and so is a segment that finds the
// spool full while the store is unreachable. The spool is in memory, or
// in SpoolDir's files, which the next Run on it uploads first. Safe for
// concurrent use.
type Sink struct {
	cfg   SinkConfig
	store Store
	log   *zap.Logger
	in    chan sinkLine

	droppedEvents atomic.Uint64
	uploaded      atomic.Uint64
	spooled       atomic.Int64
	warned        atomic.Bool // a queue-full drop was logged since the last upload
}

// NewSink returns a Sink writing to store; log gets its warnings (nil: none).
func NewSink(cfg SinkConfig, store Store, log *zap.Logger) *Sink {
	if log == nil {
		log = zap.NewNop()
	}
	return &Sink{cfg: cfg, store: store, log: log, in: make(chan sinkLine, max(cfg.Queue, 1))}
}

// Write queues one event's JSON line (without newline) of set ("" for
// none). It copies line and never blocks: false when the event was
// dropped.
func (s *Sink) Write(set string, line []byte) bool {
	select {
	case s.in <- sinkLine{set: set, line: append([]byte(nil), line...)}:
		return true
	default:
		s.droppedEvents.Add(1)
		if !s.warned.Swap(true) {
			s.log.Warn("audit sink: queue full, dropping events (the store is slow or unreachable)", zap.Int("queue", s.cfg.Queue))
		}
		return false
	}
}

// Dropped counts the events dropped; Uploaded the segments written;
// Spooled the bytes waiting for the store.
func (s *Sink) Dropped() uint64  { return s.droppedEvents.Load() }
func (s *Sink) Uploaded() uint64 { return s.uploaded.Load() }
func (s *Sink) Spooled() int64   { return s.spooled.Load() }

// Run cuts and uploads segments until ctx ends, then closes the open
// segments and uploads what it can within FinalTimeout.
func (s *Sink) Run(ctx context.Context) {
	seg := &Segmenter{Prefix: s.cfg.Prefix, Run: s.cfg.Run, MaxBytes: s.cfg.SegmentBytes, MaxAge: s.cfg.SegmentAge}
	spool := s.openSpool()
	s.spooled.Store(int64(spool.Bytes()))
	var (
		retryAt time.Time
		backoff time.Duration
		failing bool
	)
	push := func(g *Segment) {
		switch err := spool.put(g); {
		case errors.Is(err, errSpoolFull):
			s.droppedEvents.Add(uint64(g.Events))
			s.log.Warn("audit sink: spool full while the store is unreachable; segment dropped",
				zap.String("key", g.Key), zap.Int("events", g.Events), zap.Int("spool_bytes", s.cfg.SpoolBytes))
		case err != nil:
			s.droppedEvents.Add(uint64(g.Events))
			s.log.Warn("audit sink: segment dropped: it could not be written to the spool",
				zap.String("key", g.Key), zap.Int("events", g.Events), zap.Error(err))
		}
		s.spooled.Store(int64(spool.Bytes()))
	}
	upload := func(ctx context.Context, now time.Time) {
		for !now.Before(retryAt) {
			g, err := spool.oldest()
			if g == nil {
				return
			}
			if err != nil {
				s.droppedEvents.Add(uint64(g.Events))
				s.log.Warn("audit sink: spooled segment dropped: it could not be read back", zap.String("key", g.Key),
					zap.Int("events", g.Events), zap.Error(err))
				spool.Pop()
				s.spooled.Store(int64(spool.Bytes()))
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, s.cfg.PutTimeout)
			err = s.store.Put(pctx, g.Key, g.Body)
			cancel()
			if err != nil {
				backoff = min(max(2*backoff, 500*time.Millisecond), 30*time.Second)
				retryAt = time.Now().Add(backoff)
				if !failing {
					s.log.Warn("audit sink: the object store is unreachable; spooling segments until it is back",
						zap.Error(err), zap.Int("spooled_segments", spool.Len()))
				}
				failing = true
				return
			}
			spool.Pop()
			s.uploaded.Add(1)
			s.spooled.Store(int64(spool.Bytes()))
			s.warned.Store(false)
			if failing {
				s.log.Info("audit sink: the object store is back; uploading the spooled segments in order", zap.Int("spooled_segments", spool.Len()+1))
				failing = false
			}
			backoff, retryAt = 0, time.Time{}
		}
	}
	seqs := map[string]uint64{}
	take := func(l sinkLine) {
		if g := seg.Add(l.set, numbered(l.line, &seqs, l.set), time.Now()); g != nil {
			push(g)
		}
	}
	tick := time.NewTicker(min(s.cfg.SegmentAge/4, 250*time.Millisecond) + time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case l := <-s.in:
			take(l)
		case <-tick.C:
		case <-ctx.Done():
			s.drain(take)
			for _, g := range seg.Flush() {
				push(g)
			}
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.FinalTimeout)
			defer cancel()
			retryAt = time.Time{}
			upload(fctx, time.Now())
			if n := spool.Len(); n > 0 {
				if _, ok := spool.(*dirSpool); ok {
					s.log.Warn("audit sink: stopping with segments not uploaded; the next run uploads them from the spool directory",
						zap.Int("segments", n), zap.String("dir", s.cfg.SpoolDir))
					return
				}
				s.log.Warn("audit sink: stopping with segments not uploaded", zap.Int("segments", n))
			}
			return
		}
		now := time.Now()
		for _, g := range seg.Due(now) {
			push(g)
		}
		upload(ctx, now)
	}
}

// openSpool opens the spool in SpoolDir, or in memory without one or
// when the directory is unusable: the audit trail is best effort and
// never stops the sink.
func (s *Sink) openSpool() spooler {
	if s.cfg.SpoolDir == "" {
		return &Spool{MaxBytes: s.cfg.SpoolBytes}
	}
	d, dropped, err := openDirSpool(s.cfg.SpoolDir, s.cfg.SpoolBytes, s.log)
	if err != nil {
		s.log.Warn("audit sink: the spool directory is unusable; spooling in memory", zap.String("dir", s.cfg.SpoolDir), zap.Error(err))
		return &Spool{MaxBytes: s.cfg.SpoolBytes}
	}
	s.droppedEvents.Add(uint64(dropped))
	return d
}

// drain takes the events queued before the stop.
func (s *Sink) drain(take func(sinkLine)) {
	for {
		select {
		case l := <-s.in:
			take(l)
		default:
			return
		}
	}
}

// numbered puts the event's sequence number within its set's run first in
// its JSON object ({"seq":N,...}), so that a reader finds every event of
// a run in order and sees a gap (an event dropped) for what it is. A line
// that is not an object is left as it is.
func numbered(line []byte, seqs *map[string]uint64, set string) []byte {
	if len(line) < 2 || line[0] != '{' {
		return line
	}
	(*seqs)[set]++
	out := make([]byte, 0, len(line)+24)
	out = append(out, `{"seq":`...)
	out = strconv.AppendUint(out, (*seqs)[set], 10)
	if line[1] != '}' {
		out = append(out, ',')
	}
	return append(out, line[1:]...)
}
