package config

import (
	"slices"
	"testing"
	"time"
)

func TestDiff(t *testing.T) {
	a, err := LoadBytes("a.yaml", []byte(`
listen: ":8080"
replica_sets:
  - name: orders
    static: [{name: o0, addr: "127.0.0.1:9001"}]
gossip:
  enabled: true
  bind_addr: 127.0.0.1
  join: ["127.0.0.1:7946"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(a, a); len(d) != 0 {
		t.Fatalf("Diff(a, a) = %v", d)
	}
	b := Redacted(a)
	b.Listen = ":9090"
	b.ReplicaSets[0].Timeouts.Request = 3 * time.Second
	b.ReplicaSets = append(b.ReplicaSets, b.ReplicaSets[0])
	b.Gossip.Join = []string{"127.0.0.1:7947"}
	b.Log.Level = "debug"
	got := Diff(a, b)
	want := []Change{
		{Path: "listen", Old: `":8080"`, New: `":9090"`},
		{Path: "replica_sets[0].timeouts.request", Old: "15s", New: "3s"},
		{Path: "replica_sets[1]", Old: "(none)", New: "(added)"},
		{Path: "log.level", Old: `"info"`, New: `"debug"`},
		{Path: "gossip.join", Old: "['127.0.0.1:7946']", New: "['127.0.0.1:7947']"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Diff:\n got %v\nwant %v", got, want)
	}
}
