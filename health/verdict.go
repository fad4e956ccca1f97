package health

// verdict is the rise/fall hysteresis of one replica's active probes: a
// plain value with no clock, no goroutine and no lock (the Checker guards
// it). It starts up: a new replica keeps its place in rotation until Fall
// probes in a row fail, so that starting a proxy (or enabling probes)
// never empties a set for Rise intervals.
//
//	up   --fall consecutive failures--> down
//	down --rise consecutive passes-->   up
//
// A result against the current direction resets the run of the other
// kind, so one blip never flips the verdict unless rise or fall is 1.
type verdict struct {
	rise, fall int
	up         bool
	passes     int // consecutive passes, 0 after a failure
	failures   int // consecutive failures, 0 after a pass
}

func newVerdict(rise, fall int) verdict {
	return verdict{rise: rise, fall: fall, up: true}
}

// observe records one probe result and reports whether the verdict
// changed (v.up then holds the new one).
func (v *verdict) observe(ok bool) (changed bool) {
	if ok {
		v.failures = 0
		if v.passes < maxRun {
			v.passes++
		}
		if !v.up && v.passes >= v.rise {
			v.up = true
			return true
		}
		return false
	}
	v.passes = 0
	if v.failures < maxRun {
		v.failures++
	}
	if v.up && v.failures >= v.fall {
		v.up = false
		return true
	}
	return false
}

// maxRun caps the consecutive counts (they are only reported beyond rise
// and fall), so that a replica probed for years cannot overflow them.
const maxRun = 1 << 30
