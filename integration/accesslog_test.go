package integration

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/slow"
)

// readAccessLines parses the JSON lines of an access log file ("" when
// the file does not exist).
func readAccessLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: not a JSON line: %v\n%s", path, err, l)
		}
		out = append(out, m)
	}
	return out
}

// accessPost sends one POST through the proxy and fails the test on a non-200.
func accessPost(t *testing.T, proxy, path string, hdr ...string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+proxy+path, strings.NewReader("payload"))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: status %d", path, resp.StatusCode)
	}
}

// TestAccessLogFileRotation: keyway proxy writes its access log to a
// file, within about a second and without a shutdown; logrotate's create
// mode (rename, then SIGUSR1) sends the later lines to a new file of the
// same name and loses none; the key is an HMAC with the configured secret
// and its path segment is hidden; the last lines are written at exit.
func TestAccessLogFileRotation(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	dir := t.TempDir()
	_, replica := StartReplicaProcess(t, "r0")
	secret := "integration-secret-0123456789"
	secretFile := WriteFile(t, dir, "secret", secret+"\n")
	logPath := filepath.Join(dir, "access.log")
	cfg := WriteFile(t, dir, "keyway.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log:
  level: info
  access_log: true
  access: {path: %q, key: hmac, key_secret_file: %q}
replica_sets:
  - name: orders
    replicas: 1
    key: [{header: X-Key}, {path_segment: 2}]
    static: [{name: r0, addr: %q}]
`, logPath, secretFile, replica))
	p := Start(t, "proxy", "proxy", "-c", cfg)
	proxy := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	admin := p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]

	accessPost(t, proxy, "/ingest", "X-Key", "customer-42", "X-Request-Id", "rid-1")
	accessPost(t, proxy, "/ingest/customer-42")
	accessPost(t, proxy, "/ingest/customer-43")
	poll.Until(t, 5*time.Second, "3 lines in the access log, flushed while keyway runs", func() bool { return len(readAccessLines(t, logPath)) == 3 })

	// logrotate, create mode: rename, then signal.
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	kill(t, p.Pid(), sigUSR1)
	p.WaitLine(t, regexp.MustCompile(`"msg":"access log reopened"`), 10*time.Second)
	accessPost(t, proxy, "/ingest", "X-Key", "customer-44")
	poll.Until(t, 5*time.Second, "a new access log file with the line after the rotation", func() bool { return len(readAccessLines(t, logPath)) == 1 })
	if got := Metric(admin, "keyway_access_log_reopens_total", map[string]string{"result": "success"}); got != 1 {
		t.Fatalf("keyway_access_log_reopens_total{result=success} = %v, want 1", got)
	}
	if got := Metric(admin, "keyway_access_log_dropped_total", map[string]string{"reason": "buffer_full"}); got != 0 {
		t.Fatalf("keyway_access_log_dropped_total{reason=buffer_full} = %v, want 0", got)
	}

	accessPost(t, proxy, "/ingest", "X-Key", "customer-45") // written at exit
	p.Term(t, 30*time.Second)

	rotated, current := readAccessLines(t, logPath+".1"), readAccessLines(t, logPath)
	if len(rotated) != 3 || len(current) != 2 {
		t.Fatalf("%d lines in the rotated file and %d in the new one, want 3 and 2", len(rotated), len(current))
	}
	hmacOf := func(key string) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(key))
		return hex.EncodeToString(m.Sum(nil))[:16]
	}
	want := []struct{ path, key string }{
		{"/ingest", "customer-42"}, {"/ingest/{key}", "customer-42"}, {"/ingest/{key}", "customer-43"},
		{"/ingest", "customer-44"}, {"/ingest", "customer-45"},
	}
	for i, l := range append(rotated, current...) {
		if l["path"] != want[i].path || l["key"] != hmacOf(want[i].key) || l["status"] != 200.0 || l["set"] != "orders" || l["replica"] != "r0" || l["method"] != "POST" {
			t.Errorf("line %d: %v; want path %s, key HMAC(%s) = %s, 200 from orders/r0", i, l, want[i].path, want[i].key, hmacOf(want[i].key))
		}
		if strings.Contains(fmt.Sprint(l), "customer-") {
			t.Errorf("line %d carries the key in clear: %v", i, l)
		}
	}
	if rotated[0]["request_id"] != "rid-1" {
		t.Errorf("request_id %v, want the client's rid-1", rotated[0]["request_id"])
	}
}

// TestAccessLogStdout: a configuration from before log.access
// (access_log: true alone) still writes the access log to stdout, without
// the key.
func TestAccessLogStdout(t *testing.T) {
	skipShort(t)
	_, replica := StartReplicaProcess(t, "r0")
	cfg := WriteFile(t, t.TempDir(), "keyway.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, access_log: true}
replica_sets:
  - name: orders
    replicas: 1
    static: [{name: r0, addr: %q}]
`, replica))
	p := Start(t, "proxy", "proxy", "-c", cfg)
	proxy := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	accessPost(t, proxy, "/ingest", "X-Key", "customer-42", "X-Request-Id", "rid-stdout")
	m := p.WaitLine(t, regexp.MustCompile(`^\{"time":.*"request_id":"rid-stdout".*\}$`), 10*time.Second)
	var l map[string]any
	if err := json.Unmarshal([]byte(m[0]), &l); err != nil {
		t.Fatal(err)
	}
	if _, ok := l["key"]; ok || l["status"] != 200.0 || l["replica"] != "r0" {
		t.Fatalf("stdout line %v: want status 200 from r0 and no key", l)
	}
}

// SIGUSR1 reopens the proxy's access log; every other keyway process
// survives one (pkill -USR1 keyway reaches them all).
func TestSIGUSR1IsHarmlessToAgents(t *testing.T) {
	skipShort(t)
	a := StartProxy(t, "proxy", nil, 1)
	rep := StartReplica(t, "orders-0", []string{a.Gossip})
	a.WaitRotation(t, 1, 30*time.Second)
	agentHTTP := rep.Agent.WaitLine(t, logField("agent started", "http"), 10*time.Second)[1]
	for _, p := range []*Proc{rep.Agent, rep.Replica} {
		kill(t, p.Pid(), sigUSR1)
	}
	// Both answer after the signal (a process it ended could not).
	if resp, err := http.Get("http://" + agentHTTP + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the agent after SIGUSR1: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	for range 20 {
		if code, _, err := NewClient().Send(a.Addr, "k"); err != nil || code != 200 {
			t.Fatalf("after SIGUSR1: %d %v", code, err)
		}
	}
	if rep.Agent.Exited() || rep.Replica.Exited() {
		t.Fatal("a SIGUSR1 ended the agent or the replica")
	}
	a.WaitRotation(t, 1, 5*time.Second)
}
