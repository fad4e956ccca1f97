package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
)

// reloadConfig is a proxy configuration over three static replicas. The
// valid variants differ in what a reload may change (retries, timeouts
// that renew the pools, a second set coming and going, the log level);
// the invalid ones are a YAML error, an unknown key, a bad value and a
// start-only key.
func reloadConfig(variant int, valid bool, addrs []string, tokenFile string) string {
	static := ""
	for i, a := range addrs {
		static += fmt.Sprintf("      - {name: r%d, addr: %q}\n", i, a)
	}
	level := []string{"info", "debug"}[variant%2]
	attempts := 1 + variant%3
	idle := []string{"30s", "45s"}[variant/2%2]
	events := ""
	if variant%4 == 0 {
		events = fmt.Sprintf(`  - name: events
    match: {path_prefix: /events}
    static:
      - {name: e0, addr: %q}
`, addrs[0])
	}
	listen := `"127.0.0.1:0"`
	extra := ""
	if !valid {
		switch variant % 4 {
		case 0:
			return "listen: [unclosed\n"
		case 1:
			extra = "    retrys: {attempts: 2}\n" // did-you-mean retries
		case 2:
			attempts = 99
		case 3:
			listen = `"127.0.0.1:1"` // start-only
		}
	}
	return fmt.Sprintf(`listen: %s
admin: {listen: "127.0.0.1:0", token_file: %q}
log: {level: %s, format: json}
replica_sets:
  - name: orders
    replicas: 3
    key: [{header: X-Key}]
    retries: {attempts: %d}
    timeouts: {connect: 500ms, request: 5s, idle: %s}
    static:
%s%s%s`, listen, tokenFile, level, attempts, idle, static, extra, events)
}

// writeAtomic replaces a file the way a configuration manager does: a new
// file renamed over the old one, so a reader sees one or the other.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// 100 reloads, valid and invalid alternating, half by SIGHUP and half by
// POST /v1/reload, under a bounded client loop: every request is answered
// 200 and received by a replica, no client connection is dropped, and
// keyway_config_reloads_total counts 50 successes and 50 failures.
func TestReload100UnderTraffic(t *testing.T) {
	dir := t.TempDir()
	var addrs []string
	for i := range 3 {
		_, addr := StartReplicaProcess(t, fmt.Sprintf("r%d", i))
		addrs = append(addrs, addr)
	}
	token := WriteFile(t, dir, "token", "reload-token\n")
	cfgPath := filepath.Join(dir, "keyway.yaml")
	writeAtomic(t, cfgPath, reloadConfig(1, true, addrs, token))
	p := Start(t, "proxy", "proxy", "-c", cfgPath)
	proxyAddr := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	admin := p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]

	const workers = 4
	var dials atomic.Int64
	var ok, bad atomic.Int64
	var firstBad atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		tr := &http.Transport{MaxIdleConnsPerHost: 1, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: tr}
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			for i := 0; i < 200000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Every other request goes to /events: to the events set
				// while the applied file has it, else to orders (prefix "/"),
				// so requests cross the set's addition and removal.
				path := []string{"/ingest", "/events/e"}[i%2]
				req, _ := http.NewRequest("POST", "http://"+proxyAddr+path, strings.NewReader("payload"))
				req.Header.Set("X-Key", fmt.Sprintf("w%d-k%d", w, i%97))
				resp, err := hc.Do(req)
				if err != nil {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, err.Error())
					continue
				}
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				if resp.StatusCode != 200 {
					bad.Add(1)
					// keyway's JSON body says why it answered itself.
					firstBad.CompareAndSwap(nil, fmt.Sprintf("status %d for %s at %s: %s", resp.StatusCode, path, time.Now().UTC().Format(time.RFC3339Nano), body))
					continue
				}
				ok.Add(1)
			}
		})
	}
	poll.Until(t, 10*time.Second, "traffic flowing", func() bool { return ok.Load() > 100 })

	reloads := func(result string) float64 {
		return Metric(admin, "keyway_config_reloads_total", map[string]string{"result": result})
	}
	post := func() (int, string) {
		req, _ := http.NewRequest("POST", "http://"+admin+"/v1/reload", nil)
		req.Header.Set("Authorization", "Bearer reload-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	setCount := func() int {
		resp, err := http.Get("http://" + admin + "/v1/replica_sets")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Sets []json.RawMessage `json:"replica_sets"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return len(body.Sets)
	}
	for i := range 100 {
		valid := i%2 == 0
		writeAtomic(t, cfgPath, reloadConfig(i/2, valid, addrs, token))
		want := map[bool]string{true: "success", false: "failure"}[valid]
		before := reloads(want)
		if (i/2)%2 == 0 {
			kill(t, p.Pid(), syscall.SIGHUP)
			poll.Until(t, 10*time.Second, fmt.Sprintf("reload %d (SIGHUP, %s) counted", i, want), func() bool { return reloads(want) == before+1 })
		} else {
			code, body := post()
			if wantCode := map[bool]int{true: 200, false: 422}[valid]; code != wantCode {
				t.Fatalf("reload %d (POST, valid %v): %d %s", i, valid, code, body)
			}
			if got := reloads(want); got != before+1 {
				t.Fatalf("reload %d (POST): keyway_config_reloads_total{result=%q} = %v, want %v", i, want, got, before+1)
			}
		}
		// The events set exists exactly while the last applied file has it.
		if wantSets := map[bool]int{true: 2, false: 1}[(i/2)%4 == 0]; valid && setCount() != wantSets {
			t.Fatalf("after reload %d: %d replica sets, want %d", i, setCount(), wantSets)
		}
	}
	close(stop)
	wg.Wait()

	if bad.Load() != 0 {
		t.Fatalf("%d of %d requests failed across 100 reloads; first: %v", bad.Load(), ok.Load()+bad.Load(), firstBad.Load())
	}
	if d := dials.Load(); d != workers {
		t.Errorf("clients dialed %d connections for %d workers: a reload dropped a connection", d, workers)
	}
	if s, f := reloads("success"), reloads("failure"); s != 50 || f != 50 {
		t.Fatalf("reloads success %v failure %v, want 50 and 50", s, f)
	}
	// Every acknowledged request reached a replica, exactly once.
	var received int64
	for _, a := range addrs {
		for _, n := range Stats(t, a) {
			received += n
		}
	}
	if received != ok.Load() {
		t.Fatalf("replicas received %d requests, clients got %d answers of 200", received, ok.Load())
	}
	// Every refused reload logged its problems.
	if n := len(p.Logs("configuration reload refused; the running configuration stays")); n != 50 {
		t.Errorf("%d refusals logged, want 50", n)
	}
	probs := p.Logs("configuration problem")
	var text strings.Builder
	for _, m := range probs {
		fmt.Fprintln(&text, m["problem"])
	}
	for _, want := range []string{"did you mean", "retries.attempts", "listen: running with", "yaml"} {
		if !strings.Contains(strings.ToLower(text.String()), strings.ToLower(want)) {
			t.Errorf("no logged problem mentions %q:\n%s", want, text.String())
		}
	}
	t.Logf("%d requests, all 200, over %d connections across 100 reloads (50 applied, 50 refused)", ok.Load(), dials.Load())
}
