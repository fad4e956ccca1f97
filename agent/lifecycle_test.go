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
		"starting: first pass counts":             {lifecycle{starting, 0, 0, false}, evProbePass, lifecycle{starting, 1, 0, false}, false},
		"starting: rise-th pass makes ready":      {lifecycle{starting, 1, 0, false}, evProbePass, lifecycle{ready, 0, 0, false}, true},
		"starting: a failure resets passes":       {lifecycle{starting, 1, 0, false}, evProbeFail, lifecycle{starting, 0, 1, false}, false},
		"starting: failures never leave it":       {lifecycle{starting, 0, 99, false}, evProbeFail, lifecycle{starting, 0, 100, false}, false},
		"starting: pass after failures":           {lifecycle{starting, 0, 5, false}, evProbePass, lifecycle{starting, 1, 0, false}, false},
		"starting: drain":                         {lifecycle{starting, 1, 0, false}, evDrain, lifecycle{draining, 0, 0, false}, true},
		"starting: stop":                          {lifecycle{starting, 0, 0, false}, evStop, lifecycle{stopped, 0, 0, false}, true},
		"ready: pass keeps it":                    {lifecycle{ready, 0, 2, false}, evProbePass, lifecycle{ready, 1, 0, false}, false},
		"ready: failures below fall keep it":      {lifecycle{ready, 0, 1, false}, evProbeFail, lifecycle{ready, 0, 2, false}, false},
		"ready: fall-th failure makes recovering": {lifecycle{ready, 0, 2, false}, evProbeFail, lifecycle{recovering, 0, 0, false}, true},
		"ready: a pass resets failures":           {lifecycle{ready, 3, 2, false}, evProbePass, lifecycle{ready, 4, 0, false}, false},
		"ready: drain":                            {lifecycle{ready, 5, 0, false}, evDrain, lifecycle{draining, 0, 0, false}, true},
		"recovering: first pass counts":           {lifecycle{recovering, 0, 0, false}, evProbePass, lifecycle{recovering, 1, 0, false}, false},
		"recovering: rise-th pass makes ready":    {lifecycle{recovering, 1, 0, false}, evProbePass, lifecycle{ready, 0, 0, false}, true},
		"recovering: failure resets passes":       {lifecycle{recovering, 1, 0, false}, evProbeFail, lifecycle{recovering, 0, 1, false}, false},
		"recovering: drain":                       {lifecycle{recovering, 0, 4, false}, evDrain, lifecycle{draining, 0, 0, false}, true},
		"draining: probe pass ignored":            {lifecycle{draining, 0, 0, false}, evProbePass, lifecycle{draining, 0, 0, false}, false},
		"draining: probe fail ignored":            {lifecycle{draining, 0, 0, false}, evProbeFail, lifecycle{draining, 0, 0, false}, false},
		"draining: drain again":                   {lifecycle{draining, 0, 0, false}, evDrain, lifecycle{draining, 0, 0, false}, false},
		"draining: stop":                          {lifecycle{draining, 0, 0, false}, evStop, lifecycle{stopped, 0, 0, false}, true},
		"stopped: final for probes":               {lifecycle{stopped, 0, 0, false}, evProbePass, lifecycle{stopped, 0, 0, false}, false},
		"stopped: final for drain":                {lifecycle{stopped, 0, 0, false}, evDrain, lifecycle{stopped, 0, 0, false}, false},
		"stopped: stop again":                     {lifecycle{stopped, 0, 0, false}, evStop, lifecycle{stopped, 0, 0, false}, false},
		"failed: probes ignored":                  {lifecycle{failed, 0, 0, false}, evProbePass, lifecycle{failed, 0, 0, false}, false},
		"failed: drain":                           {lifecycle{failed, 0, 0, false}, evDrain, lifecycle{draining, 0, 0, false}, true},
		// A supervised process.
		"starting: process exit":          {lifecycle{starting, 1, 0, false}, evChildExit, lifecycle{recovering, 0, 0, true}, true},
		"ready: process exit":             {lifecycle{ready, 3, 0, false}, evChildExit, lifecycle{recovering, 0, 0, true}, true},
		"recovering: process exit":        {lifecycle{recovering, 1, 0, false}, evChildExit, lifecycle{recovering, 0, 0, true}, false},
		"down: probe pass ignored":        {lifecycle{recovering, 1, 0, true}, evProbePass, lifecycle{recovering, 1, 0, true}, false},
		"down: probe fail ignored":        {lifecycle{recovering, 0, 0, true}, evProbeFail, lifecycle{recovering, 0, 0, true}, false},
		"down: process start":             {lifecycle{recovering, 0, 0, true}, evChildStart, lifecycle{starting, 0, 0, false}, true},
		"starting: first process start":   {lifecycle{starting, 1, 0, false}, evChildStart, lifecycle{starting, 0, 0, false}, false},
		"down: give up":                   {lifecycle{recovering, 0, 0, true}, evGiveUp, lifecycle{failed, 0, 0, true}, true},
		"failed: process start (repair)":  {lifecycle{failed, 0, 0, true}, evChildStart, lifecycle{starting, 0, 0, false}, true},
		"failed: process exit ignored":    {lifecycle{failed, 0, 0, true}, evChildExit, lifecycle{failed, 0, 0, true}, false},
		"draining: process exit ignored":  {lifecycle{draining, 0, 0, false}, evChildExit, lifecycle{draining, 0, 0, false}, false},
		"draining: process start ignored": {lifecycle{draining, 0, 0, false}, evChildStart, lifecycle{draining, 0, 0, false}, false},
		"draining: give up ignored":       {lifecycle{draining, 0, 0, false}, evGiveUp, lifecycle{draining, 0, 0, false}, false},
		"stopped: process start ignored":  {lifecycle{stopped, 0, 0, false}, evChildStart, lifecycle{stopped, 0, 0, false}, false},
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
	for _, e := range []event{evProbePass, evProbeFail, evDrain, evStop, evChildStart, evChildExit, evGiveUp, 0} {
		names = append(names, e.String())
	}
	if got := fmt.Sprint(names); got != "[probe_pass probe_fail drain stop process_start process_exit give_up unknown]" {
		t.Fatal(got)
	}
}
