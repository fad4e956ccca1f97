package integration

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"keyway/eventlog"
	"keyway/internal/poll"
)

// A scripted life of a replica set (declared: 1) goes through every phase
// the issue names, in order; the proxy logs each change, exports it as a
// gauge and writes the same sequence to its audit trail files.
func TestPhasesAndAuditTrail(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	px := StartProxyWith(t, "proxy-a", nil, 1, "audit: {dir: "+dir+"}\n")
	phase := func() string {
		for _, ph := range []string{"Created", "Scheduling", "Running", "Degraded", "Failed", "Stopped"} {
			if Metric(px.Admin, "keyway_replica_set_phase", map[string]string{"set": "orders", "phase": ph}) == 1 {
				return ph
			}
		}
		return ""
	}
	waitPhase := func(want string) {
		t.Helper()
		poll.Until(t, 30*time.Second, "phase "+want, func() bool { return phase() == want })
	}
	waitPhase("Created")

	// An agent whose replica is not up yet: seen, starting → Scheduling.
	rp, addr := StartReplicaProcess(t, "orders-0")
	postReady(t, addr, false)
	ag := StartAgent(t, "orders-0", addr, []string{px.Gossip})
	waitPhase("Scheduling")
	// Ready → Running.
	postReady(t, addr, true)
	waitPhase("Running")
	// Readiness lost (replaying a checkpoint): recovering → Degraded.
	postReady(t, addr, false)
	waitPhase("Degraded")
	postReady(t, addr, true)
	waitPhase("Running")
	// SIGTERM: the agent drains, advertises stopped and leaves → Stopped.
	ag.Term(t, 30*time.Second)
	waitPhase("Stopped")
	rp.Term(t, 10*time.Second)

	want := []string{"Created", "Scheduling", "Running", "Degraded", "Running", "Stopped"}
	var got []string
	poll.Until(t, 10*time.Second, "the audit trail to hold the six phase changes", func() bool {
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			return false
		}
		evs, err := eventlog.ReadDir(filepath.Join(dir, entries[0].Name()))
		if err != nil {
			return false
		}
		got = got[:0]
		for _, e := range evs {
			if e.Kind == eventlog.KindPhaseChange && e.Set == "orders" {
				got = append(got, e.Fields["to"].(string))
			}
		}
		return len(got) >= len(want)
	})
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("phase changes in the audit trail: %v, want %v", got, want)
	}
	// The same sequence in the proxy's log.
	var logged []string
	for _, l := range px.Logs("replica set phase changed") {
		logged = append(logged, l["to"].(string))
	}
	if !reflect.DeepEqual(logged, want) {
		t.Fatalf("phase changes logged: %v, want %v", logged, want)
	}
	// The trail also has the member and state events that caused them.
	entries, _ := os.ReadDir(dir)
	evs, _ := eventlog.ReadDir(filepath.Join(dir, entries[0].Name()))
	kinds := map[string]int{}
	for _, e := range evs {
		kinds[e.Kind]++
	}
	for _, k := range []string{eventlog.KindMemberJoin, eventlog.KindStateChange, eventlog.KindRingRebuild, eventlog.KindRotationChange} {
		if kinds[k] == 0 {
			t.Errorf("no %s event in the audit trail (kinds: %v)", k, kinds)
		}
	}
	t.Logf("audit trail: %d events, kinds %v", len(evs), kinds)
}
