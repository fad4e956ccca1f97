package health

import (
	"fmt"
	"strings"
	"testing"
)

// Each case is a probe sequence ('+' pass, '-' fail) and, after each
// result, the expected verdict ('U' up, 'D' down), with '*' marking a
// change.
func TestVerdict(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		rise, fall int
		seq        string
		want       string // per result: U or D, lower-case when it changed
	}{
		"starts up, passes keep it up":       {2, 3, "+++", "UUU"},
		"one blip never flips":               {2, 3, "-+-+-+", "UUUUUU"},
		"two blips never flip":               {2, 3, "--+--+--+", "UUUUUUUUU"},
		"fall in a row takes it down":        {2, 3, "---", "UUd"},
		"more failures: no second change":    {2, 3, "-----", "UUdDD"},
		"rise in a row brings it up":         {2, 3, "---++", "UUdDu"},
		"flapping while down stays down":     {2, 3, "---+-+-+-", "UUdDDDDDD"},
		"one pass while down is not enough":  {2, 3, "---+", "UUdD"},
		"a failure resets the rise count":    {2, 3, "---+-++", "UUdDDDu"},
		"a pass resets the fall count":       {2, 3, "--+---", "UUUUUd"},
		"rise 1 fall 1 follows every result": {1, 1, "-+-+", "dudu"},
		"rise 1: one pass brings it up":      {1, 3, "---+", "UUdu"},
		"fall 1: one failure takes it down":  {3, 1, "-++-+++", "dDDDDDu"},
		"long rise":                          {5, 2, "--+++++", "UdDDDDu"},
		"down, up, down again":               {2, 2, "--++--", "UdDuUd"},
		"empty":                              {2, 3, "", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := newVerdict(tc.rise, tc.fall)
			var got strings.Builder
			for _, r := range tc.seq {
				changed := v.observe(r == '+')
				c := 'D'
				if v.up {
					c = 'U'
				}
				if changed {
					c += 'a' - 'A'
				}
				got.WriteRune(c)
			}
			if got.String() != tc.want {
				t.Fatalf("rise %d fall %d, %q: got %q, want %q", tc.rise, tc.fall, tc.seq, got.String(), tc.want)
			}
		})
	}
}

// Exhaustive over every sequence of up to 10 results for rise, fall in
// 1..4: the verdict changes exactly when the last results form a run of
// rise passes (while down) or fall failures (while up), as a reference
// model that keeps the whole history says.
func TestVerdictExhaustive(t *testing.T) {
	t.Parallel()
	for rise := 1; rise <= 4; rise++ {
		for fall := 1; fall <= 4; fall++ {
			for n := 0; n <= 10; n++ {
				for bits := 0; bits < 1<<n; bits++ {
					v := newVerdict(rise, fall)
					up := true
					var hist []bool
					for i := 0; i < n; i++ {
						ok := bits&(1<<i) != 0
						hist = append(hist, ok)
						want := up
						if up && trailing(hist, false) >= fall {
							want = false
						}
						if !up && trailing(hist, true) >= rise {
							want = true
						}
						changed := v.observe(ok)
						if v.up != want || changed != (want != up) {
							t.Fatalf("rise %d fall %d seq %s: after %d results up=%v changed=%v, want up=%v", rise, fall, fmtSeq(bits, n), i+1, v.up, changed, want)
						}
						up = want
						if v.passes != trailing(hist, true) || v.failures != trailing(hist, false) {
							t.Fatalf("runs %d/%d, want %d/%d", v.passes, v.failures, trailing(hist, true), trailing(hist, false))
						}
					}
				}
			}
		}
	}
}

// trailing counts the results equal to ok at the end of h.
func trailing(h []bool, ok bool) int {
	n := 0
	for i := len(h) - 1; i >= 0 && h[i] == ok; i-- {
		n++
	}
	return n
}

func fmtSeq(bits, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if bits&(1<<i) != 0 {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
		}
	}
	return fmt.Sprintf("%q", b.String())
}
