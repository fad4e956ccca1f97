package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/balancer"
)

// connectErr mimics the proxy's DialError.
type connectErr struct{ err error }

func (e *connectErr) Error() string        { return "dial: " + e.err.Error() }
func (e *connectErr) Unwrap() error        { return e.err }
func (e *connectErr) ConnectFailure() bool { return true }

func TestClassify(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	timeoutDial := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	cases := map[string]struct {
		status int
		err    error
		want   kind
	}{
		"200":                      {200, nil, kindNone},
		"404 is the client's":      {404, nil, kindNone},
		"499":                      {499, nil, kindNone},
		"500":                      {500, nil, kind5xx},
		"503":                      {503, nil, kind5xx},
		"599":                      {599, nil, kind5xx},
		"ConnectFailure":           {0, &connectErr{errors.New("x")}, kindConnect},
		"ConnectFailure wrapped":   {0, fmt.Errorf("attempt 1: %w", &connectErr{errors.New("x")}), kindConnect},
		"dial timeout is connect":  {0, &connectErr{timeoutDial}, kindConnect},
		"net dial error":           {0, timeoutDial, kindConnect},
		"refused anywhere":         {0, refused, kindConnect},
		"joined connect":           {0, errors.Join(errors.New("a"), &connectErr{errors.New("x")}), kindConnect},
		"deadline":                 {0, context.DeadlineExceeded, kindTimeout},
		"os deadline wrapped":      {0, fmt.Errorf("read: %w", os.ErrDeadlineExceeded), kindTimeout},
		"net read timeout":         {0, &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, kindTimeout},
		"reset":                    {0, &net.OpError{Op: "read", Err: syscall.ECONNRESET}, kindReset},
		"EOF":                      {0, io.ErrUnexpectedEOF, kindReset},
		"plain error":              {0, errors.New("malformed response"), kindReset},
		"err wins over the status": {200, errors.New("x"), kindReset},
		"ConnectFailure false":     {0, falseConnect{}, kindReset},
	}
	for name, tc := range cases {
		if got := classify(tc.status, tc.err); got != tc.want {
			t.Errorf("%s: classify(%d, %v) = %q, want %q", name, tc.status, tc.err, got, tc.want)
		}
	}
}

type falseConnect struct{}

func (falseConnect) Error() string        { return "not a connect failure" }
func (falseConnect) ConnectFailure() bool { return false }

// The whole passive cycle with an injected clock: N consecutive 5xx eject
// once, on the N-th (no sweep needed); readmission after BaseEjection; a
// repeat doubles; a success after readmission resets the backoff.
func TestPassiveEjectReadmitBackoff(t *testing.T) {
	t.Parallel()
	cfg := passiveConfig()
	f := newFixture(t, cfg)
	f.c.SetTargets("s", targets("s", "a", "b"))
	ej := call{"s", "a", balancer.ReasonEjected, true}
	back := call{"s", "a", balancer.ReasonEjected, false}

	f.fail("s", "a", 4)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take()) // 4 < 5: nothing

	t0 := f.clock.Add(time.Second)
	f.fail("s", "a", 1)
	callsEqual(t, f.sink.take(), ej)
	f.fail("s", "a", 20) // in-flight requests failing while ejected
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take()) // once, not per failure or per sweep
	if n := testutil.ToFloat64(f.c.metrics.capped.WithLabelValues("s")); n != 0 {
		t.Fatalf("failures while ejected were taken for a new trip (capped %v)", n)
	}
	ev := f.ev.take()
	if len(ev) != 1 || ev[0].Kind != EventEjected || ev[0].Reason != "5xx" || !ev[0].Until.Equal(t0.Add(10*time.Second)) || ev[0].Ejections != 1 {
		t.Fatalf("events = %+v", ev)
	}
	if h := f.c.Snapshot("s")[0]; !h.EjectedUntil.Equal(t0.Add(10*time.Second)) || h.Excluded != "ejected" || h.LastReason != "5xx" || h.NextEjection != 20*time.Second {
		t.Fatalf("snapshot = %+v", h)
	}

	// Readmitted when BaseEjection has passed, not before.
	f.sweepAfter(t0.Add(10*time.Second - time.Millisecond).Sub(f.clock.Now()))
	callsEqual(t, f.sink.take())
	f.sweepAfter(time.Millisecond)
	callsEqual(t, f.sink.take(), back)
	if ev := f.ev.take(); !slices.Equal(kinds(ev), []string{"readmitted a"}) || ev[0].Reason != "backoff elapsed" {
		t.Fatalf("events = %+v", ev)
	}

	// Failing again without a success in between: twice as long.
	t1 := f.clock.Add(time.Second)
	f.fail("s", "a", 5)
	callsEqual(t, f.sink.take(), ej)
	if ev := f.ev.take(); ev[0].Until.Sub(t1) != 20*time.Second || ev[0].Ejections != 2 {
		t.Fatalf("second ejection: %+v, want 20s", ev)
	}
	f.sweepAfter(20*time.Second - time.Millisecond)
	callsEqual(t, f.sink.take())
	f.sweepAfter(time.Millisecond)
	callsEqual(t, f.sink.take(), back)

	// Once more: 40s. Then a success after readmission resets it to 10s.
	t2 := f.clock.Add(time.Second)
	f.fail("s", "a", 5)
	if ev := f.ev.take(); len(ev) != 2 || ev[1].Until.Sub(t2) != 40*time.Second {
		t.Fatalf("third ejection: %+v, want 40s", ev)
	}
	f.sweepAfter(40 * time.Second)
	callsEqual(t, f.sink.take(), ej, back)
	f.c.Observe("s", "a", 200, nil, time.Millisecond)
	f.sweepAfter(time.Second)
	if h := f.c.Snapshot("s")[0]; h.NextEjection != 10*time.Second {
		t.Fatalf("after a success, next ejection %s, want 10s", h.NextEjection)
	}
	t3 := f.clock.Add(time.Second)
	f.fail("s", "a", 5)
	callsEqual(t, f.sink.take(), ej)
	if ev := f.ev.take(); ev[len(ev)-1].Until.Sub(t3) != 10*time.Second {
		t.Fatalf("after reset: %+v, want 10s", ev)
	}
	// b never failed: never touched.
	if r := f.sink.reasons("s", "b"); r != 0 {
		t.Fatalf("b excluded: %s", r)
	}
}

// reentrantSink is a Sink that calls back into the Checker as the proxy's
// does (a Router hook calls SetTargets, the admin API Snapshot): a Sink
// call made while the Checker holds its own lock would deadlock.
type reentrantSink struct {
	*recSink
	c  *Checker
	ts []Target
}

func (s *reentrantSink) SetExcluded(set, replica string, reason balancer.Reason, excluded bool) {
	s.c.SetTargets(set, s.ts)
	s.c.Snapshot(set)
	s.recSink.SetExcluded(set, replica, reason, excluded)
}

// The failure that makes the count reach
// passive.consecutive_failures ejects the replica before its Observe
// returns — Sink told, event delivered, metrics and snapshot updated, the
// ejection timed from that moment — with no sweep and no Run, so that
// request is the last one routed to the replica.
func TestPassiveEjectOnThreshold(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			cfg := passiveConfig()
			cfg.Passive.ConsecutiveFailures = n
			f := newFixture(t, cfg)
			ts := targets("s", "a", "b")
			sink := &reentrantSink{recSink: f.sink, ts: ts}
			c, err := NewChecker(cfg, sink, Options{Now: f.clock.Now, OnEvent: f.ev.add})
			if err != nil {
				t.Fatal(err)
			}
			sink.c, f.c = c, c
			c.SetTargets("s", ts)

			timeout := context.DeadlineExceeded
			for range n - 1 {
				c.Observe("s", "a", 0, timeout, time.Millisecond)
			}
			callsEqual(t, f.sink.take())
			if h := c.Snapshot("s")[0]; h.ConsecutiveFailures != int64(n-1) || h.Excluded != "none" {
				t.Fatalf("after %d failures: %+v", n-1, h)
			}
			now := f.clock.Add(time.Second)
			c.Observe("s", "a", 0, timeout, time.Millisecond)
			callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonEjected, true})
			ev := f.ev.take()
			if len(ev) != 1 || ev[0].Kind != EventEjected || ev[0].Replica != "a" || ev[0].Reason != "timeout" ||
				!ev[0].Time.Equal(now) || !ev[0].Until.Equal(now.Add(10*time.Second)) || ev[0].Ejections != 1 {
				t.Fatalf("events = %+v", ev)
			}
			h := c.Snapshot("s")[0]
			if h.Excluded != "ejected" || !h.EjectedUntil.Equal(now.Add(10*time.Second)) || h.LastReason != "timeout" ||
				h.Ejections != 1 || h.EjectionsTotal != 1 || h.ConsecutiveFailures != 0 || h.NextEjection != 20*time.Second {
				t.Fatalf("snapshot = %+v", h)
			}
			if v := testutil.ToFloat64(c.metrics.ejections.WithLabelValues("s", "a", "timeout")); v != 1 {
				t.Fatalf("keyway_ejections_total = %v, want 1", v)
			}
			if v := testutil.ToFloat64(c.metrics.ejected.WithLabelValues("s")); v != 1 {
				t.Fatalf("keyway_ejected_replicas = %v, want 1", v)
			}

			// A sweep has nothing left to do; requests that were in flight
			// fail while a is out, and that ejects nothing more.
			f.sweepAfter(time.Second)
			for range 2 * n {
				c.Observe("s", "a", 0, timeout, time.Millisecond)
			}
			f.sweepAfter(time.Second)
			callsEqual(t, f.sink.take())
			if ev := f.ev.take(); len(ev) != 0 {
				t.Fatalf("events after the ejection: %+v", ev)
			}
		})
	}
}

// Many requests failing at once: exactly one of them ejects the replica,
// once.
func TestPassiveEjectOnThresholdConcurrent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, passiveConfig())
	f.c.SetTargets("s", targets("s", "a", "b"))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				f.c.Observe("s", "a", 502, nil, time.Millisecond)
			}
		})
	}
	wg.Wait()
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonEjected, true})
	if ev := f.ev.take(); !slices.Equal(kinds(ev), []string{"ejected a"}) {
		t.Fatalf("events = %+v", ev)
	}
}

// The backoff stops doubling at MaxEjection.
func TestPassiveBackoffCap(t *testing.T) {
	t.Parallel()
	cfg := passiveConfig()
	cfg.Passive.BaseEjection = time.Second
	cfg.Passive.MaxEjection = 5 * time.Second
	f := newFixture(t, cfg)
	f.c.SetTargets("s", targets("s", "a", "b"))
	var got []time.Duration
	for range 5 {
		now := f.clock.Add(100 * time.Millisecond)
		f.fail("s", "a", 5)
		ev := f.ev.take()
		got = append(got, ev[0].Until.Sub(now))
		f.sweepAfter(ev[0].Until.Sub(now))
		f.ev.take()
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("ejections %v, want %v", got, want)
	}
}

// A success resets the run of failures; a trip is latched even if a
// success follows before the sweep; outcomes not in Count neither count
// nor reset.
func TestPassiveConsecutive(t *testing.T) {
	t.Parallel()
	t.Run("success resets the run", func(t *testing.T) {
		f := newFixture(t, passiveConfig())
		f.c.SetTargets("s", targets("s", "a", "b"))
		f.fail("s", "a", 4)
		f.c.Observe("s", "a", 204, nil, 0)
		f.fail("s", "a", 4)
		f.sweepAfter(time.Second)
		callsEqual(t, f.sink.take())
		if h := f.c.Snapshot("s")[0]; h.ConsecutiveFailures != 4 {
			t.Fatalf("consecutive = %d, want 4", h.ConsecutiveFailures)
		}
	})
	t.Run("trip latched", func(t *testing.T) {
		f := newFixture(t, passiveConfig())
		f.c.SetTargets("s", targets("s", "a", "b"))
		f.fail("s", "a", 5)
		f.c.Observe("s", "a", 200, nil, 0)
		f.sweepAfter(time.Second)
		callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonEjected, true})
	})
	t.Run("unknown replica ignored", func(t *testing.T) {
		f := newFixture(t, passiveConfig())
		f.c.SetTargets("s", targets("s", "a", "b"))
		f.fail("s", "zz", 10)
		f.fail("other", "a", 10)
		f.sweepAfter(time.Second)
		callsEqual(t, f.sink.take())
	})
}

// Which outcomes count is passive.count.
func TestPassiveCount(t *testing.T) {
	t.Parallel()
	connect := &connectErr{syscall.ECONNREFUSED}
	timeout := context.DeadlineExceeded
	reset := &net.OpError{Op: "read", Err: syscall.ECONNRESET}
	type outcome struct {
		status int
		err    error
	}
	o5xx := outcome{502, nil}
	oConn, oTime, oReset := outcome{0, connect}, outcome{0, timeout}, outcome{0, reset}
	cases := map[string]struct {
		count   []string
		seq     []outcome
		eject   bool
		because string
	}{
		"connects, all counted":          {nil, []outcome{oConn, oConn, oConn, oConn, oConn}, true, "connect"},
		"timeouts, all counted":          {nil, []outcome{oTime, oTime, oTime, oTime, oTime}, true, "timeout"},
		"resets, all counted":            {nil, []outcome{oReset, oReset, oReset, oReset, oReset}, true, "reset"},
		"mixed, the 5th decides":         {nil, []outcome{oConn, o5xx, oReset, oTime, oConn}, true, "connect"},
		"timeouts, not counted":          {[]string{"connect", "5xx"}, []outcome{oTime, oTime, oTime, oTime, oTime, oTime}, false, ""},
		"5xx, not counted":               {[]string{"connect", "timeout", "reset"}, []outcome{o5xx, o5xx, o5xx, o5xx, o5xx}, false, ""},
		"connects only":                  {[]string{"connect"}, []outcome{oConn, oConn, oConn, oConn, oConn}, true, "connect"},
		"uncounted do not break the run": {[]string{"timeout"}, []outcome{oTime, oTime, o5xx, oReset, oTime, oConn, oTime, oTime}, true, "timeout"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := passiveConfig()
			if tc.count != nil {
				cfg.Passive.Count = tc.count
			}
			f := newFixture(t, cfg)
			f.c.SetTargets("s", targets("s", "a", "b"))
			for _, o := range tc.seq {
				f.c.Observe("s", "a", o.status, o.err, time.Millisecond)
			}
			f.sweepAfter(time.Second)
			got := f.sink.reasons("s", "a")&balancer.ReasonEjected != 0
			if got != tc.eject {
				t.Fatalf("ejected = %v, want %v", got, tc.eject)
			}
			if tc.eject {
				if ev := f.ev.take(); ev[0].Reason != tc.because {
					t.Fatalf("reason %q, want %q", ev[0].Reason, tc.because)
				}
				if n := testutil.ToFloat64(f.c.metrics.ejections.WithLabelValues("s", "a", tc.because)); n != 1 {
					t.Fatalf("keyway_ejections_total{reason=%q} = %v", tc.because, n)
				}
			}
		})
	}
}

func TestMaxOut(t *testing.T) {
	t.Parallel()
	cases := []struct {
		share float64
		n     []int // targets 1..len(n)
	}{
		{0.5, []int{0, 1, 1, 2, 2, 3, 3, 4}},
		{0.1, []int{0, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{1, []int{1, 2, 3, 4}},
		{0.34, []int{0, 1, 1, 1, 1, 2}},
		{0.3, []int{0, 1, 1, 1, 1, 1, 2, 2, 2, 3}}, // 10*0.3 is 2.9999...: still 3
	}
	for _, tc := range cases {
		cfg := passiveConfig()
		cfg.Passive.MaxEjectedShare = tc.share
		f := newFixture(t, cfg)
		for i, want := range tc.n {
			if got := f.c.maxOut(i + 1); got != want {
				t.Errorf("share %v, %d targets: %d may be out, want %d", tc.share, i+1, got, want)
			}
		}
	}
}

// With 4 targets all failing and max_ejected_share 0.5, the first 2 to
// reach the threshold are ejected at once and the other 2 counted as
// capped, at once too (once each, not per sweep); when room frees, the
// one of them with the longest run of failures takes it.
func TestPassiveShareCap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, passiveConfig())
	f.c.SetTargets("s", targets("s", "a", "b", "c", "d"))
	t0 := f.clock.Now()
	f.fail("s", "a", 5)
	f.clock.Add(time.Second)
	for _, r := range []string{"b", "c", "d"} {
		f.fail("s", r, 5)
	}
	callsEqual(t, f.sink.take(),
		call{"s", "a", balancer.ReasonEjected, true},
		call{"s", "b", balancer.ReasonEjected, true})
	if n := testutil.ToFloat64(f.c.metrics.capped.WithLabelValues("s")); n != 2 {
		t.Fatalf("capped = %v, want 2", n)
	}
	if n := testutil.ToFloat64(f.c.metrics.ejected.WithLabelValues("s")); n != 2 {
		t.Fatalf("ejected gauge = %v, want 2", n)
	}
	// c and d keep failing, d more: still capped, not counted again.
	for range 3 {
		f.fail("s", "c", 5)
		f.fail("s", "d", 6)
		f.sweepAfter(time.Second)
	}
	callsEqual(t, f.sink.take())
	if n := testutil.ToFloat64(f.c.metrics.capped.WithLabelValues("s")); n != 2 {
		t.Fatalf("capped = %v after more sweeps, want 2", n)
	}
	snap := f.c.Snapshot("s")
	if snap[0].ShareCapped || snap[1].ShareCapped || !snap[2].ShareCapped || !snap[3].ShareCapped {
		t.Fatalf("snapshot share_capped: %+v", snap)
	}
	// a's ejection ends first: one room, which d (the longer run) takes.
	f.sweepAfter(t0.Add(10 * time.Second).Sub(f.clock.Now()))
	callsEqual(t, f.sink.take(),
		call{"s", "a", balancer.ReasonEjected, false},
		call{"s", "d", balancer.ReasonEjected, true})
	// c answers once: no longer a candidate. When b is readmitted, nobody
	// takes the room.
	f.c.Observe("s", "c", 200, nil, 0)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take(), call{"s", "b", balancer.ReasonEjected, false})
	if n := testutil.ToFloat64(f.c.metrics.ejected.WithLabelValues("s")); n != 1 {
		t.Fatalf("ejected gauge = %v, want 1", n)
	}
	if snap := f.c.Snapshot("s"); snap[2].ShareCapped {
		t.Fatalf("c still share-capped after a success: %+v", snap[2])
	}
}

// A set of one is never ejected (share 0.5); with share 1 it is.
func TestPassiveSingleReplica(t *testing.T) {
	t.Parallel()
	f := newFixture(t, passiveConfig())
	f.c.SetTargets("s", targets("s", "a"))
	f.fail("s", "a", 50)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take())

	cfg := passiveConfig()
	cfg.Passive.MaxEjectedShare = 1
	f = newFixture(t, cfg)
	f.c.SetTargets("s", targets("s", "a"))
	f.fail("s", "a", 5)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take(), call{"s", "a", balancer.ReasonEjected, true})
}

// Passive checks off: Observe does nothing, no ejection series exist.
func TestPassiveDisabled(t *testing.T) {
	t.Parallel()
	cfg := passiveConfig()
	cfg.Passive.Enabled = false
	f := newFixture(t, cfg)
	f.c.SetTargets("s", targets("s", "a", "b"))
	f.fail("s", "a", 50)
	f.sweepAfter(time.Second)
	callsEqual(t, f.sink.take())
	if n := testutil.CollectAndCount(f.c.metrics.ejections); n != 0 {
		t.Fatalf("%d ejection series with passive off", n)
	}
}
