package objstore

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"keyway/balancer"
)

func TestParseURL(t *testing.T) {
	for in, want := range map[string][2]string{
		"s3://audit":               {"audit", ""},
		"s3://audit/":              {"audit", ""},
		"s3://audit/keyway":        {"audit", "keyway"},
		"s3://audit/a/b/":          {"audit", "a/b"},
		"s3://my-bucket.x/keyway/": {"my-bucket.x", "keyway"},
	} {
		b, p, err := ParseURL(in)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("ParseURL(%q) = %q, %q, %v; want %q, %q", in, b, p, err, want[0], want[1])
		}
	}
	for _, bad := range []string{"", "audit/keyway", "s3:///keyway", "https://audit/keyway", "s3://audit/k?x=1", "s3://u@audit/k"} {
		if _, _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q): no error", bad)
		}
	}
}

// Keys follow the layout, parse back, and sort: runs by start time,
// segments by number. The no-set directory is no set's name.
func TestKeys(t *testing.T) {
	if balancer.ValidSetName(NoSet) {
		t.Fatalf("%q is a valid set name: a set could share the no-set directory", NoSet)
	}
	start := time.Date(2026, 12, 3, 20, 6, 54, 123456789, time.FixedZone("x", 3600))
	run := RunID(start, "vm:8080/a b")
	if run != "20261203T190654.123Z-vm-8080-a-b" {
		t.Fatalf("RunID = %q", run)
	}
	if k := Key("keyway", "orders", run, 7); k != "keyway/orders/run-20261203T190654.123Z-vm-8080-a-b/events-000007.jsonl" {
		t.Fatalf("Key = %q", k)
	}
	if k := Key("", "", run, 1); k != "~fleet/run-"+run+"/events-000001.jsonl" {
		t.Fatalf("Key without prefix and set = %q", k)
	}
	for _, c := range []struct {
		prefix, set string
		seq         int
	}{{"keyway", "orders", 1}, {"a/b", "", 999999}, {"", "orders-2", 1000000}} {
		set, r, seq, err := ParseKey(c.prefix, Key(c.prefix, c.set, run, c.seq))
		if err != nil || set != c.set || r != run || seq != c.seq {
			t.Errorf("ParseKey(Key(%+v)) = %q %q %d %v", c, set, r, seq, err)
		}
	}
	for _, bad := range []string{"keyway/orders/run-x/events-1.jsonl", "other/orders/run-x/events-000001.jsonl", "keyway/orders/events-000001.jsonl", "keyway/orders/run-x/events-000000.jsonl"} {
		if _, _, _, err := ParseKey("keyway", bad); !errors.Is(err, ErrNotASegment) {
			t.Errorf("ParseKey(%q): %v", bad, err)
		}
	}
	// Later runs, and later segments, sort after.
	runs := []string{RunID(start.Add(time.Hour), "b"), RunID(start, "z"), RunID(start.Add(time.Millisecond), "a")}
	keys := []string{Key("p", "orders", runs[1], 2), Key("p", "orders", runs[2], 1), Key("p", "orders", runs[1], 10), Key("p", "orders", runs[0], 1), Key("p", "orders", runs[1], 1)}
	sort.Strings(keys)
	want := []string{Key("p", "orders", runs[1], 1), Key("p", "orders", runs[1], 2), Key("p", "orders", runs[1], 10), Key("p", "orders", runs[2], 1), Key("p", "orders", runs[0], 1)}
	if !slices.Equal(keys, want) {
		t.Errorf("sorted keys:\n%v\nwant\n%v", keys, want)
	}
}

// Segments are cut by size or by age, numbered per set from 1, each whole
// lines; nothing is lost or reordered.
func TestSegmenter(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	s := &Segmenter{Prefix: "p", Run: "r", MaxBytes: 100, MaxAge: 10 * time.Second}
	var cut []*Segment
	line := func(set string, i int) []byte {
		return []byte(fmt.Sprintf(`{"set":%q,"i":%03d,"pad":"0123456789"}`, set, i))
	}
	// 40-byte lines: the third fills a 100-byte segment.
	for i := range 7 {
		if g := s.Add("orders", line("orders", i), t0.Add(time.Duration(i)*time.Second)); g != nil {
			cut = append(cut, g)
		}
	}
	s.Add("", line("", 0), t0.Add(2*time.Second))
	if len(cut) != 2 || cut[0].Seq != 1 || cut[1].Seq != 2 || cut[0].Events != 3 || cut[0].Key != "p/orders/run-r/events-000001.jsonl" {
		t.Fatalf("cut by size: %+v", cut)
	}
	if due := s.Due(t0.Add(11 * time.Second)); len(due) != 0 {
		t.Fatalf("due at 11s: %d segments, want none (the open ones opened at 2s and 6s)", len(due))
	}
	if got := s.NextDue(); !got.Equal(t0.Add(12 * time.Second)) {
		t.Fatalf("next due %v, want 12s", got)
	}
	due := s.Due(t0.Add(16 * time.Second))
	if len(due) != 2 || due[0].Set != "" || due[0].Key != "p/~fleet/run-r/events-000001.jsonl" || due[1].Seq != 3 || due[1].Events != 1 {
		t.Fatalf("due at 16s: %+v", due)
	}
	cut = append(cut, due[1])
	var all []byte
	for _, g := range cut {
		if !bytes.HasSuffix(g.Body, []byte("\n")) {
			t.Fatalf("segment %d does not end a line", g.Seq)
		}
		all = append(all, g.Body...)
	}
	var want []byte
	for i := range 7 {
		want = append(append(want, line("orders", i)...), '\n')
	}
	if !bytes.Equal(all, want) {
		t.Fatalf("segments:\n%s\nwant\n%s", all, want)
	}
	s.Add("orders", line("orders", 7), t0.Add(20*time.Second))
	if f := s.Flush(); len(f) != 1 || f[0].Seq != 4 || !s.NextDue().IsZero() {
		t.Fatalf("flush: %+v", f)
	}
}

// The spool keeps segments in order within its bound, and refuses one
// that does not fit.
func TestSpool(t *testing.T) {
	p := &Spool{MaxBytes: 10}
	seg := func(seq, n int) *Segment { return &Segment{Seq: seq, Body: bytes.Repeat([]byte("x"), n)} }
	if !p.Push(seg(1, 4)) || !p.Push(seg(2, 4)) || p.Push(seg(3, 4)) || p.Len() != 2 || p.Bytes() != 8 {
		t.Fatalf("spool: len %d bytes %d", p.Len(), p.Bytes())
	}
	if p.Peek().Seq != 1 {
		t.Fatalf("oldest %d", p.Peek().Seq)
	}
	p.Pop()
	if !p.Push(seg(4, 6)) || p.Peek().Seq != 2 || p.Bytes() != 10 {
		t.Fatalf("after a pop: %+v, %d bytes", p.Peek(), p.Bytes())
	}
	p.Pop()
	p.Pop()
	p.Pop() // empty: nothing happens
	if p.Peek() != nil || p.Len() != 0 || p.Bytes() != 0 {
		t.Fatalf("empty spool: %+v", p)
	}
}
