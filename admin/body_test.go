package admin

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// PATCH reads its body as strictly as POST: what encoding/json would
// accept by dropping part of it is refused whole, and nothing changes.
func TestPatchIsStrict(t *testing.T) {
	op := &fakeOperator{scaled: map[string]int{"orders": 2}, stopped: map[string]bool{}}
	s, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewPedanticRegistry(), Sets: testView(), SetAdmin: op, Env: envWith("s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	base := serveHandler(t, s)
	for _, tc := range []struct{ body, want string }{
		{`{"replicas":5}{"stop":true} junk`, `unexpected data after the JSON object, at byte 14: \"{\\\"stop\\\":true} junk\": send one object and nothing after it; nothing changed`},
		{`{"replicas":5} junk`, `unexpected data after the JSON object`},
		{`{"replicas":5,"replicas":6}`, `key \"replicas\" is given twice: write each key once; nothing changed`},
		{`{"stop":false,"replicas":5,"stop":true}`, `key \"stop\" is given twice`},
		{`{"replicas":"5"}`, `replicas: want an integer, got a JSON string`},
		{`{"replicas":5` + strings.Repeat(" ", 5<<10) + `}`, "longer than 4096 bytes"},
	} {
		code, body := doBody(t, "PATCH", base+"/v1/replica_sets/orders", "s3cret", tc.body)
		if code != 400 || !strings.Contains(body, tc.want) || !strings.Contains(body, `send {\"replicas\": N}`) {
			t.Errorf("PATCH %.40s: %d %s; want 400 saying %s", tc.body, code, body, tc.want)
		}
	}
	if op.scaled["orders"] != 2 || len(op.stopped) != 0 || len(op.who) != 0 {
		t.Fatalf("a refused PATCH changed something: scaled %v, stopped %v, calls %v", op.scaled, op.stopped, op.who)
	}
	// A well-formed body still applies.
	if code, body := doBody(t, "PATCH", base+"/v1/replica_sets/orders", "s3cret", ` {"replicas": 5, "stop": true} `+"\n"); code != 200 || op.scaled["orders"] != 5 || !op.stopped["orders"] {
		t.Fatalf("PATCH: %d %s; scaled %v, stopped %v", code, body, op.scaled, op.stopped)
	}
}
