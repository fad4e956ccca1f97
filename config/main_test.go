package config

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"keyway/fleetauth"
)

// testCredentials is a fleet credentials file (every key of a fleet with
// the set orders, private ones included) for configurations that gossip
// off loopback, which need one; TestMain writes it.
var testCredentials string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "keyway-config-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testCredentials = filepath.Join(dir, "credentials.yaml")
	if err := os.WriteFile(testCredentials, fleetauth.Generate([]string{"orders"}).Marshal("test credentials"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// keyEnv is the environment of a node gossiping off loopback: the gossip
// key and the credentials, as both a proxy and an agent read them, plus
// extra.
// (The file's path is read at lookup, after TestMain wrote it.)
func keyEnv(extra map[string]string) Option {
	return WithEnv(func(k string) (string, bool) {
		if v, ok := extra[k]; ok {
			return v, true
		}
		switch k {
		case "KEYWAY_GOSSIP_KEY":
			return testGossipKey, true
		case "KEYWAY_GOSSIP_CREDENTIALS_FILE", "KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE":
			return testCredentials, true
		}
		return "", false
	})
}
