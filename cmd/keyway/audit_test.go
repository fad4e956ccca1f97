package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"keyway/balancer"
	"keyway/eventlog"
	"keyway/eventlog/objstore"
	"keyway/internal/poll"
)

// sampleTrail is what writeSampleTrail wrote: set orders on two proxies,
// the replica owning order-42 ejected at 03:12 and back at 03:15, a
// scale-out to four replicas at 03:20.
type sampleTrail struct {
	dir       string
	owner     string // order-42's owner
	standIn   string // where its keys went while the owner was out
	partition int
	runs      []string
}

var trailT0 = time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC)

// writeSampleTrail writes two proxies' runs into a directory holding the
// object-storage layout, through the real audit log and sink.
func writeSampleTrail(t *testing.T) sampleTrail {
	t.Helper()
	fp := balancer.DefaultHashConfig().Fingerprint()
	three := []string{"orders-0", "orders-1", "orders-2"}
	four := append(slices.Clone(three), "orders-3")
	st := sampleTrail{dir: t.TempDir(), partition: int(balancer.HashString("order-42") % uint64(balancer.DefaultHashConfig().Partitions))}
	pl, err := balancer.PlaceRecorded(fp, three, three, balancer.FailoverNext, st.partition)
	if err != nil {
		t.Fatal(err)
	}
	st.owner = pl.Owner
	without := slices.DeleteFunc(slices.Clone(three), func(s string) bool { return s == st.owner })
	pl, _ = balancer.PlaceRecorded(fp, three, without, balancer.FailoverNext, st.partition)
	st.standIn = pl.Pick
	ring := func(kind string, at time.Duration, members, rotation []string) eventlog.Event {
		return eventlog.Event{Time: trailT0.Add(at), Kind: kind, Set: "orders", Fields: map[string]any{
			"fingerprint": fp, "members": members, "rotation": rotation, "failover": "next", "cause": "replicas",
		}}
	}
	for i, node := range []string{"proxy-a", "proxy-b"} {
		skew := time.Duration(i) * 40 * time.Millisecond
		run := objstore.RunID(trailT0.Add(-time.Minute+skew), node)
		st.runs = append(st.runs, run)
		sc := objstore.DefaultSinkConfig()
		sc.Prefix, sc.Run, sc.SegmentAge, sc.SegmentBytes = "", run, time.Hour, 600 // several segments per run
		sink := objstore.NewSink(sc, objstore.Dir{Root: st.dir}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { sink.Run(ctx); close(done) }()
		l, err := eventlog.New(eventlog.DefaultConfig(), node, eventlog.Options{Sink: sink})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range []eventlog.Event{
			ring(eventlog.KindRingRebuild, skew, three, three),
			{Time: trailT0.Add(time.Minute), Kind: eventlog.KindConfigReload, Fields: map[string]any{"result": "applied"}},
			{Time: trailT0.Add(12*time.Minute + skew), Kind: eventlog.KindEjected, Set: "orders", Replica: st.owner, Fields: map[string]any{"reason": "5xx"}},
			ring(eventlog.KindRotationChange, 12*time.Minute+skew, three, without),
			{Time: trailT0.Add(13 * time.Minute), Kind: eventlog.KindEjected, Set: "orders", Replica: st.other(three)},
			{Time: trailT0.Add(15*time.Minute + skew), Kind: eventlog.KindReadmitted, Set: "orders", Replica: st.owner},
			ring(eventlog.KindRotationChange, 15*time.Minute+skew, three, three),
			ring(eventlog.KindRingRebuild, 20*time.Minute+skew, four, four),
			{Time: trailT0.Add(40 * time.Minute), Kind: eventlog.KindEjected, Set: "orders", Replica: st.owner},
		} {
			l.Emit(e)
		}
		cancel()
		<-done
		if sink.Dropped() != 0 {
			t.Fatalf("sink dropped %d events", sink.Dropped())
		}
	}
	return st
}

// other is a replica of three that is neither the owner nor the stand-in.
func (st sampleTrail) other(three []string) string {
	for _, r := range three {
		if r != st.owner && r != st.standIn {
			return r
		}
	}
	return ""
}

func TestAuditCLI(t *testing.T) {
	st := writeSampleTrail(t)
	from := []string{"--from", st.dir}

	out, _, err := keywayCLI(t, append([]string{"audit", "sets"}, from...)...)
	if err != nil || out != "orders\n~fleet\t(events of no set: reloads, refused gossip, …)\n" && out != "~fleet\t(events of no set: reloads, refused gossip, …)\norders\n" {
		t.Fatalf("audit sets: %q %v", out, err)
	}
	out, _, err = keywayCLI(t, append([]string{"audit", "runs", "orders"}, from...)...)
	if err != nil || !strings.Contains(out, st.runs[0]) || !strings.Contains(out, st.runs[1]) || !strings.Contains(out, "proxy-a") || !strings.Contains(out, "2026-12-03T02:59:00Z") {
		t.Fatalf("audit runs: %q %v", out, err)
	}
	t.Logf("keyway audit runs orders:\n%s", out)

	// The partition question, across both proxies' runs.
	out, errOut, err := keywayCLI(t, append([]string{"audit", "--set", "orders", "--key", "order-42", "--since", "2026-12-03T03:10:00Z", "--until", "2026-12-03T03:30:00Z"}, from...)...)
	if err != nil || errOut != "" {
		t.Fatalf("audit --key: %v %s", err, errOut)
	}
	t.Logf("keyway audit --set orders --key order-42:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, node := range []string{"proxy-a", "proxy-b"} {
		var got []string
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 3 && f[1] == node {
				got = append(got, f[3]+" "+l[strings.Index(l, "| partition"):])
			}
		}
		part := fmt.Sprintf("| partition %d: ", st.partition)
		want := []string{
			"ring_rebuild " + part + fmt.Sprintf("in force at the window's start: owner %s, taken by %s", st.owner, st.owner),
			"ejected " + part + fmt.Sprintf("owner %s, taken by %s", st.owner, st.owner),
			"rotation_change " + part + fmt.Sprintf("moved: taken by %s → %s (owner %s)", st.owner, st.standIn, st.owner),
			"readmitted " + part + fmt.Sprintf("owner %s, taken by %s", st.owner, st.standIn),
			"rotation_change " + part + fmt.Sprintf("moved: taken by %s → %s (owner %s)", st.standIn, st.owner, st.owner),
		}
		pl, _ := balancer.PlaceRecorded(balancer.DefaultHashConfig().Fingerprint(), []string{"orders-0", "orders-1", "orders-2", "orders-3"}, []string{"orders-0", "orders-1", "orders-2", "orders-3"}, balancer.FailoverNext, st.partition)
		if pl.Owner != st.owner {
			want = append(want, "ring_rebuild "+part+fmt.Sprintf("moved: owner %s → %s, taken by %s → %s", st.owner, pl.Owner, st.owner, pl.Owner))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s's timeline of order-42:\n%s\nwant:\n%s", node, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if strings.Contains(out, st.other([]string{"orders-0", "orders-1", "orders-2"})+" ") && st.other([]string{"orders-0", "orders-1", "orders-2"}) != "" {
		t.Errorf("the ejection of a replica that neither owns nor takes the partition is in its timeline:\n%s", out)
	}

	// JSON lines carry the stream and the placement.
	out, _, err = keywayCLI(t, append([]string{"audit", "--set", "orders", "--partition", fmt.Sprint(st.partition), "--kind", "rotation_change", "--json"}, from...)...)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e struct {
			Kind      string `json:"kind"`
			Seq       int    `json:"seq"`
			Stream    string `json:"stream"`
			Placement struct {
				Partition int    `json:"partition"`
				Pick      string `json:"pick"`
			} `json:"placement"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Kind != "rotation_change" || e.Seq < 1 || !strings.HasPrefix(e.Stream, "orders/run-") || e.Placement.Partition != st.partition {
			t.Fatalf("json line %q: %+v %v", l, e, err)
		}
		n++
	}
	if n != 4 {
		t.Fatalf("%d rotation changes, want 4 (2 per proxy):\n%s", n, out)
	}

	// Filters by replica and time, over the set and the events of none.
	out, _, err = keywayCLI(t, append([]string{"audit", "--replica", st.owner, "--kind", "ejected", "--since", "2026-12-03T03:30:00Z"}, from...)...)
	if err != nil || strings.Count(out, "\n") != 2 || strings.Count(out, " ejected  "+st.owner) != 2 {
		t.Fatalf("audit --replica --kind --since: %q %v", out, err)
	}
	out, _, err = keywayCLI(t, append([]string{"audit", "--set", "-"}, from...)...)
	if err != nil || strings.Count(out, "config_reload") != 2 || strings.Contains(out, "orders") {
		t.Fatalf("audit --set -: %q %v", out, err)
	}

	// Mistakes name the flag and the fix.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "--partition", "3"}, "set: a partition or a key is one set's"},
		{[]string{"audit", "--set", "orders", "--since", "yesterday"}, `--since: "yesterday" is neither an RFC 3339 time`},
		{[]string{"audit", "runs"}, "keyway audit runs SET: give one set"},
		{[]string{"audit", "--from", "/nonexistent/trail"}, `--from: "/nonexistent/trail" is not a directory`},
		{[]string{"audit", "--from", "gs://bucket/x"}, "only s3:// addresses and directories"},
		{[]string{"audit", "--from", "s3://"}, "is not an object-storage address"},
	} {
		args := c.args
		if !slices.Contains(args, "--from") {
			args = append(args, from...)
		}
		_, _, err := keywayCLI(t, args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("keyway %s: %v, want %q", strings.Join(args, " "), err, c.want)
		}
	}
}

// --follow prints the events the proxies write after it started.
func TestAuditFollow(t *testing.T) {
	st := writeSampleTrail(t)
	var mu sync.Mutex
	var out bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"audit", "--from", st.dir, "--set", "orders", "--kind", "phase_change", "--follow", "--interval", "20ms"}, w, w)
	}()
	// A third proxy's run starts writing.
	sc := objstore.DefaultSinkConfig()
	sc.Run, sc.SegmentAge = objstore.RunID(time.Now(), "proxy-c"), time.Hour
	sink := objstore.NewSink(sc, objstore.Dir{Root: st.dir}, nil)
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan struct{})
	go func() { sink.Run(sctx); close(sdone) }()
	l, err := eventlog.New(eventlog.DefaultConfig(), "proxy-c", eventlog.Options{Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(eventlog.KindPhaseChange, "orders", "", map[string]any{"phase": "degraded"})
	scancel()
	<-sdone
	ok := poll.Within(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(out.String(), "proxy-c  orders  phase_change phase=degraded")
	})
	cancel()
	if rerr := <-done; rerr != nil {
		t.Fatalf("follow returned %v", rerr)
	}
	if !ok {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("follow never printed proxy-c's event: %q", out.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
