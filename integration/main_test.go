package integration

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	flag.Parse()
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
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts keyway processes")
	}
}
