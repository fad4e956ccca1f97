package query

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"keyway/eventlog"
	"keyway/eventlog/objstore"
)

// Run is one stream of a source: a proxy process's run of a set in
// object storage, or one node's files in a directory.
type Run struct {
	// ID is the run's id (RUN of run-RUN), or the node's directory name.
	ID string `json:"id"`
	// Node and Start are read from the run's id ("" and zero for a
	// directory of files).
	Node  string    `json:"node,omitempty"`
	Start time.Time `json:"start,omitzero"`
	// Segments counts its objects or files.
	Segments int `json:"segments"`
}

// Batch is the events of one stream read by one Read, in order.
type Batch struct {
	Stream string
	Events []eventlog.Event
}

// Source is where an audit trail is read from.
type Source interface {
	// Sets lists the sets the trail has events of ("" for the events of
	// none, when there are some).
	Sets(ctx context.Context) ([]string, error)
	// Runs lists the runs (or nodes) that wrote events of set.
	Runs(ctx context.Context, set string) ([]Run, error)
	// Read returns the events of the given sets (empty: all) that no
	// earlier Read returned, per stream, each stream's in order. Called
	// again, it returns what was written since: a follower's poll.
	Read(ctx context.Context, sets []string) ([]Batch, error)
	// String names the source in messages.
	String() string
}

// ParseRunID reads a run id (objstore.RunID) back: its start and node.
func ParseRunID(id string) (start time.Time, node string, ok bool) {
	const layout = "20060102T150405.000Z"
	if len(id) < len(layout)+2 || id[len(layout)] != '-' {
		return time.Time{}, "", false
	}
	t, err := time.Parse(layout, id[:len(layout)])
	if err != nil {
		return time.Time{}, "", false
	}
	return t, id[len(layout)+1:], true
}

// Store reads the object-storage layout (objstore) under a prefix.
type Store struct {
	R      objstore.Reader
	Prefix string
	// Name is the source's address, for messages (s3://BUCKET/PREFIX).
	Name string

	read map[string]bool // segment keys already returned
}

func (s *Store) String() string { return s.Name }

func (s *Store) dir(parts ...string) string {
	p := strings.Join(parts, "/")
	if s.Prefix != "" {
		p = s.Prefix + "/" + p
	}
	return p
}

// setDir is the directory of set's events ("": NoSet).
func setDir(set string) string {
	if set == "" {
		return objstore.NoSet
	}
	return set
}

// Sets lists PREFIX/.
func (s *Store) Sets(ctx context.Context) ([]string, error) {
	names, err := s.R.ListDirs(ctx, s.Prefix)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n == objstore.NoSet {
			n = ""
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Runs lists PREFIX/SET/ and counts each run's segments.
func (s *Store) Runs(ctx context.Context, set string) ([]Run, error) {
	keys, err := s.R.List(ctx, s.dir(setDir(set), ""))
	if err != nil {
		return nil, err
	}
	var out []Run
	for _, k := range keys {
		_, run, _, err := objstore.ParseKey(s.Prefix, k)
		if err != nil {
			continue
		}
		if n := len(out); n > 0 && out[n-1].ID == run {
			out[n-1].Segments++
			continue
		}
		r := Run{ID: run, Segments: 1}
		r.Start, r.Node, _ = ParseRunID(run)
		out = append(out, r)
	}
	return out, nil
}

// Read reads the segments not read before, each run's in sequence order.
func (s *Store) Read(ctx context.Context, sets []string) ([]Batch, error) {
	if s.read == nil {
		s.read = map[string]bool{}
	}
	if len(sets) == 0 {
		var err error
		if sets, err = s.Sets(ctx); err != nil {
			return nil, err
		}
	}
	var out []Batch
	for _, set := range sets {
		keys, err := s.R.List(ctx, s.dir(setDir(set), ""))
		if err != nil {
			return out, err
		}
		type seg struct {
			key string
			seq int
		}
		runs := map[string][]seg{}
		var order []string
		for _, k := range keys {
			kset, run, seq, err := objstore.ParseKey(s.Prefix, k)
			if err != nil || kset != set || s.read[k] {
				continue
			}
			if runs[run] == nil {
				order = append(order, run)
			}
			runs[run] = append(runs[run], seg{k, seq})
		}
		slices.Sort(order)
		for _, run := range order {
			segs := runs[run]
			slices.SortFunc(segs, func(a, b seg) int { return a.seq - b.seq })
			b := Batch{Stream: setDir(set) + "/run-" + run}
			for _, g := range segs {
				body, err := s.R.Get(ctx, g.key)
				if err != nil {
					return out, err
				}
				evs, err := parse(body, g.key)
				b.Events = append(b.Events, evs...)
				if err != nil {
					return out, err
				}
				s.read[g.key] = true
			}
			out = append(out, b)
		}
	}
	return out, nil
}

func parse(body []byte, name string) ([]eventlog.Event, error) {
	var out []eventlog.Event
	for n, line := range bytes.Split(body, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e eventlog.Event
		if err := e.UnmarshalJSON(line); err != nil {
			return out, fmt.Errorf("%s:%d: %w", name, n+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// Files reads proxies' local files (audit.dir): DIR/NODE/events-NNNNNN.jsonl,
// one stream per node, or a single node's directory.
type Files struct {
	Dir string

	// done[node][file seq] counts the events already returned of a file.
	done map[string]map[int]int
}

func (f *Files) String() string { return f.Dir }

// nodes returns the node directories: Dir itself when it holds the files.
func (f *Files) nodes() ([]string, error) {
	if IsNodeDir(f.Dir) {
		return []string{f.Dir}, nil
	}
	entries, err := os.ReadDir(f.Dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if p := filepath.Join(f.Dir, e.Name()); e.IsDir() && IsNodeDir(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// IsNodeDir reports whether dir holds files of the local trail.
func IsNodeDir(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, "events-*.jsonl"))
	return len(m) > 0
}

// IsAuditDir reports whether dir is an audit.dir (or a node's directory
// in one) rather than a copy of the object layout.
func IsAuditDir(dir string) bool {
	if IsNodeDir(dir) {
		return true
	}
	m, _ := filepath.Glob(filepath.Join(dir, "*", "events-*.jsonl"))
	return len(m) > 0
}

// Sets reads every file and lists the sets named.
func (f *Files) Sets(ctx context.Context) ([]string, error) {
	nodes, err := f.nodes()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		evs, err := eventlog.ReadDir(n)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for _, e := range evs {
			seen[e.Set] = true
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out, nil
}

// Runs lists the nodes whose files hold events of set.
func (f *Files) Runs(ctx context.Context, set string) ([]Run, error) {
	nodes, err := f.nodes()
	if err != nil {
		return nil, err
	}
	var out []Run
	for _, n := range nodes {
		evs, _ := eventlog.ReadDir(n)
		if slices.ContainsFunc(evs, func(e eventlog.Event) bool { return e.Set == set }) {
			files, _ := filepath.Glob(filepath.Join(n, "events-*.jsonl"))
			out = append(out, Run{ID: filepath.Base(n), Node: filepath.Base(n), Segments: len(files)})
		}
	}
	return out, nil
}

// Read returns the events each node's files gained since the last Read
// (files the writer retired in between are not read again).
func (f *Files) Read(ctx context.Context, sets []string) ([]Batch, error) {
	if f.done == nil {
		f.done = map[string]map[int]int{}
	}
	nodes, err := f.nodes()
	if err != nil {
		return nil, err
	}
	var out []Batch
	for _, n := range nodes {
		done := f.done[n]
		if done == nil {
			done = map[int]int{}
			f.done[n] = done
		}
		files, _ := filepath.Glob(filepath.Join(n, "events-*.jsonl"))
		type file struct {
			path string
			seq  int
		}
		var list []file
		for _, p := range files {
			d := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "events-"), ".jsonl")
			if seq, err := strconv.Atoi(d); err == nil {
				list = append(list, file{p, seq})
			}
		}
		slices.SortFunc(list, func(a, b file) int { return a.seq - b.seq })
		b := Batch{Stream: "node " + filepath.Base(n)}
		for _, fl := range list {
			evs, err := eventlog.ReadFile(fl.path)
			if err != nil && len(evs) == 0 {
				if errors.Is(err, fs.ErrNotExist) {
					continue // retired while we read
				}
				// A line being written: take the whole lines, and the rest
				// next time.
			}
			for _, e := range evs[min(done[fl.seq], len(evs)):] {
				if len(sets) == 0 || slices.Contains(sets, e.Set) {
					b.Events = append(b.Events, e)
				}
			}
			done[fl.seq] = max(done[fl.seq], len(evs))
		}
		out = append(out, b)
	}
	return out, nil
}
