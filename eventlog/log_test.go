package eventlog

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNew(t *testing.T) {
	if _, err := New(Config{}, "p", Options{}); err == nil || !strings.HasPrefix(err.Error(), "eventlog: max_file_bytes: ") {
		t.Errorf("New(invalid config) = %v, want the validation error", err)
	}
	if _, err := New(DefaultConfig(), "", Options{}); err == nil {
		t.Error("New with an empty node name succeeded")
	}
	reg := prometheus.NewPedanticRegistry()
	if _, err := New(DefaultConfig(), "p", Options{Registerer: reg}); err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := New(DefaultConfig(), "p", Options{Registerer: reg}); err == nil {
		t.Error("a second Log on the same registry registered its metrics twice")
	}
	// The zero Options work: no logger, no registry, the real clock.
	l, err := New(DefaultConfig(), "p", Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	l.Emit(Event{Kind: "k"})
	if got := l.Recent(time.Time{}, nil, 0); len(got) != 1 || got[0].Time.Before(before.Add(-time.Second)) {
		t.Errorf("Recent = %+v, want one event stamped now", got)
	}
}

func TestNodeDir(t *testing.T) {
	tests := map[string]string{
		"proxy-1":             "proxy-1",
		"orders-0.a_B":        "orders-0.a_B",
		"10.0.0.1:7946":       "10.0.0.1_7946",
		"a/b":                 "a_b",
		"../../etc":           ".._.._etc",
		"..":                  "__",
		".":                   "_",
		"":                    "_",
		"pod ü":               "pod___", // ü is two bytes
		"orders-0-1712345678": "orders-0-1712345678",
	}
	for node, want := range tests {
		if got := NodeDir("/audit", node); got != "/audit/"+want {
			t.Errorf("NodeDir(/audit, %q) = %q, want /audit/%s", node, got, want)
		}
	}
}

func TestEmitStampsTimeAndNode(t *testing.T) {
	c := newClock()
	l, _ := newLog(t, DefaultConfig(), Options{Now: c.Now})
	l.Emit(Event{Kind: "a", Node: "someone-else"})
	explicit := time.Date(2024, 1, 1, 12, 0, 0, 0, time.FixedZone("X", 3600))
	l.Emit(Event{Kind: "b", Time: explicit})
	got := l.Recent(time.Time{}, nil, 0)
	want := []Event{
		{Time: t0, Node: "proxy-1", Kind: "a"},
		{Time: explicit.UTC(), Node: "proxy-1", Kind: "b"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Recent =\n %+v\nwant\n %+v", got, want)
	}
	if got[1].Time.Location() != time.UTC {
		t.Errorf("explicit time kept zone %v, want UTC", got[1].Time.Location())
	}
}

func TestRecent(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Memory = 8
	l, _ := newLog(t, cfg, Options{Now: c.Now})
	// 10 events, one a second; kinds cycle a, b, c. Memory keeps 2..9.
	for i := range 10 {
		l.Emit(Event{Kind: string(rune('a' + i%3)), Fields: map[string]any{"i": i}})
		c.Add(time.Second)
	}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	tests := map[string]struct {
		since time.Time
		kinds []string
		limit int
		want  []int
	}{
		"everything kept":        {want: []int{2, 3, 4, 5, 6, 7, 8, 9}},
		"limit keeps the newest": {limit: 3, want: []int{7, 8, 9}},
		"limit above count":      {limit: 100, want: []int{2, 3, 4, 5, 6, 7, 8, 9}},
		"since is inclusive":     {since: at(7), want: []int{7, 8, 9}},
		"since before memory":    {since: at(0), want: []int{2, 3, 4, 5, 6, 7, 8, 9}},
		"since in the future":    {since: at(10), want: nil},
		"one kind":               {kinds: []string{"a"}, want: []int{3, 6, 9}},
		"two kinds":              {kinds: []string{"b", "c"}, want: []int{2, 4, 5, 7, 8}},
		"unknown kind":           {kinds: []string{"zzz"}, want: nil},
		"all filters":            {since: at(4), kinds: []string{"b", "c"}, limit: 2, want: []int{7, 8}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := l.Recent(tc.since, tc.kinds, tc.limit)
			var idx []int
			for _, e := range got {
				i := e.Fields["i"].(int)
				idx = append(idx, i)
				if !e.Time.Equal(at(i)) || e.Kind != string(rune('a'+i%3)) {
					t.Errorf("event %d = %+v, want time %v kind %c", i, e, at(i), 'a'+i%3)
				}
			}
			if !reflect.DeepEqual(idx, tc.want) {
				t.Errorf("Recent(%v, %v, %d) = events %v, want %v", tc.since, tc.kinds, tc.limit, idx, tc.want)
			}
		})
	}
}

func TestRecentWithoutMemory(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Memory = 0
	l, _ := newLog(t, cfg, Options{})
	l.Emit(Event{Kind: "k"})
	if got := l.Recent(time.Time{}, nil, 0); got != nil {
		t.Errorf("Recent with memory 0 = %v, want nil", got)
	}
	if n := counter(l.m.events.WithLabelValues("k")); n != 1 {
		t.Errorf("events_total = %v, want 1 (counted even when not kept)", n)
	}
}

func TestNilLog(t *testing.T) {
	var l *Log
	l.Emit(Event{Kind: "k"})
	l.Record("k", "s", "r", nil)
	if l.Recent(time.Time{}, nil, 0) != nil || l.Path() != "" || l.Flush(context.Background()) != nil {
		t.Error("a nil *Log is not a no-op")
	}
}

func TestRecord(t *testing.T) {
	l, _ := newLog(t, DefaultConfig(), Options{})
	// What a package that may not import eventlog declares.
	var r interface {
		Record(kind, set, replica string, fields map[string]any)
	} = l
	r.Record(KindAdminAction, "orders", "orders-1", map[string]any{"action": "drain"})
	got := l.Recent(time.Time{}, nil, 0)
	want := []Event{{Time: t0, Node: "proxy-1", Kind: KindAdminAction, Set: "orders", Replica: "orders-1",
		Fields: map[string]any{"action": "drain"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Recent = %+v, want %+v", got, want)
	}
}

func TestFilesOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Buffer = 1
	l, _ := newLog(t, cfg, Options{})
	stop := start(t, l)
	for range 5 {
		l.Emit(Event{Kind: "k"})
	}
	if err := flush(t, l); err != nil {
		t.Errorf("Flush = %v, want nil with files off", err)
	}
	if n := counter(l.m.droppedQueue) + counter(l.m.droppedWrite); n != 0 {
		t.Errorf("dropped_total = %v, want 0: with files off nothing is queued", n)
	}
	if got := len(l.Recent(time.Time{}, nil, 0)); got != 5 {
		t.Errorf("Recent has %d events, want 5", got)
	}
	if l.Path() != "" {
		t.Errorf("Path() = %q, want empty", l.Path())
	}
	stop()
}

func TestRunTwice(t *testing.T) {
	l, _ := newLog(t, fileConfig(t), Options{})
	start(t, l)
	// Flush returns once the first Run is in its loop.
	if err := flush(t, l); err != nil {
		t.Fatal(err)
	}
	if err := l.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second Run = %v, want an already-running error", err)
	}
}

type lineRecorder struct {
	sets  []string
	lines []string
}

func (r *lineRecorder) Write(set string, line []byte) bool {
	r.sets = append(r.sets, set)
	r.lines = append(r.lines, string(line))
	return true
}

// Options.Sink gets every event's line, as the file would have it, in
// Recent's order.
func TestLogSink(t *testing.T) {
	rec := &lineRecorder{}
	l, err := New(DefaultConfig(), "proxy-a", Options{Sink: rec})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(KindPhaseChange, "orders", "", map[string]any{"from": "Created", "to": "Running"})
	l.Record(KindConfigReload, "", "", map[string]any{"result": "success"})
	l.Record(KindEjected, "users", "users-1", map[string]any{"reason": "5xx"})
	evs := l.Recent(time.Time{}, nil, 0)
	if len(rec.lines) != 3 || len(evs) != 3 {
		t.Fatalf("sink got %d lines, memory %d events", len(rec.lines), len(evs))
	}
	for i, e := range evs {
		b, _ := e.MarshalJSON()
		if rec.lines[i] != string(b) || rec.sets[i] != e.Set {
			t.Errorf("line %d: %q for set %q, want %q for %q", i, rec.lines[i], rec.sets[i], b, e.Set)
		}
	}
}
