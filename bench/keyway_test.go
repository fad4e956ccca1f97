package main

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// keywayBuild is the keyway binary the package's smoke tests share: built
// once (with -race when the tests run under it) instead of once per test.
// Under `go test -race ./...` every package compiles at once, and a build
// per test took the smoke tests past their own deadlines.
var keywayBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// testKeyway returns the shared keyway binary, building it on first use.
func testKeyway(t *testing.T) string {
	t.Helper()
	keywayBuild.once.Do(func() {
		repo, err := moduleRoot()
		if err != nil {
			keywayBuild.err = err
			return
		}
		if keywayBuild.dir, err = os.MkdirTemp("", "keyway-bench-test-"); err != nil {
			keywayBuild.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		keywayBuild.bin, _, keywayBuild.err = buildKeyway(ctx, repo, "", keywayBuild.dir, raceEnabled)
	})
	if keywayBuild.err != nil {
		t.Fatalf("building keyway for the smoke tests: %v", keywayBuild.err)
	}
	return keywayBuild.bin
}

// skipOffLinux skips a test that runs the harness, or reads what it
// reads from /proc, where the harness does not run (checkPlatform).
func skipOffLinux(t *testing.T) {
	t.Helper()
	if err := checkPlatform(); err != nil {
		t.Skip(err)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if keywayBuild.dir != "" {
		os.RemoveAll(keywayBuild.dir)
	}
	os.Exit(code)
}
