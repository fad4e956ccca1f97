package demo

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func startReplica(t *testing.T) *Replica {
	t.Helper()
	r, err := Listen("orders-0", "127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func call(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The drain probe answers 200 until the replica is told it holds work,
// 503 while it does, and 200 again once the work is done.
func TestDrainProbe(t *testing.T) {
	base := "http://" + startReplica(t).Addr()
	steps := []struct {
		method, path string
		code         int
		body         string
	}{
		{"GET", "/_drained", 200, `{"drained":true,"pending":0}`},
		{"POST", "/_pending?v=2", 200, `{"pending":2}`},
		{"GET", "/_drained", 503, `{"drained":false,"pending":2}`},
		{"GET", "/_pending", 200, `{"pending":2}`},
		{"POST", "/_pending?v=-1", 400, `{"error":"v must be a count, 0 or more"}`},
		{"POST", "/_pending?v=0", 200, `{"pending":0}`},
		{"GET", "/_drained", 200, `{"drained":true,"pending":0}`},
	}
	for _, s := range steps {
		if code, body := call(t, s.method, base+s.path); code != s.code || body != s.body {
			t.Fatalf("%s %s: %d %s, want %d %s", s.method, s.path, code, body, s.code, s.body)
		}
	}
}

// ?delay= holds a request before it is answered.
func TestDelay(t *testing.T) {
	base := "http://" + startReplica(t).Addr()
	start := time.Now()
	code, body := call(t, "POST", base+"/ingest?delay=300ms")
	if took := time.Since(start); code != 200 || took < 300*time.Millisecond || !strings.Contains(body, `"replica":"orders-0"`) {
		t.Fatalf("delayed request: %d %s after %s", code, body, took)
	}
}
