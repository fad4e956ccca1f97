package agent

import (
	"fmt"
	"strings"
	"testing"

	"keyway/balancer"
)

const (
	starting   = balancer.StateStarting
	ready      = balancer.StateReady
	draining   = balancer.StateDraining
	recovering = balancer.StateRecovering
	stopped    = balancer.StateStopped
	failed     = balancer.StateFailed
)

// One step at a time: every state × every event, with counters just below
// and at the thresholds (rise 2, fall 3).
func TestStep(t *testing.T) {
	const rise, fall = 2, 3
	cases := map[string]struct {
		in      lifecycle
		ev      event
		want    lifecycle
		changed bool
	}{
		"starting: first pass counts":             {lifecycle{starting, 0, 0, false, false}, evProbePass, lifecycle{starting, 1, 0, false, false}, false},
		"starting: rise-th pass makes ready":      {lifecycle{starting, 1, 0, false, false}, evProbePass, lifecycle{ready, 0, 0, false, false}, true},
		"starting: a failure resets passes":       {lifecycle{starting, 1, 0, false, false}, evProbeFail, lifecycle{starting, 0, 1, false, false}, false},
		"starting: failures never leave it":       {lifecycle{starting, 0, 99, false, false}, evProbeFail, lifecycle{starting, 0, 100, false, false}, false},
		"starting: pass after failures":           {lifecycle{starting, 0, 5, false, false}, evProbePass, lifecycle{starting, 1, 0, false, false}, false},
		"starting: drain":                         {lifecycle{starting, 1, 0, false, false}, evDrain, lifecycle{draining, 0, 0, false, false}, true},
		"starting: stop":                          {lifecycle{starting, 0, 0, false, false}, evStop, lifecycle{stopped, 0, 0, false, false}, true},
		"ready: pass keeps it":                    {lifecycle{ready, 0, 2, false, false}, evProbePass, lifecycle{ready, 1, 0, false, false}, false},
		"ready: failures below fall keep it":      {lifecycle{ready, 0, 1, false, false}, evProbeFail, lifecycle{ready, 0, 2, false, false}, false},
		"ready: fall-th failure makes recovering": {lifecycle{ready, 0, 2, false, false}, evProbeFail, lifecycle{recovering, 0, 0, false, false}, true},
		"ready: a pass resets failures":           {lifecycle{ready, 3, 2, false, false}, evProbePass, lifecycle{ready, 4, 0, false, false}, false},
		"ready: drain":                            {lifecycle{ready, 5, 0, false, false}, evDrain, lifecycle{draining, 0, 0, false, false}, true},
		"recovering: first pass counts":           {lifecycle{recovering, 0, 0, false, false}, evProbePass, lifecycle{recovering, 1, 0, false, false}, false},
		"recovering: rise-th pass makes ready":    {lifecycle{recovering, 1, 0, false, false}, evProbePass, lifecycle{ready, 0, 0, false, false}, true},
		"recovering: failure resets passes":       {lifecycle{recovering, 1, 0, false, false}, evProbeFail, lifecycle{recovering, 0, 1, false, false}, false},
		"recovering: drain":                       {lifecycle{recovering, 0, 4, false, false}, evDrain, lifecycle{draining, 0, 0, false, false}, true},
		"draining: probe pass ignored":            {lifecycle{draining, 0, 0, false, false}, evProbePass, lifecycle{draining, 0, 0, false, false}, false},
		"draining: probe fail ignored":            {lifecycle{draining, 0, 0, false, false}, evProbeFail, lifecycle{draining, 0, 0, false, false}, false},
		"draining: drain again":                   {lifecycle{draining, 0, 0, false, false}, evDrain, lifecycle{draining, 0, 0, false, false}, false},
		"draining: stop":                          {lifecycle{draining, 0, 0, false, false}, evStop, lifecycle{stopped, 0, 0, false, false}, true},
		"stopped: final for probes":               {lifecycle{stopped, 0, 0, false, false}, evProbePass, lifecycle{stopped, 0, 0, false, false}, false},
		"stopped: final for drain":                {lifecycle{stopped, 0, 0, false, false}, evDrain, lifecycle{stopped, 0, 0, false, false}, false},
		"stopped: stop again":                     {lifecycle{stopped, 0, 0, false, false}, evStop, lifecycle{stopped, 0, 0, false, false}, false},
		"failed: probes ignored":                  {lifecycle{failed, 0, 0, false, false}, evProbePass, lifecycle{failed, 0, 0, false, false}, false},
		"failed: drain":                           {lifecycle{failed, 0, 0, false, false}, evDrain, lifecycle{draining, 0, 0, false, false}, true},
		// A supervised process.
		"starting: process exit":          {lifecycle{starting, 1, 0, false, false}, evChildExit, lifecycle{recovering, 0, 0, true, false}, true},
		"ready: process exit":             {lifecycle{ready, 3, 0, false, false}, evChildExit, lifecycle{recovering, 0, 0, true, false}, true},
		"recovering: process exit":        {lifecycle{recovering, 1, 0, false, false}, evChildExit, lifecycle{recovering, 0, 0, true, false}, false},
		"down: probe pass ignored":        {lifecycle{recovering, 1, 0, true, false}, evProbePass, lifecycle{recovering, 1, 0, true, false}, false},
		"down: probe fail ignored":        {lifecycle{recovering, 0, 0, true, false}, evProbeFail, lifecycle{recovering, 0, 0, true, false}, false},
		"down: process start":             {lifecycle{recovering, 0, 0, true, false}, evChildStart, lifecycle{starting, 0, 0, false, false}, true},
		"starting: first process start":   {lifecycle{starting, 1, 0, false, false}, evChildStart, lifecycle{starting, 0, 0, false, false}, false},
		"down: give up":                   {lifecycle{recovering, 0, 0, true, false}, evGiveUp, lifecycle{failed, 0, 0, true, false}, true},
		"failed: process start (repair)":  {lifecycle{failed, 0, 0, true, false}, evChildStart, lifecycle{starting, 0, 0, false, false}, true},
		"failed: process exit ignored":    {lifecycle{failed, 0, 0, true, false}, evChildExit, lifecycle{failed, 0, 0, true, false}, false},
		"draining: process exit ignored":  {lifecycle{draining, 0, 0, false, false}, evChildExit, lifecycle{draining, 0, 0, false, false}, false},
		"draining: process start ignored": {lifecycle{draining, 0, 0, false, false}, evChildStart, lifecycle{draining, 0, 0, false, false}, false},
		"draining: give up ignored":       {lifecycle{draining, 0, 0, false, false}, evGiveUp, lifecycle{draining, 0, 0, false, false}, false},
		"stopped: process start ignored":  {lifecycle{stopped, 0, 0, false, false}, evChildStart, lifecycle{stopped, 0, 0, false, false}, false},
		// A set stop: drain, stop, and start again.
		"starting: set stop":                     {lifecycle{starting, 1, 0, false, false}, evSetStop, lifecycle{draining, 0, 0, false, true}, true},
		"ready: set stop":                        {lifecycle{ready, 4, 1, false, false}, evSetStop, lifecycle{draining, 0, 0, false, true}, true},
		"recovering: set stop":                   {lifecycle{recovering, 1, 0, false, false}, evSetStop, lifecycle{draining, 0, 0, false, true}, true},
		"down: set stop":                         {lifecycle{recovering, 0, 0, true, false}, evSetStop, lifecycle{draining, 0, 0, true, true}, true},
		"failed: set stop":                       {lifecycle{failed, 0, 0, true, false}, evSetStop, lifecycle{draining, 0, 0, true, true}, true},
		"set draining: set stop again":           {lifecycle{draining, 0, 0, false, true}, evSetStop, lifecycle{draining, 0, 0, false, true}, false},
		"draining (shutdown): set stop ignored":  {lifecycle{draining, 0, 0, false, false}, evSetStop, lifecycle{draining, 0, 0, false, false}, false},
		"stopped (shutdown): set stop ignored":   {lifecycle{stopped, 0, 0, false, false}, evSetStop, lifecycle{stopped, 0, 0, false, false}, false},
		"set stopped: set stop again":            {lifecycle{stopped, 0, 0, true, true}, evSetStop, lifecycle{stopped, 0, 0, true, true}, false},
		"set draining: probe pass ignored":       {lifecycle{draining, 0, 0, false, true}, evProbePass, lifecycle{draining, 0, 0, false, true}, false},
		"set draining: process start ignored":    {lifecycle{draining, 0, 0, false, true}, evChildStart, lifecycle{draining, 0, 0, false, true}, false},
		"set draining: stop":                     {lifecycle{draining, 0, 0, false, true}, evStop, lifecycle{stopped, 0, 0, false, true}, true},
		"set stopped: probe pass ignored":        {lifecycle{stopped, 0, 0, false, true}, evProbePass, lifecycle{stopped, 0, 0, false, true}, false},
		"set stopped: process start ignored":     {lifecycle{stopped, 0, 0, false, true}, evChildStart, lifecycle{stopped, 0, 0, false, true}, false},
		"set stopped: give up ignored":           {lifecycle{stopped, 0, 0, false, true}, evGiveUp, lifecycle{stopped, 0, 0, false, true}, false},
		"set stopped: set start":                 {lifecycle{stopped, 0, 0, true, true}, evSetStart, lifecycle{starting, 0, 0, false, false}, true},
		"set draining: set start (abandoned)":    {lifecycle{draining, 0, 0, true, true}, evSetStart, lifecycle{starting, 0, 0, false, false}, true},
		"stopped (shutdown): set start ignored":  {lifecycle{stopped, 0, 0, false, false}, evSetStart, lifecycle{stopped, 0, 0, false, false}, false},
		"draining (shutdown): set start ignored": {lifecycle{draining, 0, 0, false, false}, evSetStart, lifecycle{draining, 0, 0, false, false}, false},
		"ready: set start ignored":               {lifecycle{ready, 2, 0, false, false}, evSetStart, lifecycle{ready, 2, 0, false, false}, false},
		"set draining: shutdown takes it over":   {lifecycle{draining, 0, 0, false, true}, evDrain, lifecycle{draining, 0, 0, false, false}, false},
		"set stopped: shutdown takes it over":    {lifecycle{stopped, 0, 0, true, true}, evDrain, lifecycle{stopped, 0, 0, true, false}, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, changed := step(tc.in, tc.ev, rise, fall)
			if got != tc.want || changed != tc.changed {
				t.Fatalf("step(%+v, %s) = %+v, %v; want %+v, %v", tc.in, tc.ev, got, changed, tc.want, tc.changed)
			}
		})
	}
}

// Sequences of probe results, written as "+" (pass) and "-" (fail), and the
// state after each one.
func TestStepSequences(t *testing.T) {
	cases := map[string]struct {
		rise, fall int
		probes     string
		want       string // one letter per probe: s(tarting) r(eady) c (recovering)
	}{
		"rise 2":                         {2, 3, "++", "sr"},
		"rise 1":                         {1, 1, "+-+", "rcr"},
		"flapping never rises":           {2, 3, "+-+-+-", "ssssss"},
		"fall 3 then back":               {2, 3, "++---++", "srrrccr"},
		"failures interrupted by pass":   {2, 3, "++--+--+", "srrrrrrr"},
		"recovering needs rise in a row": {2, 3, "++---+-++", "srrrccccr"},
		"slow start":                     {3, 2, "--+++--+++", "ssssrrcccr"},
	}
	letter := map[balancer.State]byte{starting: 's', ready: 'r', recovering: 'c'}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := lifecycle{State: starting}
			var got strings.Builder
			for _, p := range tc.probes {
				ev := evProbeFail
				if p == '+' {
					ev = evProbePass
				}
				l, _ = step(l, ev, tc.rise, tc.fall)
				got.WriteByte(letter[l.State])
			}
			if got.String() != tc.want {
				t.Fatalf("rise %d fall %d, probes %s: states %s, want %s", tc.rise, tc.fall, tc.probes, got.String(), tc.want)
			}
		})
	}
}

func TestEventString(t *testing.T) {
	var names []string
	for _, e := range []event{evProbePass, evProbeFail, evDrain, evStop, evChildStart, evChildExit, evGiveUp, evSetStop, evSetStart, 0} {
		names = append(names, e.String())
	}
	if got := fmt.Sprint(names); got != "[probe_pass probe_fail drain stop process_start process_exit give_up set_stop set_start unknown]" {
		t.Fatal(got)
	}
}

// A set stop and start, with probes in between: probes are ignored while
// the replica drains and while it is stopped; after the start the probes
// decide again, from starting. A shutdown after a set stop keeps stopped
// final.
func TestStepSetStopSequence(t *testing.T) {
	type in struct {
		ev   event
		want balancer.State
	}
	run := func(t *testing.T, seq []in) {
		t.Helper()
		l := lifecycle{State: starting}
		for i, s := range seq {
			l, _ = step(l, s.ev, 2, 3)
			if l.State != s.want {
				t.Fatalf("step %d (%s): %s, want %s", i, s.ev, l.State, s.want)
			}
		}
	}
	t.Run("stop and start", func(t *testing.T) {
		run(t, []in{
			{evProbePass, starting}, {evProbePass, ready},
			{evSetStop, draining}, {evProbeFail, draining}, {evProbePass, draining},
			{evStop, stopped}, {evProbePass, stopped}, {evProbePass, stopped},
			{evSetStart, starting}, {evProbePass, starting}, {evProbePass, ready},
		})
	})
	t.Run("supervised", func(t *testing.T) {
		run(t, []in{
			{evChildStart, starting}, {evProbePass, starting}, {evProbePass, ready},
			{evSetStop, draining}, {evStop, stopped},
			{evSetStart, starting}, {evChildStart, starting}, {evProbePass, starting}, {evProbePass, ready},
		})
	})
	t.Run("abandoned while draining", func(t *testing.T) {
		run(t, []in{
			{evProbePass, starting}, {evProbePass, ready},
			{evSetStop, draining}, {evSetStart, starting}, {evProbePass, starting}, {evProbePass, ready},
		})
	})
	t.Run("shutdown while set stopped", func(t *testing.T) {
		run(t, []in{
			{evProbePass, starting}, {evProbePass, ready},
			{evSetStop, draining}, {evStop, stopped},
			{evDrain, stopped}, {evStop, stopped}, {evSetStart, stopped},
		})
	})
	t.Run("shutdown while set draining", func(t *testing.T) {
		run(t, []in{
			{evSetStop, draining}, {evDrain, draining}, {evSetStart, draining}, {evStop, stopped}, {evSetStart, stopped},
		})
	})
}

// A set command older than the newest applied is ignored, however long
// after; one of the newest version or newer is applied.
func TestOlderSetCommand(t *testing.T) {
	hlc := uint64(1767323045000) << 16 // 2026-01-02, as package runstate writes versions
	for _, tc := range []struct {
		v, newest uint64
		older     bool
	}{
		{4, 5, true},
		{5, 5, false},
		{6, 5, false},
		{0, 7, true},    // proxies restarted without a state directory: the file's stop, version 0
		{hlc, 7, false}, // an operator's write after that: the wall clock
		{7, hlc, true},  // an older keyway's Lamport version
		{hlc + 1, hlc, false},
		{0, 0, false},
	} {
		if got := olderSetCommand(tc.v, tc.newest); got != tc.older {
			t.Errorf("olderSetCommand(%d, %d) = %v, want %v", tc.v, tc.newest, got, tc.older)
		}
	}
}
