package query

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/eventlog"
	"keyway/eventlog/objstore"
)

var t0 = time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func ringEvent(kind, set string, ts time.Time, members, rotation []string) eventlog.Event {
	return eventlog.Event{Time: ts, Node: "proxy-a", Kind: kind, Set: set, Fields: map[string]any{
		"fingerprint": balancer.DefaultHashConfig().Fingerprint(), "members": members, "rotation": rotation, "failover": "next",
	}}
}

func place(t *testing.T, members, rotation []string, p int) balancer.Placed {
	t.Helper()
	pl, err := balancer.PlaceRecorded(balancer.DefaultHashConfig().Fingerprint(), members, rotation, balancer.FailoverNext, p)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// partitions finds a partition that orders-4 takes over when it joins
// [orders-0..3], and one it does not.
func partitions(t *testing.T) (moved, stays int) {
	t.Helper()
	four := []string{"orders-0", "orders-1", "orders-2", "orders-3"}
	five := append(slices.Clone(four), "orders-4")
	moved, stays = -1, -1
	for p := 0; p < balancer.DefaultHashConfig().Partitions && (moved < 0 || stays < 0); p++ {
		if place(t, five, five, p).Owner == "orders-4" {
			moved = p
		} else if place(t, four, four, p).Owner == place(t, five, five, p).Owner {
			stays = p
		}
	}
	if moved < 0 || stays < 0 {
		t.Fatal("no partition moves or none stays")
	}
	return moved, stays
}

// The partition question: what happened to partition P of a set in a
// window. The filter keeps the placement in force when the window opens,
// the events of the replicas that own or take P, the changes that move it,
// and the set's own events; it leaves out what concerns other partitions,
// other sets and other times.
func TestPartitionTimeline(t *testing.T) {
	four := []string{"orders-0", "orders-1", "orders-2", "orders-3"}
	five := append(slices.Clone(four), "orders-4")
	p, stays := partitions(t)
	owner := place(t, four, four, p).Owner
	other := "" // a replica that neither owns nor takes p
	for _, m := range four {
		if m != owner && m != place(t, four, slices.DeleteFunc(slices.Clone(four), func(s string) bool { return s == owner }), p).Pick {
			other = m
			break
		}
	}
	without := slices.DeleteFunc(slices.Clone(four), func(s string) bool { return s == owner })
	standIn := place(t, four, without, p).Pick
	evs := []eventlog.Event{
		ringEvent(eventlog.KindRingRebuild, "orders", at(0), four, four),
		{Time: at(1), Kind: eventlog.KindEjected, Set: "orders", Replica: owner}, // before the window
		ringEvent(eventlog.KindRingRebuild, "billing", at(5), []string{"billing-0"}, []string{"billing-0"}),
		{Time: at(11), Kind: eventlog.KindStateChange, Set: "orders", Replica: other},
		{Time: at(12), Kind: eventlog.KindStateChange, Set: "orders", Replica: owner, Fields: map[string]any{"state": "draining"}},
		ringEvent(eventlog.KindRotationChange, "orders", at(13), four, without),
		{Time: at(14), Kind: eventlog.KindPhaseChange, Set: "orders", Fields: map[string]any{"phase": "degraded"}},
		{Time: at(15), Kind: eventlog.KindEjected, Set: "billing", Replica: "billing-0"},
		ringEvent(eventlog.KindRotationChange, "orders", at(16), four, four),
		ringEvent(eventlog.KindRingRebuild, "orders", at(17), five, five),
		{Time: at(30), Kind: eventlog.KindStateChange, Set: "orders", Replica: "orders-4"}, // after the window
	}
	f := Filter{Sets: []string{"orders"}, Partition: p, Since: at(10), Until: at(20)}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	got := f.Events(evs)
	var lines []string
	for _, m := range got {
		pl := m.Placement
		if pl == nil {
			t.Fatalf("%s at %s: no placement", m.Event.Kind, m.Event.Time)
		}
		lines = append(lines, fmt.Sprintf("%d %s %s owner=%s pick=%s was=%s/%s inforce=%v", m.Event.Time.Sub(t0)/time.Second, m.Event.Kind, m.Event.Replica, pl.Owner, pl.Pick, pl.WasOwner, pl.WasPick, pl.InForce))
	}
	want := []string{
		fmt.Sprintf("0 ring_rebuild  owner=%s pick=%s was=/ inforce=true", owner, owner),
		fmt.Sprintf("12 state_change %s owner=%s pick=%s was=/ inforce=false", owner, owner, owner),
		fmt.Sprintf("13 rotation_change  owner=%s pick=%s was=%s/%s inforce=false", owner, standIn, owner, owner),
		fmt.Sprintf("14 phase_change  owner=%s pick=%s was=/ inforce=false", owner, standIn),
		fmt.Sprintf("16 rotation_change  owner=%s pick=%s was=%s/%s inforce=false", owner, owner, owner, standIn),
		fmt.Sprintf("17 ring_rebuild  owner=orders-4 pick=orders-4 was=%s/%s inforce=false", owner, owner),
	}
	if !slices.Equal(lines, want) {
		t.Fatalf("timeline of partition %d:\n%s\nwant:\n%s", p, strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	// A partition that orders-4 does not take: the scale-out is not in its
	// timeline.
	f.Partition = stays
	for _, m := range f.Events(evs) {
		if m.Event.Time.Equal(at(17)) {
			t.Errorf("partition %d did not move at 17s, yet the ring rebuild is in its timeline", stays)
		}
	}
}

// A key is followed through the partition it hashes to in each ring.
func TestKeyFilter(t *testing.T) {
	four := []string{"orders-0", "orders-1", "orders-2", "orders-3"}
	key := "order-42"
	p, err := PartitionOf(balancer.DefaultHashConfig().Fingerprint(), key)
	if err != nil {
		t.Fatal(err)
	}
	if want := int(balancer.HashString(key) % uint64(balancer.DefaultHashConfig().Partitions)); p != want {
		t.Fatalf("partition of %s: %d, want %d", key, p, want)
	}
	owner := place(t, four, four, p).Owner
	evs := []eventlog.Event{
		ringEvent(eventlog.KindRingRebuild, "orders", at(0), four, four),
		{Time: at(1), Kind: eventlog.KindEjected, Set: "orders", Replica: owner},
	}
	got := Filter{Sets: []string{"orders"}, Partition: NoPartition, Key: key}.Events(evs)
	if len(got) != 2 || got[1].Placement == nil || got[1].Placement.Partition != p || got[1].Placement.Owner != owner {
		t.Fatalf("key %s: %+v", key, got)
	}
}

// Filters by kind, replica and time; a replica's ring and rotation
// changes count as its events.
func TestFilterKindReplicaTime(t *testing.T) {
	three := []string{"a", "b", "c"}
	evs := []eventlog.Event{
		ringEvent(eventlog.KindRingRebuild, "s", at(0), three, three),
		{Time: at(1), Kind: eventlog.KindEjected, Set: "s", Replica: "b"},
		ringEvent(eventlog.KindRotationChange, "s", at(2), three, []string{"a", "c"}),
		{Time: at(3), Kind: eventlog.KindEjected, Set: "s", Replica: "c"},
		ringEvent(eventlog.KindRotationChange, "s", at(4), three, []string{"a"}),
		{Time: at(5), Kind: eventlog.KindConfigReload},
	}
	kinds := func(ms []Match) string {
		var out []string
		for _, m := range ms {
			out = append(out, fmt.Sprintf("%d:%s", m.Event.Time.Sub(t0)/time.Second, m.Event.Kind))
		}
		return strings.Join(out, " ")
	}
	for _, c := range []struct {
		f    Filter
		want string
	}{
		{Filter{Partition: NoPartition}, "0:ring_rebuild 1:ejected 2:rotation_change 3:ejected 4:rotation_change 5:config_reload"},
		{Filter{Partition: NoPartition, Replica: "b"}, "0:ring_rebuild 1:ejected 2:rotation_change"},
		{Filter{Partition: NoPartition, Kinds: []string{"ejected"}, Since: at(2)}, "3:ejected"},
		{Filter{Partition: NoPartition, Sets: []string{"s"}, Until: at(3)}, "0:ring_rebuild 1:ejected 2:rotation_change"},
		{Filter{Partition: NoPartition, Sets: []string{""}}, "5:config_reload"},
	} {
		if got := kinds(c.f.Events(evs)); got != c.want {
			t.Errorf("%+v: %s, want %s", c.f, got, c.want)
		}
	}
}

func TestFilterValidate(t *testing.T) {
	for _, c := range []struct {
		f    Filter
		want string
	}{
		{Filter{Partition: 3}, "set: a partition or a key is one set's"},
		{Filter{Partition: 3, Key: "k", Sets: []string{"s"}}, "partition and key: give one of them"},
		{Filter{Partition: -2}, "partition: -2 is not a partition"},
		{Filter{Partition: NoPartition, Since: at(5), Until: at(1)}, "until: "},
	} {
		if err := c.f.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.f, err, c.want)
		}
	}
}

// Events read back from object storage carry their run's sequence
// numbers: a gap or a repeat is reported.
func TestSeqGaps(t *testing.T) {
	ev := func(n int64) eventlog.Event {
		return eventlog.Event{Time: at(int(n)), Kind: eventlog.KindPhaseChange, Set: "s", Fields: map[string]any{"seq": n}}
	}
	s := (&Filter{Partition: NoPartition}).NewStream("s/run-x")
	for _, n := range []int64{2, 3, 7, 7} {
		s.Add(ev(n))
	}
	got := strings.Join(s.Gaps(), "\n")
	for _, want := range []string{"events 1 to 1 of set \"s\" are missing", "events 4 to 6 of set \"s\" are missing", "event 7 of set \"s\" comes again"} {
		if !strings.Contains(got, want) {
			t.Errorf("gaps %q: want %q", got, want)
		}
	}
}

// The sink's objects, in a directory holding the layout, read back by
// run, in order, once each; a second poll returns only what came since.
func TestStoreSourceFromSink(t *testing.T) {
	dir := objstore.Dir{Root: t.TempDir()}
	ctx := context.Background()
	write := func(run string, set string, lines ...string) {
		var seg objstore.Segmenter
		seg.Prefix, seg.Run, seg.MaxBytes, seg.MaxAge = "audit", run, 1<<20, time.Hour
		for _, l := range lines {
			seg.Add(set, []byte(l), time.Now())
		}
		for _, g := range seg.Flush() {
			if err := dir.Put(ctx, g.Key, g.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	line := func(seq, s int, kind string) string {
		return fmt.Sprintf(`{"seq":%d,"ts":%q,"node":"n","kind":%q,"set":"orders"}`, seq, at(s).Format(time.RFC3339Nano), kind)
	}
	runA := objstore.RunID(at(0), "proxy-a")
	runB := objstore.RunID(at(1), "proxy-b")
	write(runA, "orders", line(1, 2, "ejected"), line(2, 4, "readmitted"))
	write(runB, "orders", line(1, 3, "ejected"))
	write(runB, "", `{"seq":1,"ts":"2026-12-03T03:00:05Z","node":"n","kind":"config_reload"}`)

	src := &Store{R: dir, Prefix: "audit", Name: "dir"}
	sets, err := src.Sets(ctx)
	if err != nil || !slices.Equal(sets, []string{"", "orders"}) {
		t.Fatalf("sets %q %v", sets, err)
	}
	runs, err := src.Runs(ctx, "orders")
	if err != nil || len(runs) != 2 || runs[0].ID != runA || runs[0].Node != "proxy-a" || !runs[0].Start.Equal(at(0)) || runs[1].Node != "proxy-b" {
		t.Fatalf("runs %+v %v", runs, err)
	}
	q := &Query{Filter: Filter{Partition: NoPartition, Sets: []string{"orders"}}, Source: src}
	got, err := q.Poll(ctx)
	if err != nil || len(got) != 3 || got[0].Event.Kind != "ejected" || got[1].Stream != "orders/run-"+runB || got[2].Event.Kind != "readmitted" {
		t.Fatalf("poll: %+v %v", got, err)
	}
	if w := q.Warnings(); len(w) != 0 {
		t.Fatalf("warnings %q", w)
	}
	// A new segment of run A: the next poll returns it alone.
	var seg objstore.Segmenter
	seg.Prefix, seg.Run, seg.MaxBytes, seg.MaxAge = "audit", runA, 1<<20, time.Hour
	seg.Add("orders", []byte("x"), time.Now()) // segment 1, not written again
	seg.Flush()
	seg.Add("orders", []byte(line(4, 6, "ejected")), time.Now())
	for _, g := range seg.Flush() {
		if err := dir.Put(ctx, g.Key, g.Body); err != nil {
			t.Fatal(err)
		}
	}
	got, err = q.Poll(ctx)
	if err != nil || len(got) != 1 || Seq(got[0].Event) != 4 {
		t.Fatalf("second poll: %+v %v", got, err)
	}
	if w := strings.Join(q.Warnings(), "\n"); !strings.Contains(w, "events 3 to 3 of set \"orders\" are missing") {
		t.Fatalf("warnings %q: want the gap of event 3", w)
	}
}

// Proxies' local files (audit.dir): one stream per node; a follower
// gets each event once.
func TestFilesSource(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, node := range []string{"proxy-a", "proxy-b"} {
		l, err := eventlog.New(eventlog.Config{Dir: dir, MaxFileBytes: 1 << 20, Retain: 3, Buffer: 16, Memory: 16, SegmentBytes: 1 << 20, SegmentAge: time.Second, SpoolBytes: 1 << 20}, node, eventlog.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- l.Run(rctx) }()
		l.Emit(eventlog.Event{Time: at(1), Kind: eventlog.KindEjected, Set: "orders", Replica: "orders-1"})
		l.Emit(eventlog.Event{Time: at(2), Kind: eventlog.KindConfigReload})
		if err := l.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		<-done
	}
	if !IsAuditDir(dir) || IsAuditDir(t.TempDir()) {
		t.Fatal("IsAuditDir")
	}
	src := &Files{Dir: dir}
	sets, err := src.Sets(ctx)
	if err != nil || !slices.Equal(sets, []string{"", "orders"}) {
		t.Fatalf("sets %q %v", sets, err)
	}
	runs, err := src.Runs(ctx, "orders")
	if err != nil || len(runs) != 2 {
		t.Fatalf("runs %+v %v", runs, err)
	}
	q := &Query{Filter: Filter{Partition: NoPartition, Sets: []string{"orders"}}, Source: src}
	got, err := q.Poll(ctx)
	if err != nil || len(got) != 2 || got[0].Stream == got[1].Stream {
		t.Fatalf("poll %+v %v", got, err)
	}
	if got, err := q.Poll(ctx); err != nil || len(got) != 0 {
		t.Fatalf("second poll: %+v %v", got, err)
	}
}
