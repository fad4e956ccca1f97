package integration

import (
	"flag"
	"fmt"
	"keyway/fleetauth"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if runtime.GOOS == "windows" {
		// Proc.Term stops keyway with SIGTERM, and the reload tests send
		// SIGHUP and SIGUSR1: Windows delivers none of them.
		fmt.Println("integration: skipped on windows: the harness signals keyway (SIGTERM, SIGHUP, SIGUSR1)")
		os.Exit(0)
	}
	if testing.Short() {
		fmt.Println("integration: skipped under -short")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "keyway-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	Binary, err = Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Every keyway the tests start signs and checks gossip (as off
	// loopback): the harness's fleet credentials, from the environment.
	Credentials = fleetauth.Generate(CredentialSets)
	CredentialsFile = filepath.Join(dir, "credentials.yaml")
	if err := os.WriteFile(CredentialsFile, Credentials.Marshal("the integration tests' fleet credentials"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("KEYWAY_GOSSIP_CREDENTIALS_FILE", CredentialsFile)
	os.Setenv("KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE", CredentialsFile)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts keyway processes")
	}
}
