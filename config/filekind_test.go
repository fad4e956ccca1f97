package config

import (
	"os"
	"slices"
	"testing"
)

func TestDetectKind(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile("../examples/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for name, tc := range map[string]struct {
		data             string
		kind             FileKind
		agent, proxyKeys []string
	}{
		"examples/agent.yaml":   {read("agent.yaml"), KindAgent, []string{"replica", "probe", "drain", "supervise", "lock_file", "exit_with_parent"}, nil},
		"examples/minimal.yaml": {read("minimal.yaml"), KindProxy, nil, []string{"replica_sets"}},
		"both":                  {"listen: :1\nreplica: {set: a}\nreplica_sets: []\n", KindMixed, []string{"replica"}, []string{"replica_sets"}},
		"only shared keys":      {"listen: :1\nlog: {level: info}\ngossip: {}\n", KindUnknown, nil, nil},
		"unknown keys only":     {"replicas: 3\n", KindUnknown, nil, nil},
		"empty":                 {"", KindUnknown, nil, nil},
		"not a mapping":         {"- a\n- b\n", KindUnknown, nil, nil},
		"not YAML":              {"a: [\n", KindUnknown, nil, nil},
	} {
		t.Run(name, func(t *testing.T) {
			kind, agentKeys, proxyKeys := DetectKind([]byte(tc.data))
			if kind != tc.kind || !slices.Equal(agentKeys, tc.agent) || !slices.Equal(proxyKeys, tc.proxyKeys) {
				t.Fatalf("DetectKind = %v %q %q, want %v %q %q", kind, agentKeys, proxyKeys, tc.kind, tc.agent, tc.proxyKeys)
			}
		})
	}
	// Every top-level section of full.yaml (it sets every key) is the
	// proxy's.
	kind, agentKeys, proxyKeys := DetectKind([]byte(read("full.yaml")))
	if kind != KindProxy || len(agentKeys) > 0 || !slices.Contains(proxyKeys, "replica_sets") || !slices.Contains(proxyKeys, "admin") {
		t.Fatalf("full.yaml: %v %q %q", kind, agentKeys, proxyKeys)
	}
}
