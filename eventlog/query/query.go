package query

import (
	"context"
	"slices"

	"keyway/eventlog"
)

// Query runs a Filter over a Source, across all its streams, and keeps
// each stream's ring state between polls, so that a follower sees the
// same answer as a reader of the whole trail.
type Query struct {
	Filter Filter
	Source Source

	streams map[string]*Stream
}

// Poll reads what the source gained since the last Poll (everything, the
// first time) and returns the matches in time order (a stream's own order
// kept for equal times).
func (q *Query) Poll(ctx context.Context) ([]Match, error) {
	if q.streams == nil {
		q.streams = map[string]*Stream{}
	}
	batches, err := q.Source.Read(ctx, q.Filter.Sets)
	var out []Match
	for _, b := range batches {
		s := q.streams[b.Stream]
		if s == nil {
			s = q.Filter.NewStream(b.Stream)
			q.streams[b.Stream] = s
		}
		for _, e := range b.Events {
			out = append(out, s.Add(e)...)
		}
	}
	slices.SortStableFunc(out, func(a, b Match) int { return a.Event.Time.Compare(b.Event.Time) })
	return out, err
}

// Warnings lists the gaps and placement problems seen so far, per stream.
func (q *Query) Warnings() []string {
	var out []string
	for _, name := range q.names() {
		s := q.streams[name]
		out = append(out, s.Gaps()...)
		out = append(out, s.Problems()...)
	}
	return out
}

func (q *Query) names() []string {
	var out []string
	for n := range q.streams {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Events filters events already in hand, oldest first, as one stream (a
// proxy's memory): the admin API's filtered GET /v1/events.
func (f Filter) Events(events []eventlog.Event) []Match {
	s := f.NewStream("memory")
	var out []Match
	for _, e := range events {
		out = append(out, s.Add(e)...)
	}
	return out
}
