package main

import (
	"slices"
	"testing"
)

func TestHasGodebug(t *testing.T) {
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"", false},
		{"schedtrace=1", true},
		{"madvdontneed=1,schedtrace=2147483647", true},
		{"madvdontneed=1, schedtrace=0", true}, // set, even to off: the operator's choice
		{"scheddetail=1", false},
		{"xschedtrace=1", false},
		{"schedtrace", false},
	} {
		if got := hasGodebug(c.s, "schedtrace"); got != c.want {
			t.Errorf("hasGodebug(%q) = %v, want %v", c.s, got, c.want)
		}
	}
}

func TestWithoutEnv(t *testing.T) {
	env := []string{"A=1", "GODEBUG=x=1", "GODEBUGX=2", "B="}
	got := withoutEnv(env, "GODEBUG")
	if want := []string{"A=1", "GODEBUGX=2", "B="}; !slices.Equal(got, want) {
		t.Fatalf("withoutEnv = %q, want %q", got, want)
	}
	if env[1] != "GODEBUG=x=1" {
		t.Fatalf("withoutEnv changed its argument: %q", env)
	}
}
