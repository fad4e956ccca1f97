package membership

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Views are kept per proxy ID: a newer boot's view supersedes whatever
// its sequence number, an older boot's is stale, and within one boot the
// sequence orders them. A view without an ID (an older proxy) is keyed by
// its node name; one carrying this proxy's own ID is refused.
func TestFleetViewRules(t *testing.T) {
	sink := &fleetSink{}
	f := NewFleet(sink, FleetOptions{})
	f.self = "edge-a"
	steps := []struct {
		msg    string
		result string
		node   string // the node whose view applies to edge-b after it
	}{
		{`{"kind":"proxy_state","node":"b.1","id":"edge-b","boot":10,"seq":5,"sets":[]}`, "applied", "b.1"},
		{`{"kind":"proxy_state","node":"b.1","id":"edge-b","boot":10,"seq":5,"sets":[]}`, "stale", "b.1"},
		{`{"kind":"proxy_state","node":"b.1","id":"edge-b","boot":10,"seq":4,"sets":[]}`, "stale", "b.1"},
		{`{"kind":"proxy_state","node":"b.2","id":"edge-b","boot":20,"seq":1,"sets":[]}`, "applied", "b.2"},
		{`{"kind":"proxy_state","node":"b.1","id":"edge-b","boot":10,"seq":6,"sets":[]}`, "stale", "b.2"},
		{`{"kind":"proxy_state","node":"b.2","id":"edge-b","boot":20,"seq":2,"sets":[]}`, "applied", "b.2"},
		{`{"kind":"proxy_state","node":"old.1","seq":1,"sets":[]}`, "applied", "b.2"},
		{`{"kind":"proxy_state","node":"a.2","id":"edge-a","boot":30,"seq":1,"sets":[]}`, "invalid", "b.2"},
	}
	want := map[string]float64{}
	for i, s := range steps {
		f.HandleMessage("x", []byte(s.msg))
		want[s.result]++
		for _, r := range []string{"applied", "stale", "invalid"} {
			if got := testutil.ToFloat64(f.received.WithLabelValues(r)); got != want[r] {
				t.Fatalf("step %d: %s views %v, want %v", i, r, got, want[r])
			}
		}
		var node string
		for _, p := range f.Peers() {
			if p.ID == "edge-b" {
				node = p.Node
			}
		}
		if node != s.node {
			t.Fatalf("step %d: edge-b's view is from %q, want %q", i, node, s.node)
		}
	}
	var ids []string
	for _, p := range sink.peers {
		ids = append(ids, p.ID)
	}
	if len(ids) != 2 || ids[0] != "edge-b" || ids[1] != "old.1" {
		t.Fatalf("views handed over: %v, want [edge-b old.1]", ids)
	}
}
