package admin

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeRestarter knows the set orders, whose agents supervise their
// processes, and the set bare, whose agents do not. It records the
// options of every restart it starts.
type fakeRestarter struct {
	mu    sync.Mutex
	opts  []RestartOptions
	acked []string
	last  map[string]RestartStatus
}

func (f *fakeRestarter) StartRestart(set string, opts RestartOptions, who Actor) (RestartStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch set {
	case "orders":
		f.opts = append(f.opts, opts)
		return RestartStatus{Set: set, State: "running", Force: opts.Force, StepTimeout: opts.StepTimeout.String(), Replicas: []string{"orders-0"}}, nil
	case "bare":
		return RestartStatus{}, &RefusedError{Action: "restart", Set: set, Replicas: []string{"bare-0", "bare-1"},
			Reason: "bare-0, bare-1 run without -- CMD: their agents supervise no process, so keyway cannot restart them",
			Fix:    "restart the replicas yourself, or run the agents with -- CMD"}
	}
	return RestartStatus{}, fmt.Errorf("%w %q", ErrUnknownSet, set)
}

func (f *fakeRestarter) RestartStatus(set string) (RestartStatus, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.last[set]
	return st, ok
}

func (f *fakeRestarter) AckRestart(set string, who Actor) (RestartStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.last[set]
	switch {
	case !ok:
		return st, fmt.Errorf("%w: none of %s ran", ErrNoRestart, set)
	case st.State == "running":
		return st, ErrRestartRunning
	case st.State == "done":
		return st, fmt.Errorf("%w: the last restart of %s succeeded", ErrNoRestart, set)
	}
	st.Acknowledged, st.AcknowledgedBy, st.Mark, st.Cleared = time.Now(), who.String(), false, ClearedAcknowledged
	f.last[set] = st
	f.acked = append(f.acked, set)
	return st, nil
}

func TestRestartEndpoints(t *testing.T) {
	f := &fakeRestarter{last: map[string]RestartStatus{
		"orders": {Set: "orders", State: "failed", Error: "orders-0 started: not within 10s", Mark: true, Started: time.Now()},
		"bare":   {Set: "bare", State: "done", Started: time.Now()},
	}}
	s, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewPedanticRegistry(), Restarter: f, Env: envWith("s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.srv.Handler)
	t.Cleanup(ts.Close)
	restart := ts.URL + "/v1/replica_sets/orders/restart"
	for name, tc := range map[string]struct {
		method, url, body string
		code              int
		force             bool   // of the restart started (code 202)
		errHas            string // in the error (other codes)
	}{
		"no body":                {"POST", restart, "", 202, false, ""},
		"white space":            {"POST", restart, " \n", 202, false, ""},
		"force in the body":      {"POST", restart, `{"force": true}`, 202, true, ""},
		"force false":            {"POST", restart, `{"force": false}`, 202, false, ""},
		"force in the query":     {"POST", restart + "?force=true&step_timeout=5s", "", 202, true, ""},
		"query and body agree":   {"POST", restart + "?force=true", `{"force": true}`, 202, true, ""},
		"query and body differ":  {"POST", restart + "?force=false", `{"force": true}`, 400, false, "the query says false and the body true"},
		"not a boolean":          {"POST", restart + "?force=yes", "", 400, false, `force: "yes" is not a boolean`},
		"unknown key":            {"POST", restart, `{"forse": true}`, 400, false, `{"force": true}`},
		"two objects":            {"POST", restart, `{"force": false}{"force": true}`, 400, false, "nothing started"},
		"force is not a boolean": {"POST", restart, `{"force": "yes"}`, 400, false, "force"},
		"refused":                {"POST", ts.URL + "/v1/replica_sets/bare/restart", "", 409, false, "bare-0, bare-1 run without -- CMD"},
		"unknown set":            {"POST", ts.URL + "/v1/replica_sets/nope/restart", "", 404, false, `unknown replica set "nope"`},
	} {
		t.Run(name, func(t *testing.T) {
			f.mu.Lock()
			n := len(f.opts)
			f.mu.Unlock()
			code, b := doBody(t, tc.method, tc.url, "s3cret", tc.body)
			if code != tc.code {
				t.Fatalf("%d %s, want %d", code, b, tc.code)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if code == 202 {
				var st RestartStatus
				if err := json.Unmarshal([]byte(b), &st); err != nil || st.Force != tc.force || len(f.opts) != n+1 || f.opts[n].Force != tc.force {
					t.Fatalf("answer %s (%v), options %+v; want force %v", b, err, f.opts[n:], tc.force)
				}
				return
			}
			if len(f.opts) != n {
				t.Fatalf("a restart started: %+v", f.opts[n:])
			}
			var e ErrorBody
			if err := json.Unmarshal([]byte(b), &e); err != nil || !strings.Contains(e.Error, tc.errHas) {
				t.Fatalf("error %s, want it to contain %q", b, tc.errHas)
			}
		})
	}

	// The refusal names the replicas, the reason and the fix.
	_, b := doBody(t, "POST", ts.URL+"/v1/replica_sets/bare/restart", "s3cret", `{"force": true}`)
	var ref RefusedBody
	if err := json.Unmarshal([]byte(b), &ref); err != nil || ref.Set != "bare" || strings.Join(ref.Replicas, ",") != "bare-0,bare-1" ||
		!strings.Contains(ref.Reason, "supervise no process") || !strings.Contains(ref.Fix, "-- CMD") ||
		ref.Error != "restart bare refused: "+ref.Reason+"; "+ref.Fix {
		t.Fatalf("refusal %s", b)
	}

	// Acknowledging: a bearer token, POST only; a failed restart is
	// acknowledged and no longer marked, a successful one has nothing to
	// acknowledge.
	ack := restart + "/ack"
	for _, tc := range []struct {
		method, url, token string
		code               int
		errHas             string
	}{
		{"POST", ack, "", 401, "bearer token"},
		{"GET", ack, "s3cret", 405, "use POST"},
		{"DELETE", ack, "s3cret", 405, "use POST"},
		{"POST", ts.URL + "/v1/replica_sets/bare/restart/ack", "s3cret", 409, "succeeded"},
		{"POST", ts.URL + "/v1/replica_sets/nope/restart/ack", "s3cret", 404, "none of nope ran"},
		{"POST", ack, "s3cret", 200, ""},
	} {
		code, body := do(t, tc.method, tc.url, tc.token)
		if code != tc.code {
			t.Errorf("%s %s: %d %v, want %d", tc.method, tc.url, code, body, tc.code)
			continue
		}
		if msg, _ := body["error"].(string); !strings.Contains(msg, tc.errHas) {
			t.Errorf("%s %s: error %q, want %q", tc.method, tc.url, msg, tc.errHas)
		}
		if code == 200 && (body["cleared"] != ClearedAcknowledged || body["acknowledged_by"] == "" || body["mark"] != nil || body["state"] != "failed") {
			t.Errorf("acknowledged: %v", body)
		}
	}
	if code, body := do(t, "GET", restart, ""); code != 200 || body["acknowledged"] == nil || body["error"] != "orders-0 started: not within 10s" {
		t.Errorf("GET after the ack: %d %v; want the record kept, acknowledged", code, body)
	}
}
