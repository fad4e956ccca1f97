// Package slow gates the test scenarios that take long: a real
// Kubernetes control plane, outages and partitions held for seconds,
// soaks, and the benchmark harness's smoke runs of the load tools. `go
// test ./...` skips them, so that the whole suite stays within its budget
// (README: about 3 minutes on 2 cores); KEYWAY_SLOW_TESTS=1 runs them, and
// .ci/run sets it, so CI runs every test.
package slow

import (
	"os"
	"testing"
)

// Env is the environment variable that turns the slow scenarios on.
const Env = "KEYWAY_SLOW_TESTS"

// Enabled reports whether slow scenarios run: Env is 1 or true.
func Enabled() bool {
	v := os.Getenv(Env)
	return v == "1" || v == "true"
}

// Skip skips t unless slow scenarios run.
func Skip(t testing.TB) {
	t.Helper()
	if !Enabled() {
		t.Skipf("slow scenario: skipped unless %s=1 (CI sets it; docs/testing.md)", Env)
	}
}
