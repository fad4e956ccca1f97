package integration

import (
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"keyway/internal/poll"
)

// A proxy whose audit sink has no credential (and no reachable store)
// logs one warning, spools, and routes as before: the trail is best
// effort and never in the way.
func TestAuditSinkWithoutCredentials(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
		"AWS_CONFIG_FILE": filepath.Join(dir, "none"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "none"),
	} {
		t.Setenv(k, v)
	}
	_, replica := StartReplicaProcess(t, "r0")
	cfg := WriteFile(t, dir, "keyway.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
audit: {sink: "s3://trail/keyway", segment_age: 200ms, path_style: true}
replica_sets:
  - name: orders
    replicas: 1
    key: [{header: X-Key}]
    static: [{name: r0, addr: %q}]
`, replica))
	p := Start(t, "proxy", "proxy", "-c", cfg)
	proxy := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	admin := p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]
	send := func(n int) {
		t.Helper()
		for i := range n {
			req, _ := http.NewRequest(http.MethodPost, "http://"+proxy+"/ingest", strings.NewReader("x"))
			req.Header.Set("X-Key", fmt.Sprintf("k-%d", i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i, resp.StatusCode)
			}
		}
	}
	send(20)
	p.WaitLine(t, regexp.MustCompile(`"msg":"audit sink: the object store is unreachable; spooling segments until it is back"`), 20*time.Second)
	poll.Until(t, 10*time.Second, "segments spooled", func() bool { return Metric(admin, "keyway_audit_sink_spooled_bytes", nil) > 0 })
	send(20)
	if n := len(p.Logs("audit sink: the object store is unreachable; spooling segments until it is back")); n != 1 {
		t.Fatalf("%d warnings, want 1", n)
	}
	if got := Metric(admin, "keyway_audit_sink_dropped_events_total", nil); got != 0 {
		t.Fatalf("keyway_audit_sink_dropped_events_total = %v, want 0", got)
	}
	w := p.Logs("audit sink: the object store is unreachable; spooling segments until it is back")[0]
	t.Logf("the warning: %v", w["error"])
}
