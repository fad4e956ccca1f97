package runstate

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestNextVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		now  time.Time
		seen uint64
		want uint64
		ok   bool
	}{
		{"nothing seen: the wall clock", t0, 0, at(t0, 0), true},
		{"an old Lamport version seen: the wall clock", t0, 41, at(t0, 0), true},
		{"seen earlier: the wall clock", t0, at(t0.Add(-time.Second), 7), at(t0, 0), true},
		{"seen this millisecond: the counter", t0, at(t0, 3), at(t0, 4), true},
		{"seen ahead (a peer's clock): above it", t0, at(t0.Add(30*time.Second), 0), at(t0.Add(30*time.Second), 1), true},
		{"a full counter carries into the milliseconds", t0, at(t0, 1<<logicalBits-1), at(t0.Add(time.Millisecond), 0), true},
		{"before 1970: the counter alone", time.Unix(-5, 0), 9, 10, true},
		{"nothing above the largest", t0, math.MaxUint64, 0, false},
	} {
		got, ok := nextVersion(tc.now, tc.seen)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: nextVersion = %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	if physical(t0)>>logicalBits != uint64(t0.UnixMilli()) {
		t.Fatal("the physical part is not the Unix milliseconds")
	}
	for _, tc := range []struct {
		v    uint64
		want bool
	}{
		{at(t0.Add(MaxAhead), 0), false},
		{at(t0.Add(MaxAhead), 1<<logicalBits-1), false},
		{at(t0.Add(MaxAhead+time.Millisecond), 0), true},
		{math.MaxUint64, true},
		{7, false},
	} {
		if got := tooFarAhead(tc.v, t0); got != tc.want {
			t.Errorf("tooFarAhead(%d) = %v, want %v", tc.v, got, tc.want)
		}
	}
	if got := describeAhead(aheadMS(math.MaxUint64, t0)); !strings.HasSuffix(got, " years") {
		t.Errorf("2^64-1 is %s ahead", got)
	}
	if got := describeAhead(aheadMS(at(t0.Add(90*time.Second), 0), t0)); got != "1m30s" {
		t.Errorf("90s ahead described as %s", got)
	}
}

// recordsMsg is a runtime_records message from an older or another proxy.
func recordsMsg(t *testing.T, recs ...Record) []byte {
	t.Helper()
	b, err := json.Marshal(runtimeRecords{Kind: runtimeRecordsKind, Node: "declared-name", Records: recs})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A record more than MaxAhead ahead of the receiver's clock (a forged
// one, 2^64-1 among them, or a writer whose clock is off) is refused: not
// merged, not used to raise the clock, counted and logged at error level
// naming its origin and how far ahead it is. Writes go on winning.
func TestFutureRecordsRefused(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	clock := newClock(t0)
	r, err := New(Options{Logger: zap.New(core), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	net := newRuntimeNet(t)
	net.join("a", r)
	if _, err := r.Update(KindSet, "orders", put(Record{Stopped: ptr(true), Action: "stop"})); err != nil {
		t.Fatal(err)
	}
	r.handle("mallory.1", recordsMsg(t,
		Record{Set: "orders", Version: math.MaxUint64, Origin: "mallory", Deleted: true, Action: "delete"},
		Record{Kind: KindRestart, Set: "orders", Version: at(t0.Add(2*time.Minute), 0), Origin: "mallory", Action: "restart"},
		Record{Set: "users", Version: at(t0.Add(MaxAhead+time.Millisecond), 0), Origin: "skewed", Deleted: true, Action: "delete"},
	))
	if got, _ := r.Get(KindSet, "orders"); got.Deleted || got.Version != at(t0, 0) {
		t.Fatalf("orders: %+v; the forged delete must be refused", got)
	}
	if _, ok := r.Get(KindRestart, "orders"); ok {
		t.Fatal("a restart record 2 minutes ahead was merged")
	}
	if _, ok := r.Get(KindSet, "users"); ok {
		t.Fatal("a record just past the bound was merged")
	}
	if n := testutil.ToFloat64(r.refused.WithLabelValues("future")); n != 3 {
		t.Fatalf("refused %v, want 3", n)
	}
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("run-time record refused").All()
	if len(errs) != 2 { // one line per origin and sender
		t.Fatalf("%d error lines, want 2 (mallory, skewed): %v", len(errs), errs)
	}
	fields := errs[0].ContextMap()
	if fields["origin"] != "mallory" || fields["from"] != "mallory.1" || !strings.HasSuffix(fields["ahead"].(string), " years") ||
		!strings.Contains(errs[0].Message, "or the record is forged") {
		t.Fatalf("logged %q %v", errs[0].Message, fields)
	}
	if f := errs[1].ContextMap(); f["origin"] != "skewed" || f["ahead"] != "1m0.001s" {
		t.Fatalf("logged %v", f)
	}
	// The clock was not raised: the next write takes the wall clock.
	rec, err := r.Update(KindSet, "orders", put(Record{Stopped: ptr(false), Action: "start"}))
	if err != nil || rec.Version != at(t0, 1) {
		t.Fatalf("next write: %+v, %v; want version %d", rec, err, at(t0, 1))
	}

	// Sent again within the minute: counted, not logged again; after it,
	// logged with the count of those in between (mallory's restart record
	// above, and this one).
	r.handle("mallory.1", recordsMsg(t, Record{Set: "orders", Version: math.MaxUint64, Origin: "mallory"}))
	if n := len(logs.FilterMessageSnippet("run-time record refused").All()); n != 2 {
		t.Fatalf("%d refusal lines within the minute, want 2", n)
	}
	clock.Add(time.Minute)
	r.handle("mallory.1", recordsMsg(t, Record{Set: "orders", Version: math.MaxUint64, Origin: "mallory"}))
	all := logs.FilterMessageSnippet("run-time record refused").All()
	if len(all) != 3 || all[2].ContextMap()["refused_since_last_logged"] != int64(2) {
		t.Fatalf("after a minute: %d lines, last %v", len(all), all[len(all)-1].ContextMap())
	}
	if n := testutil.ToFloat64(r.refused.WithLabelValues("future")); n != 5 {
		t.Fatalf("refused %v, want 5", n)
	}
}

// A record ahead of this proxy's clock but within the bound (a peer's
// clock a little ahead) is merged, and the next local write still beats
// it.
func TestNearFutureRecordMergedAndBeaten(t *testing.T) {
	net := newRuntimeNet(t)
	a := net.add("a", "", nil)
	ahead := at(t0.Add(MaxAhead), 5)
	a.handle("b.1", recordsMsg(t, Record{Set: "orders", Version: ahead, Origin: "b", Stopped: ptr(true), Action: "stop"}))
	if got, _ := a.Get(KindSet, "orders"); got.Version != ahead {
		t.Fatalf("orders %+v; a record within the bound must merge", got)
	}
	rec, err := a.Update(KindSet, "orders", put(Record{Stopped: ptr(false), Action: "start"}))
	if err != nil || rec.Version != ahead+1 {
		t.Fatalf("next write %+v, %v; want version %d", rec, err, ahead+1)
	}
	// And on another set too: the clock is one.
	if rec, _ := a.Update(KindSet, "users", put(Record{Action: "clear"})); rec.Version != ahead+2 {
		t.Fatalf("users: version %d, want %d", rec.Version, ahead+2)
	}
}

// Versions of the previous keyway (a Lamport clock) from its proxies and
// its state files merge and order among themselves, and below every
// hybrid version.
func TestLamportVersionsOfTheOlderKeyway(t *testing.T) {
	net := newRuntimeNet(t)
	a := net.add("a", "", nil)
	a.handle("old.1", recordsMsg(t,
		Record{Set: "orders", Version: 5, Origin: "old", Stopped: ptr(true), Action: "stop"},
		Record{Set: "users", Version: 6, Origin: "old", Deleted: true, Action: "delete"}))
	a.handle("old.1", recordsMsg(t, Record{Set: "orders", Version: 4, Origin: "old", Stopped: ptr(false), Action: "start"}))
	if got, _ := a.Get(KindSet, "orders"); got.Version != 5 || !*got.Stopped {
		t.Fatalf("orders %+v; of two Lamport versions the higher wins", got)
	}
	rec, _ := a.Update(KindSet, "orders", put(Record{Stopped: ptr(false), Action: "start"}))
	if rec.Version != at(t0, 0) || rec.Version <= 6 {
		t.Fatalf("a write after Lamport versions: %d, want the wall clock's %d", rec.Version, at(t0, 0))
	}
	// An older proxy that has not heard of it writes its next Lamport
	// version: it loses to the hybrid one.
	a.handle("old.1", recordsMsg(t, Record{Set: "orders", Version: 7, Origin: "old", Stopped: ptr(true), Action: "stop"}))
	if got, _ := a.Get(KindSet, "orders"); got.Version != rec.Version || *got.Stopped {
		t.Fatalf("orders %+v; the hybrid version must win over Lamport 7", got)
	}
	// One that has heard of it writes it + 1, which wins.
	a.handle("old.1", recordsMsg(t, Record{Set: "orders", Version: rec.Version + 1, Origin: "old", Stopped: ptr(true), Action: "stop"}))
	if got, _ := a.Get(KindSet, "orders"); got.Version != rec.Version+1 || !*got.Stopped {
		t.Fatalf("orders %+v; the older proxy's later write must win", got)
	}
	// A state file of the older keyway: Lamport versions, format 1.
	dir := t.TempDir()
	file := `{"format":1,"records":[{"set":"orders","version":12,"origin":"edge-a","stopped":true,"action":"stop","at":"2025-06-01T00:00:00Z"}]}`
	if err := os.WriteFile(filepath.Join(dir, runtimeFileName), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	b := net.add("b", dir, nil)
	if got, _ := b.Get(KindSet, "orders"); got.Version != 12 {
		t.Fatalf("loaded %+v", got)
	}
	if rec, _ := b.Update(KindSet, "orders", put(Record{Action: "clear"})); rec.Version != at(t0, 0) {
		t.Fatalf("a write after loading Lamport versions: %d, want %d", rec.Version, at(t0, 0))
	}
}

// Versions go on rising across a restart: without a state directory from
// the wall clock, with one from the records it keeps (also when the clock
// has stepped back).
func TestVersionsRiseAcrossARestart(t *testing.T) {
	write := func(r *State, n int) (last uint64) {
		t.Helper()
		for i := range n {
			rec, err := r.Update(KindSet, "orders", put(Record{Replicas: ptr(i), Action: "scale"}))
			if err != nil {
				t.Fatal(err)
			}
			if rec.Version <= last {
				t.Fatalf("write %d: version %d after %d", i, rec.Version, last)
			}
			last = rec.Version
		}
		return last
	}
	// Without a state directory: the restarted proxy knows nothing of
	// the versions before, but the wall clock has moved on.
	before, err := New(Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	last := write(before, 100) // 100 writes in one millisecond
	restarted, err := New(Options{Now: func() time.Time { return t0.Add(time.Millisecond) }})
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := restarted.Update(KindSet, "orders", put(Record{Action: "clear"})); rec.Version <= last {
		t.Fatalf("after a restart without a state directory: version %d, before it %d", rec.Version, last)
	}

	// With one: the records and the clock come back.
	dir := t.TempDir()
	before, err = New(Options{Dir: dir, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	last = write(before, 10)
	restarted, err = New(Options{Dir: dir, Now: func() time.Time { return t0.Add(-time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := restarted.Get(KindSet, "orders"); got.Version != last {
		t.Fatalf("reloaded %+v, want version %d", got, last)
	}
	if rec, _ := restarted.Update(KindSet, "users", put(Record{Action: "clear"})); rec.Version != last+1 {
		t.Fatalf("after a restart with the clock an hour back: version %d, want %d", rec.Version, last+1)
	}
}

// The state file is this proxy's own: a record in it ahead of the clock
// is loaded (and logged); one of version 2^64-1 (accepted by an older
// keyway) leaves no version to write: Update says so.
func TestStateFileAheadOfTheClock(t *testing.T) {
	dir := t.TempDir()
	ahead := at(t0.Add(time.Hour), 0)
	file := fmt.Sprintf(`{"format":1,"records":[{"set":"orders","version":%d,"origin":"edge-a","action":"stop","stopped":true}]}`, ahead)
	if err := os.WriteFile(filepath.Join(dir, runtimeFileName), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.ErrorLevel)
	r, err := New(Options{Dir: dir, Logger: zap.New(core), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Get(KindSet, "orders"); got.Version != ahead {
		t.Fatalf("loaded %+v", got)
	}
	if logs.FilterMessageSnippet("ahead of this proxy's clock").FilterField(zap.String("ahead", "1h0m0s")).Len() != 1 {
		t.Fatalf("logged %v", logs.All())
	}
	if rec, _ := r.Update(KindSet, "orders", put(Record{Action: "clear"})); rec.Version != ahead+1 {
		t.Fatalf("next write %d, want %d", rec.Version, ahead+1)
	}

	file = fmt.Sprintf(`{"format":1,"records":[{"set":"orders","version":%d,"origin":"mallory"}]}`, uint64(math.MaxUint64))
	if err := os.WriteFile(filepath.Join(dir, runtimeFileName), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err = New(Options{Dir: dir, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Update(KindSet, "users", put(Record{Action: "clear"})); err == nil || !strings.Contains(err.Error(), runtimeFileName) {
		t.Fatalf("a write after 2^64-1: %v; want an error naming the state file", err)
	}
}

// A deleted set's record stays as a tombstone: a proxy that missed the
// delete and restarts from its state file (holding the set), with a clock
// that lags, does not bring the set back; it takes the tombstone.
func TestTombstoneOutlivesARestartedPeer(t *testing.T) {
	net := newRuntimeNet(t)
	a := net.add("a", "", nil)
	dir := t.TempDir()
	lagging := newClock(t0.Add(-30 * time.Second))
	b, err := New(Options{Dir: dir, Interval: time.Second, Now: lagging.Now})
	if err != nil {
		t.Fatal(err)
	}
	net.join("b", b)
	if _, err := b.Update(KindSet, "orders", put(Record{Spec: []byte(`{"name":"orders"}`), Action: "create"})); err != nil {
		t.Fatal(err)
	}
	net.pump()
	net.leave("b") // b is cut off, then stops, while the set is deleted
	if _, err := a.Update(KindSet, "orders", put(Record{Deleted: true, Action: "delete"})); err != nil {
		t.Fatal(err)
	}
	net.pump()
	b, err = New(Options{Dir: dir, Interval: time.Second, Now: lagging.Now})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Get(KindSet, "orders"); got.Deleted || len(got.Spec) == 0 {
		t.Fatalf("b restarted with %+v; the test wants the set it created", got)
	}
	net.join("b", b)
	net.tick()
	sameRecords(t, a, b)
	for name, r := range map[string]*State{"a": a, "b": b} {
		if got, _ := r.Get(KindSet, "orders"); !got.Deleted || got.Origin != "a" {
			t.Fatalf("%s has %+v; the tombstone must win", name, got)
		}
	}
	again, err := New(Options{Dir: dir, Now: lagging.Now})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := again.Get(KindSet, "orders"); !got.Deleted {
		t.Fatalf("b's state file holds %+v; want the tombstone", got)
	}
}
