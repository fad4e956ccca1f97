package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func TestAdminHeaderOnEveryAnswer(t *testing.T) {
	v := testView()
	base := startAPI(t, Options{Sets: v, Members: v, Events: v, Config: v})
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/v1/replica_sets", 200},
		{"GET", "/v1/replica_sets/nope", 404},
		{"GET", "/v1/nothing", 404},
		{"POST", "/v1/route", 405},
		{"GET", "/v1/fleet", 501},
		{"POST", "/v1/replica_sets/orders/replicas/orders-0/drain", 401}, // no token
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code || resp.Header.Get(AdminHeader) != "1" {
			t.Errorf("%s %s: HTTP %d, %s %q; want HTTP %d with %s: 1", tc.method, tc.path, resp.StatusCode, AdminHeader,
				resp.Header.Get(AdminHeader), tc.code, AdminHeader)
		}
	}
	// The client takes them, and its errors are the API's.
	c := &Client{Addr: strings.TrimPrefix(base, "http://")}
	if sets, _, err := c.Sets(); err != nil || len(sets) != 2 {
		t.Fatalf("Sets: %v %v", sets, err)
	}
	if _, _, err := c.Set("nope"); err == nil || errors.Is(err, ErrNotAdmin) || !strings.Contains(err.Error(), `unknown replica set "nope"`) {
		t.Fatalf("Set(nope): %v", err)
	}
}

func TestClientRejectsOtherServers(t *testing.T) {
	for name, tc := range map[string]struct {
		handler http.HandlerFunc
		want    string
	}{
		"the proxy listener's own error": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(404)
				w.Write([]byte(`{"error":"no replica set matches","replica_set":"","replica":""}` + "\n"))
			},
			want: "answered like a keyway proxy listener, not the admin API, and nothing else was sent to it: pass the admin address (admin.listen, default 127.0.0.1:9901)",
		},
		"a replica behind the proxy listener, 200 JSON": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"replica":"orders-0","key":""}`))
			},
			want: "is not a keyway admin API: GET /v1/ answered HTTP 200, application/json without the X-Keyway-Admin header, and nothing else was sent to it: pass the admin address",
		},
		"a web server's 404 page": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Server", "nginx")
				http.NotFound(w, r)
			},
			want: "answered HTTP 404, text/plain; charset=utf-8, server nginx without the X-Keyway-Admin header",
		},
		"JSON shaped like the API, but not keyway's": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"replica_sets":[]}`))
			},
			want: "is not a keyway admin API",
		},
	} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			var seen []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%s %s auth=%q actor=%q body=%q", r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get(ActorHeader), b))
				mu.Unlock()
				tc.handler(w, r)
			}))
			defer srv.Close()
			c := &Client{Addr: strings.TrimPrefix(srv.URL, "http://")}
			sets, _, err := c.Sets()
			if !errors.Is(err, ErrNotAdmin) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), c.Addr+" ") {
				t.Fatalf("Sets: %v, %v; want ErrNotAdmin saying %q", sets, err, tc.want)
			}
			if _, err := c.Export(); !errors.Is(err, ErrNotAdmin) {
				t.Fatalf("Export: %v, want ErrNotAdmin", err)
			}
			c.Token, c.Actor = "s3cret", "alice"
			if _, _, err := c.Scale("orders", 3); !errors.Is(err, ErrNotAdmin) {
				t.Fatalf("Scale: %v, want ErrNotAdmin", err)
			}
			if _, _, err := c.Drain("orders", "orders-0", true); !errors.Is(err, ErrNotAdmin) {
				t.Fatalf("Drain: %v, want ErrNotAdmin", err)
			}
			// The server saw the probe of each call and nothing else: no
			// token, no actor, no body, no mutation.
			mu.Lock()
			defer mu.Unlock()
			for _, got := range seen {
				if got != `GET /v1/ auth="" actor="" body=""` {
					t.Errorf("the server saw %s; want only the probe, GET /v1/ without a token, actor or body", got)
				}
			}
			if len(seen) != 4 {
				t.Errorf("the server saw %d requests, want 4 probes: %q", len(seen), seen)
			}
		})
	}
}
