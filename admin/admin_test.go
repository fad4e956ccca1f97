package admin

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

type flag struct{ v atomic.Bool }

func (f *flag) Ready() bool { return f.v.Load() }

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "keyway_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	ready := &flag{}
	s, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: reg, Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	base := "http://" + s.Addr().String()
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("/readyz before ready = %d, want 503", code)
	}
	ready.v.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz when ready = %d, want 200", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "keyway_test_total 3") {
		t.Fatalf("/metrics = %d %q", code, body)
	}
	if code, _ := get("/nope"); code != 404 {
		t.Fatalf("/nope = %d, want 404", code)
	}
	resp, err := http.Post(base+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Fatalf("POST /metrics = %d, want 405", resp.StatusCode)
	}
}

func TestValidate(t *testing.T) {
	if err := (Config{Listen: "nonsense"}).Validate(); err == nil || !strings.Contains(err.Error(), "listen:") {
		t.Fatalf("Validate() = %v", err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("empty listen (disabled) rejected: %v", err)
	}
}
