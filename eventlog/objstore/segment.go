package objstore

import (
	"slices"
	"time"
)

// Segment is one object to upload: whole JSONL lines of one set's events
// in one run.
type Segment struct {
	Key    string
	Set    string
	Seq    int
	Body   []byte
	Events int
	// Opened is when its first event was added.
	Opened time.Time
}

// Segmenter cuts each set's events into segments: one is cut when it
// reaches MaxBytes, or when its first event is MaxAge old (Due), whichever
// comes first, so that a crash loses at most MaxAge of events. Not safe
// for concurrent use: the sink's one goroutine owns it.
type Segmenter struct {
	Prefix, Run string
	MaxBytes    int
	MaxAge      time.Duration

	open map[string]*Segment
	seq  map[string]int
}

// Add appends one event's line (without its newline) to set's open
// segment, and returns the segment it completed, if the line filled it.
func (s *Segmenter) Add(set string, line []byte, now time.Time) (cut *Segment) {
	if s.open == nil {
		s.open, s.seq = map[string]*Segment{}, map[string]int{}
	}
	g := s.open[set]
	if g == nil {
		s.seq[set]++
		g = &Segment{Key: Key(s.Prefix, set, s.Run, s.seq[set]), Set: set, Seq: s.seq[set], Opened: now}
		s.open[set] = g
	}
	g.Body = append(append(g.Body, line...), '\n')
	g.Events++
	if len(g.Body) >= s.MaxBytes {
		delete(s.open, set)
		return g
	}
	return nil
}

// Due returns the open segments whose first event is MaxAge old at now,
// oldest first, and closes them.
func (s *Segmenter) Due(now time.Time) []*Segment {
	var out []*Segment
	for set, g := range s.open {
		if now.Sub(g.Opened) >= s.MaxAge {
			out = append(out, g)
			delete(s.open, set)
		}
	}
	slices.SortFunc(out, func(a, b *Segment) int { return a.Opened.Compare(b.Opened) })
	return out
}

// Flush closes every open segment (at shutdown), oldest first.
func (s *Segmenter) Flush() []*Segment {
	var out []*Segment
	for set, g := range s.open {
		out = append(out, g)
		delete(s.open, set)
	}
	slices.SortFunc(out, func(a, b *Segment) int { return a.Opened.Compare(b.Opened) })
	return out
}

// NextDue is when the oldest open segment becomes due (zero when none is
// open).
func (s *Segmenter) NextDue() time.Time {
	var t time.Time
	for _, g := range s.open {
		if d := g.Opened.Add(s.MaxAge); t.IsZero() || d.Before(t) {
			t = d
		}
	}
	return t
}

// Spool holds the segments cut and not uploaded yet, in order, within a
// bound on their bytes: while the store is unreachable they wait here,
// and are uploaded in the order they were cut once it is back. A segment
// that does not fit is refused (the caller counts and logs the drop): the
// ones already spooled keep their order. It keeps them in memory, so they
// do not outlive the process (the sink's spool in a directory does). Not
// safe for concurrent use.
type Spool struct {
	MaxBytes int

	queue []*Segment
	bytes int
}

// Push spools g; false when it does not fit.
func (p *Spool) Push(g *Segment) bool {
	if p.bytes+len(g.Body) > p.MaxBytes {
		return false
	}
	p.queue = append(p.queue, g)
	p.bytes += len(g.Body)
	return true
}

// Peek returns the oldest spooled segment, or nil.
func (p *Spool) Peek() *Segment {
	if len(p.queue) == 0 {
		return nil
	}
	return p.queue[0]
}

// Pop removes the oldest spooled segment (it was uploaded).
func (p *Spool) Pop() {
	if len(p.queue) == 0 {
		return
	}
	p.bytes -= len(p.queue[0].Body)
	p.queue[0] = nil
	p.queue = p.queue[1:]
}

// Len and Bytes say what is spooled.
func (p *Spool) Len() int   { return len(p.queue) }
func (p *Spool) Bytes() int { return p.bytes }

// put and oldest make Spool the sink's spooler in memory.
func (p *Spool) put(g *Segment) error {
	if !p.Push(g) {
		return errSpoolFull
	}
	return nil
}

func (p *Spool) oldest() (*Segment, error) { return p.Peek(), nil }
