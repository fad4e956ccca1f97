package proxy

import "time"

// clock is the time source of the proxy's timers: the refused-connection
// hold and the traffic sampler. The request path itself (deadlines,
// latencies) reads the wall clock. Tests inject a fake (Options.clock).
type clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func())
	// NewTicker returns a channel delivering a tick every d, and a func
	// that stops it.
	NewTicker(d time.Duration) (ticks <-chan time.Time, stop func())
}

// wallClock is the real clock.
type wallClock struct{}

func (wallClock) Now() time.Time                      { return time.Now() }
func (wallClock) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }
func (wallClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}
