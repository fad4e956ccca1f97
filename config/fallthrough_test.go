package config

import (
	"strings"
	"testing"

	"keyway/proxy"
)

func TestFallThroughs(t *testing.T) {
	set := func(name, host, prefix string) proxy.SetConfig {
		sc := proxy.DefaultSetConfig()
		sc.Name, sc.Match = name, proxy.MatchConfig{Host: host, PathPrefix: prefix}
		return sc
	}
	cfg := func(sets ...proxy.SetConfig) Config {
		var c Config
		c.ReplicaSets = sets
		return c
	}
	old := cfg(set("orders", "", "/"), set("users", "", "/users/"), set("billing", "pay.example", "/"), set("audit", "", "/audit"))
	for _, tc := range []struct {
		name string
		next Config
		want []string // substrings, one per warning
	}{
		{"nothing removed", old, nil},
		{"a prefix set removed: the catch-all takes it", cfg(set("orders", "", "/"), set("billing", "pay.example", "/"), set("audit", "", "/audit")), []string{`"users" is removed: its requests (path /users/) go to replica set "orders"`}},
		{"a host set removed", cfg(set("orders", "", "/"), set("users", "", "/users/"), set("audit", "", "/audit")), []string{`"billing" is removed: its requests (host pay.example, path /) go to replica set "orders"`}},
		{"the catch-all removed: nothing takes its requests (404)", cfg(set("users", "", "/users/"), set("billing", "pay.example", "/"), set("audit", "", "/audit")), nil},
		{"only a narrower set: not every request is caught", cfg(set("users", "", "/users/"), set("billing", "pay.example", "/"), set("audit", "", "/audit/x")), nil},
	} {
		got := FallThroughs(old, tc.next)
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want %d warnings", tc.name, got, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: %q lacks %q", tc.name, got[i], w)
			}
		}
	}
}
