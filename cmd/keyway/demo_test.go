package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"keyway/balancer"
)

// The demo's suggested keys land on at least three different replicas of
// the embedded demo's ring, by the balancer's own placement: a change of
// the demo's ring (its replicas' names or hash parameters) that puts them
// together fails here. The banner and the README's quick start suggest
// those keys.
func TestDemoKeysSpread(t *testing.T) {
	cfg := demoConfig(t)
	set := cfg.ReplicaSets[0]
	r, err := balancer.NewRouter(balancer.RouterConfig{Set: set.Name, Hash: set.Hash, Failover: set.Failover}, balancer.Hooks[struct{}]{})
	if err != nil {
		t.Fatal(err)
	}
	var reps []balancer.Replica
	for i := range set.Replicas {
		// The names the demo's runner gives its replicas (printDemoHelp).
		reps = append(reps, balancer.Replica{Name: fmt.Sprintf("%s-%d", set.Name, i), Addr: fmt.Sprintf("127.0.0.1:%d", 9001+i), Weight: 1, State: balancer.StateReady})
	}
	r.SetReplicas("demo", reps)
	tbl := r.Table()
	owner := func(key string) string { return tbl.Replica(tbl.Owner(balancer.HashString(key))).Name }

	k := demoKeys
	owners := map[string]string{}
	for _, key := range []string{k.header, k.other, k.path, k.query} {
		owners[key] = owner(key)
	}
	distinct := map[string]bool{}
	for _, o := range owners {
		distinct[o] = true
	}
	if len(distinct) < 3 {
		t.Errorf("the demo's keys land on %d replicas, want 3: %v", len(distinct), owners)
	}
	if owner(k.header) == owner(k.other) || owner(k.path) == owner(k.header) || owner(k.path) == owner(k.other) {
		t.Errorf("the banner says \"another key, another replica\" and \"a third replica\": %v", owners)
	}
	if owner(k.header) != "orders-0" {
		t.Errorf("%s is on %s; the README's walk-through of ejection has it on orders-0", k.header, owner(k.header))
	}

	var banner strings.Builder
	printDemoHelp(&banner, cfg, "127.0.0.1:8080", "127.0.0.1:9901", "")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	quick, _, _ := strings.Cut(string(readme)[strings.Index(string(readme), "## Quick start"):], "### Scale out")
	for _, want := range []string{
		"-H 'X-Key: " + k.header + "'", "-H 'X-Key: " + k.other + "'", "/ingest/" + k.path, "/ingest?key=" + k.query,
	} {
		if !strings.Contains(banner.String(), want) {
			t.Errorf("the demo's banner lacks %q:\n%s", want, banner.String())
		}
		if !strings.Contains(quick, want) {
			t.Errorf("the README's quick start lacks %q", want)
		}
	}
	// The README says which replica each key reaches.
	for _, key := range []string{k.header, k.other, k.path, k.query} {
		if !strings.Contains(quick, `{"replica":"`+owner(key)+`","key":"`+key+`"`) {
			t.Errorf("the README's quick start shows no answer of %s from %s", key, owner(key))
		}
	}
}
