// Package s3test runs a real S3-compatible server on loopback for tests:
// SeaweedFS's `weed server` with its S3 gateway, built by
// scripts/s3-testserver.sh. Start skips the test when the binary is
// absent (unless S3_TEST_REQUIRE=1), and always unless slow scenarios run
// (KEYWAY_SLOW_TESTS=1, package internal/slow).
package s3test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/slow"
)

// Version is the SeaweedFS module version scripts/s3-testserver.sh builds.
const Version = "v0.0.0-20261109003541-7506e5f91cd6"

// Bin is the directory of the weed binary: $S3_TEST_BIN, else the build
// script's cache.
func Bin() string {
	if d := os.Getenv("S3_TEST_BIN"); d != "" {
		return d
	}
	if d := os.Getenv("S3_TEST_CACHE"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "keyway", "seaweedfs", Version)
}

// Server is a running SeaweedFS with its S3 gateway.
type Server struct {
	// Endpoint is the S3 gateway's URL (path-style: Endpoint/BUCKET/KEY).
	Endpoint string
	pid      int
}

// Start runs a fresh server (its data in a temporary directory) and
// stops it, by its PID, when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	slow.Skip(t)
	weed := filepath.Join(Bin(), "weed")
	if _, err := os.Stat(weed); err != nil {
		if os.Getenv("S3_TEST_REQUIRE") == "1" {
			t.Fatalf("s3test: %s is missing; run scripts/s3-testserver.sh", weed)
		}
		t.Skipf("s3test: no S3 server here (%s): run scripts/s3-testserver.sh", weed)
	}
	dir := t.TempDir()
	ports := make([]int, 4)
	for i := range ports {
		ports[i] = freePort(t)
	}
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(weed, "server", "-dir="+data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+strconv.Itoa(ports[0]), "-volume.port="+strconv.Itoa(ports[1]),
		"-filer", "-filer.port="+strconv.Itoa(ports[2]), "-s3", "-s3.port="+strconv.Itoa(ports[3]),
		"-master.volumeSizeLimitMB=64")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	s := &Server{Endpoint: "http://127.0.0.1:" + strconv.Itoa(ports[3]), pid: cmd.Process.Pid}
	t.Cleanup(func() {
		_ = syscall.Kill(-s.pid, syscall.SIGKILL)
		<-exited
	})
	hc := http.Client{Timeout: time.Second}
	poll.Until(t, 90*time.Second, "SeaweedFS's S3 gateway answering", func() bool {
		resp, err := hc.Get(s.Endpoint + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode < 500
	})
	return s
}

// CreateBucket makes a bucket (anonymous: the server checks no keys).
func (s *Server) CreateBucket(t testing.TB, bucket string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	poll.Until(t, 30*time.Second, "bucket "+bucket+" created", func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, s.Endpoint+"/"+bucket, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200 || resp.StatusCode == 409
	})
}

// Stop freezes the server (SIGSTOP): an outage in which connections hang,
// as behind a broken network. Resume ends it.
func (s *Server) Stop() { _ = syscall.Kill(-s.pid, syscall.SIGSTOP) }

// Resume ends an outage begun by Stop.
func (s *Server) Resume() { _ = syscall.Kill(-s.pid, syscall.SIGCONT) }

// freePort returns a free loopback port whose SeaweedFS gRPC twin (the
// port + 10000) is a port too, and free.
func freePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if p+10000 > 65535 {
			continue
		}
		if ln2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000)); err == nil {
			ln2.Close()
			return p
		}
	}
	t.Fatal("no free port pair for SeaweedFS")
	return 0
}
