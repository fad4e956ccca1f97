// Package objstore lays keyway's audit trail out in object storage, in the
// layout pipeline operators know:
//
//	s3://BUCKET/PREFIX/SET/run-RUN/events-NNNNNN.jsonl
//
// The replica set stands where a pipeline does, so listing PREFIX/ yields
// the sets and listing PREFIX/SET/ their runs, with no index. RUN names one
// proxy process: its start time in UTC, which sorts runs in time, and its
// node. Events of no set go under [NoSet], a name no set can have ('~' is
// outside the set-name alphabet). Objects are immutable: events are
// written as segments, numbered from 1 within a run, each a whole number
// of JSONL lines.
package objstore

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// NoSet is the directory of the events that belong to no set (config
// reloads, refused gossip, …).
const NoSet = "~fleet"

// ParseURL reads the sink's address, s3://BUCKET[/PREFIX]. The prefix has
// no leading or trailing slash ("" when none).
func ParseURL(s string) (bucket, prefix string, err error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", fmt.Errorf("%q is not an object-storage address: write s3://BUCKET/PREFIX, e.g. s3://audit/keyway", s)
	}
	return u.Host, strings.Trim(u.Path, "/"), nil
}

// RunID names a proxy process's run: its start time in UTC to the
// millisecond (so that runs sort by start) and its node name, with every
// character outside [A-Za-z0-9._-] replaced by '-'.
func RunID(start time.Time, node string) string {
	var b strings.Builder
	b.WriteString(start.UTC().Format("20060102T150405.000Z"))
	b.WriteByte('-')
	for _, c := range node {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// Key is the object key of segment seq (from 1) of set's events in run
// ("" set: NoSet).
func Key(prefix, set, run string, seq int) string {
	if set == "" {
		set = NoSet
	}
	k := set + "/run-" + run + "/events-" + fmt.Sprintf("%06d", seq) + ".jsonl"
	if prefix != "" {
		k = prefix + "/" + k
	}
	return k
}

// ErrNotASegment is returned by ParseKey for a key outside the layout.
var ErrNotASegment = errors.New("not a segment of keyway's audit layout")

// ParseKey reads a segment's key back: its set ("" for NoSet), run and
// sequence number.
func ParseKey(prefix, key string) (set, run string, seq int, err error) {
	if prefix != "" {
		var ok bool
		if key, ok = strings.CutPrefix(key, prefix+"/"); !ok {
			return "", "", 0, ErrNotASegment
		}
	}
	parts := strings.Split(key, "/")
	if len(parts) != 3 || !strings.HasPrefix(parts[1], "run-") || !strings.HasPrefix(parts[2], "events-") || !strings.HasSuffix(parts[2], ".jsonl") {
		return "", "", 0, ErrNotASegment
	}
	n := strings.TrimSuffix(strings.TrimPrefix(parts[2], "events-"), ".jsonl")
	seq, err = strconv.Atoi(n)
	if err != nil || seq < 1 || len(n) < 6 {
		return "", "", 0, ErrNotASegment
	}
	set = parts[0]
	if set == NoSet {
		set = ""
	}
	return set, strings.TrimPrefix(parts[1], "run-"), seq, nil
}
