package main

import (
	"os"
	"testing"
)

// asKeyway is set in the environment of every process the tests start:
// the demo's runner starts agents and replicas with this program, which
// in a test is the test binary. With it set, the binary is keyway.
const asKeyway = "KEYWAYTEST_AS_KEYWAY"

func TestMain(m *testing.M) {
	if os.Getenv(asKeyway) == "1" {
		main()
		os.Exit(0)
	}
	os.Setenv(asKeyway, "1")
	os.Exit(m.Run())
}
