package wire

import (
	"testing"
	"time"
)

func TestParkDeadlineRoundsUpToTheGrid(t *testing.T) {
	base := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		at, after, want time.Duration // from base
	}{
		{2 * time.Second, 2 * time.Second, 2 * time.Second},                                      // on the grid
		{2*time.Second + time.Nanosecond, 2 * time.Second, 2*time.Second + 250*time.Millisecond}, // just past: next slot
		{2*time.Second + 249*time.Millisecond, 2 * time.Second, 2*time.Second + 250*time.Millisecond},
		{105 * time.Millisecond, 100 * time.Millisecond, 112500 * time.Microsecond},
		{time.Microsecond, 4 * time.Millisecond, time.Millisecond}, // the grid is at least 1ms
	} {
		got := parkDeadline(base.Add(tc.at), tc.after)
		if want := base.Add(tc.want); !got.Equal(want) {
			t.Errorf("parkDeadline(+%v, %v) = +%v, want +%v", tc.at, tc.after, got.Sub(base), tc.want)
		}
		if got.Before(base.Add(tc.at)) {
			t.Errorf("parkDeadline(+%v, %v) is before the deadline it rounds", tc.at, tc.after)
		}
	}
}
