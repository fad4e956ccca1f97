package membership

import (
	"fmt"
	"slices"
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

// While a proxy upgrades, its old process's votes and vetoes still count
// as the proxy's (once: one ID) where the new process lacks them, and a
// newer view from the old process updates them.
func TestFleetOlderProcessEvidenceCounts(t *testing.T) {
	sink := &fleetSink{}
	f := NewFleet(sink, FleetOptions{})
	f.self = "edge-a"
	send := func(node string, boot, seq int, votes, vetoes string) {
		f.HandleMessage("x", []byte(fmt.Sprintf(`{"kind":"proxy_state","node":%q,"id":"edge-b","boot":%d,"seq":%d,"sets":[{"set":"orders","digest":"d","votes":[%s],"vetoes":[%s]}]}`,
			node, boot, seq, votes, vetoes)))
	}
	evidence := func() (votes, vetoes []string) {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.peers) != 1 || sink.peers[0].ID != "edge-b" || len(sink.peers[0].Sets) != 1 {
			t.Fatalf("peers %+v, want edge-b alone with one set", sink.peers)
		}
		s := sink.peers[0].Sets[0]
		for _, v := range s.Votes {
			votes = append(votes, v.Replica+"/"+v.Reason.String())
		}
		slices.Sort(votes)
		return votes, s.Vetoes
	}
	send("b.1", 10, 7, `{"replica":"orders-1","reason":"ejected","age_ms":100}`, `"orders-2"`)
	send("b.2", 20, 1, ``, ``) // the new process, no evidence yet
	if votes, vetoes := evidence(); fmt.Sprint(votes) != "[orders-1/ejected]" || fmt.Sprint(vetoes) != "[orders-2]" {
		t.Fatalf("after the new process's first view: votes %v, vetoes %v; want the old process's", votes, vetoes)
	}
	send("b.1", 10, 8, `{"replica":"orders-0","reason":"ejected","age_ms":100}`, ``)
	if votes, vetoes := evidence(); fmt.Sprint(votes) != "[orders-0/ejected]" || len(vetoes) != 0 {
		t.Fatalf("after the old process's newer view: votes %v, vetoes %v", votes, vetoes)
	}
	send("b.2", 20, 2, `{"replica":"orders-0","reason":"ejected","age_ms":50}`, `"orders-2"`)
	if votes, vetoes := evidence(); fmt.Sprint(votes) != "[orders-0/ejected]" || fmt.Sprint(vetoes) != "[orders-2]" {
		t.Fatalf("both with the same evidence: votes %v, vetoes %v; want it once", votes, vetoes)
	}
	// Requests in flight to a replica: both processes'.
	f.HandleMessage("x", []byte(`{"kind":"proxy_state","node":"b.1","id":"edge-b","boot":10,"seq":9,"sets":[{"set":"orders","digest":"d","inflight":{"orders-1":3}}]}`))
	f.HandleMessage("x", []byte(`{"kind":"proxy_state","node":"b.2","id":"edge-b","boot":20,"seq":3,"sets":[{"set":"orders","digest":"d","inflight":{"orders-1":2}}]}`))
	sink.mu.Lock()
	got := sink.peers[0].Sets[0].Inflight["orders-1"]
	sink.mu.Unlock()
	if got != 5 {
		t.Fatalf("requests in flight to orders-1: %d, want 3 (old process) + 2 (new)", got)
	}
}

// A held fleet exchange publishes nothing until the hold ends.
func TestFleetHoldDelaysPublishing(t *testing.T) {
	hold := make(chan struct{})
	f := NewFleet(&fleetSink{}, FleetOptions{Hold: hold})
	cfg := DefaultConfig()
	cfg.BindAddr = "127.0.0.1"
	n, err := New(cfg, Meta{Role: RoleProxy, ID: "edge-a"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.Attach(n) // not running: nothing is sent, but views are built
	f.publish()
	if f.seq != 0 {
		t.Fatalf("published %d views while held", f.seq)
	}
	close(hold)
	f.publish()
	if f.seq != 1 {
		t.Fatalf("published %d views after the hold, want 1", f.seq)
	}
}
