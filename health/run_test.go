package health

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"keyway/balancer"
)

// These tests run Run inside a testing/synctest bubble: its clock is fake,
// so advance(d) below returns as soon as every goroutine of the bubble is
// blocked, with d elapsed on the fake clock — no real waiting. Probes go
// through an in-memory RoundTripper (real sockets are not durably
// blocking, so they do not belong in a bubble).

// advance moves the bubble's fake clock forward by d, then lets every
// goroutine run until it blocks. Only inside synctest.Test.
func advance(d time.Duration) {
	<-time.After(d)
	synctest.Wait()
}

// scripted is an in-memory RoundTripper: each call records itself and then
// blocks until answer returns a status for it.
type scripted struct {
	mu       sync.Mutex
	calls    map[string][]time.Time // host → start times
	inFlight map[string]int
	maxHost  int // most concurrent calls to one host seen
	maxAll   int // most concurrent calls in all
	all      int
	// answer returns the status of a call, blocking as long as it likes.
	answer func(req *http.Request) int
}

func newScripted(answer func(*http.Request) int) *scripted {
	return &scripted{calls: map[string][]time.Time{}, inFlight: map[string]int{}, answer: answer}
}

func (s *scripted) RoundTrip(req *http.Request) (*http.Response, error) {
	h := req.URL.Host
	s.mu.Lock()
	s.calls[h] = append(s.calls[h], time.Now())
	s.inFlight[h]++
	s.all++
	s.maxHost = max(s.maxHost, s.inFlight[h])
	s.maxAll = max(s.maxAll, s.all)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight[h]--
		s.all--
		s.mu.Unlock()
	}()
	st := s.answer(req)
	if st == 0 {
		return nil, errors.New("scripted transport error")
	}
	return &http.Response{StatusCode: st, Body: http.NoBody, Request: req}, nil
}

func (s *scripted) count(host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls[host])
}

// runBubble starts c.Run in the bubble and returns a func that stops it
// and checks that it returned.
func runBubble(t *testing.T, c *Checker) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		default:
			t.Error("Run did not return after its context ended")
		}
	}
}

func bubbleChecker(t *testing.T, cfg Config, sink Sink, rt http.RoundTripper, ev *events) *Checker {
	opts := Options{Logger: zaptest.NewLogger(t), Registerer: prometheus.NewPedanticRegistry(), Client: &http.Client{Transport: rt}}
	if ev != nil {
		opts.OnEvent = ev.add
	}
	c, err := NewChecker(cfg, sink, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Passive checks through Run: the fifth failure ejects before its
// Observe returns, with no time passing; the sweeper readmits at its first
// tick after the ejection.
func TestRunPassive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := newRecSink(t)
		ev := &events{}
		c := bubbleChecker(t, passiveConfig(), sink, nil, ev)
		stop := runBubble(t, c)
		defer stop()
		c.SetTargets("s", targets("s", "a", "b"))
		for range 4 {
			c.Observe("s", "a", 500, nil, 0)
		}
		synctest.Wait()
		callsEqual(t, sink.take())
		c.Observe("s", "a", 500, nil, 0)
		callsEqual(t, sink.take(), call{"s", "a", balancer.ReasonEjected, true})
		advance(9999 * time.Millisecond)
		callsEqual(t, sink.take())
		advance(time.Millisecond) // the tick at 10 s
		callsEqual(t, sink.take(), call{"s", "a", balancer.ReasonEjected, false})
		if !slices.Equal(kinds(ev.take()), []string{"ejected a", "readmitted a"}) {
			t.Fatal("events")
		}
	})
}

// At most one probe in flight per target, however long a probe takes,
// and at most active.concurrency in all.
func TestRunOneProbeInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		rt := newScripted(func(*http.Request) int { <-release; return 200 })
		cfg := activeConfig()
		cfg.Active.Concurrency = 3
		c := bubbleChecker(t, cfg, newRecSink(t), rt, nil)
		stop := runBubble(t, c)
		c.SetTargets("s", targets("s", "a", "b", "c", "d", "e"))
		advance(10 * cfg.Active.Interval) // each probe hangs (the transport ignores the timeout)
		rt.mu.Lock()
		started := 0
		for _, calls := range rt.calls {
			started += len(calls)
		}
		maxHost, maxAll := rt.maxHost, rt.maxAll
		rt.mu.Unlock()
		if started != 3 || maxAll != 3 || maxHost != 1 {
			t.Fatalf("%d probes started, %d at once, %d at once on one target; want 3, 3, 1", started, maxAll, maxHost)
		}
		close(release) // probes now return at once
		advance(10 * cfg.Active.Interval)
		for _, tg := range targets("s", "a", "b", "c", "d", "e") {
			if n := rt.count(tg.Addr); n < 5 {
				t.Errorf("%s: %d probes in 10 intervals after the release", tg.Replica, n)
			}
		}
		if rt.maxHost != 1 {
			t.Fatalf("%d probes in flight on one target", rt.maxHost)
		}
		stop()
	})
}

// The first probe of each target comes after a random delay within one
// interval; then one every interval.
func TestRunJitterAndCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newScripted(func(*http.Request) int { return 200 })
		cfg := activeConfig()
		cfg.Active.Interval = time.Second
		cfg.Active.Timeout = 100 * time.Millisecond
		c := bubbleChecker(t, cfg, newRecSink(t), rt, nil)
		stop := runBubble(t, c)
		defer stop()
		start := time.Now()
		var names []string
		for i := range 20 {
			names = append(names, string(rune('a'+i)))
		}
		ts := targets("s", names...)
		c.SetTargets("s", ts)
		advance(5*time.Second + time.Millisecond)
		firsts := map[time.Duration]bool{}
		for _, tg := range ts {
			rt.mu.Lock()
			calls := slices.Clone(rt.calls[tg.Addr])
			rt.mu.Unlock()
			if len(calls) != 5 && len(calls) != 6 {
				t.Fatalf("%s: %d probes in 5 intervals", tg.Replica, len(calls))
			}
			first := calls[0].Sub(start)
			if first < 0 || first >= time.Second {
				t.Fatalf("%s: first probe after %s, want within one interval", tg.Replica, first)
			}
			firsts[first] = true
			for i := 1; i < len(calls); i++ {
				if d := calls[i].Sub(calls[i-1]); d != time.Second {
					t.Fatalf("%s: probes %s apart, want 1s", tg.Replica, d)
				}
			}
		}
		if len(firsts) < 10 {
			t.Fatalf("20 targets' first probes at only %d distinct offsets: not jittered", len(firsts))
		}
	})
}

// A target that is removed while its probes fail is cleared of
// ReasonProbe by Run; its probe in flight is dropped.
func TestRunForgetsProbeDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newScripted(func(*http.Request) int { return 500 })
		sink := newRecSink(t)
		c := bubbleChecker(t, activeConfig(), sink, rt, nil)
		stop := runBubble(t, c)
		defer stop()
		c.SetTargets("s", targets("s", "a", "b"))
		advance(4 * activeConfig().Active.Interval)
		if sink.reasons("s", "a") != balancer.ReasonProbe || sink.reasons("s", "b") != balancer.ReasonProbe {
			t.Fatalf("not down: %s %s", sink.reasons("s", "a"), sink.reasons("s", "b"))
		}
		sink.take()
		c.SetTargets("s", targets("s", "a", "b")[1:])
		synctest.Wait()
		callsEqual(t, sink.take(), call{"s", "a", balancer.ReasonProbe, false})
		n := rt.count("10.0.0.1:8080")
		advance(10 * activeConfig().Active.Interval)
		if rt.count("10.0.0.1:8080") != n {
			t.Fatal("a forgotten target is still probed")
		}
		callsEqual(t, sink.take())
	})
}

// A transport error is an error result; Run refuses to run twice.
func TestRunErrorsAndTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newScripted(func(*http.Request) int { return 0 })
		sink := newRecSink(t)
		ev := &events{}
		c := bubbleChecker(t, activeConfig(), sink, rt, ev)
		stop := runBubble(t, c)
		defer stop()
		synctest.Wait()
		if err := c.Run(t.Context()); !errors.Is(err, ErrRunning) {
			t.Fatalf("second Run: %v", err)
		}
		c.SetTargets("s", targets("s", "a"))
		advance(4 * activeConfig().Active.Interval)
		e := ev.take()
		if len(e) != 1 || e[0].Kind != EventProbeDown {
			t.Fatalf("events %+v", e)
		}
		if h := c.Snapshot("s")[0]; h.LastProbeResult == "" || h.Probe != "down" {
			t.Fatalf("snapshot %+v", h)
		}
	})
}
