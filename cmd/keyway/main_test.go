package main

import (
	"os"
	"strings"
	"testing"
)

// asKeyway is set in the environment of every process the tests start:
// the demo's runner starts agents and replicas with this program, which
// in a test is the test binary. With it set, the binary is keyway.
const asKeyway = "KEYWAYTEST_AS_KEYWAY"

func TestMain(m *testing.M) {
	// A proxy started in-process re-executes the test binary with its own
	// arguments (keepSysmonAwake): that is the test binary again, not a
	// keyway command.
	if os.Getenv(asKeyway) == "1" && len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-test.") {
		main()
		os.Exit(0)
	}
	os.Setenv(asKeyway, "1")
	os.Exit(m.Run())
}
