package runstate

import (
	"fmt"
	"math"
	"time"

	"keyway/membership"
)

// MaxAhead bounds how far a peer's record may be ahead of this proxy's
// wall clock: membership.Window, the gossip signatures' window.
//
// Records are ordered by their versions, values of a hybrid logical clock:
//
//	wall-clock Unix milliseconds << 16 | a 16-bit counter
//
// A local write takes max(now's milliseconds << 16, highest seen + 1), and
// every record merged from a peer (or loaded from the state file) raises
// the highest seen. So:
//
//   - The next local write beats every version this proxy has seen, as a
//     Lamport clock's does: it takes at least the highest seen + 1.
//   - Versions never start again from 0. A proxy that restarts without
//     runtime.state_dir, or every proxy at once, writes above what was
//     written before, since the wall clock has moved on (a restart takes
//     seconds; clocks disagree by milliseconds); commands to
//     agents (membership.SetStop) carry these versions, and an agent can
//     trust the newest it has applied.
//   - Versions of the previous keyway (a Lamport clock: small integers)
//     still order among themselves, and below every hybrid one; a proxy
//     of the previous version writing after a hybrid version takes it + 1,
//     which still orders.
//
// The bound: a record from a peer whose physical part is more than
// MaxAhead ahead of this proxy's wall clock is refused: not merged, not
// used to raise the clock, counted (keyway_runtime_refused_total
// {reason="future"}) and logged at error level naming its origin and how
// far ahead it is. This is safe because:
//
//   - Under NTP proxies' clocks agree within milliseconds; MaxAhead (the
//     gossip signatures' window, one minute) is thousands of times that.
//     Nothing legitimate is refused.
//   - A proxy whose clock is more than a minute ahead gets its writes
//     refused by every other proxy, loudly, on each of them; fixing its
//     clock (or waiting for the real time to catch up) fixes it. Its
//     signed messages are refused for the same reason anyway.
//   - A forged far-future version (before, a record of version 2^64-1
//     made every later write wrap to 0 and lose) cannot freeze writes: it
//     is refused, and the highest seen stays within a minute of real
//     time (48 bits of milliseconds last until the year 10889).
//   - A record that is ahead but within the bound is accepted, and the
//     next local write still beats it (highest seen + 1).
//
// The local state file is trusted: this proxy wrote it, and a record in
// it ahead of the clock (the clock was ahead, then stepped back) is
// loaded, raises the clock and is logged.
const MaxAhead = membership.Window

// logicalBits is the width of a version's counter.
const logicalBits = 16

// physical returns the version of wall-clock time t with the counter 0
// (0 before 1970).
func physical(t time.Time) uint64 {
	return uint64(max(t.UnixMilli(), 0)) << logicalBits
}

// nextVersion returns the version of a local write at now, this proxy
// having seen versions up to seen; false when no version is above seen
// (the largest uint64).
func nextVersion(now time.Time, seen uint64) (uint64, bool) {
	if seen == math.MaxUint64 {
		return 0, false
	}
	return max(physical(now), seen+1), true
}

// aheadMS returns by how many milliseconds version v's physical part is
// ahead of now (0 or less: it is not).
func aheadMS(v uint64, now time.Time) int64 {
	return int64(v>>logicalBits) - max(now.UnixMilli(), 0)
}

// tooFarAhead reports whether a peer's version v is refused at now.
func tooFarAhead(v uint64, now time.Time) bool {
	return aheadMS(v, now) > MaxAhead.Milliseconds()
}

// describeAhead says how far ahead ms milliseconds are, for people.
func describeAhead(ms int64) string {
	const maxDuration = math.MaxInt64 / int64(time.Millisecond)
	if ms > maxDuration {
		return fmt.Sprintf("%d years", ms/(365*24*3600*1000))
	}
	return (time.Duration(ms) * time.Millisecond).String()
}
