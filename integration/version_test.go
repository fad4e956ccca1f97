package integration

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"keyway/internal/slow"
)

// versionLine is `keyway version`'s line: version, commit, optional build
// date, Go version.
var versionLine = regexp.MustCompile(`^keyway (\S+) commit (\S+)(?: built (\S+))? (go\S+)\n$`)

// make build stamps the version, the commit and the build date: a wrong
// -X symbol would be ignored by the linker without a word.
func TestVersionStampedByMakeBuild(t *testing.T) {
	slow.Skip(t)
	skipShort(t)
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	head, err := exec.Command("git", "-C", "..", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "keyway")
	if out, err := exec.Command("make", "-C", "..", "build", "BIN="+bin, "VERSION=v0.0.0-itest").CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	m := versionLine.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("keyway version: %q, want %s", out, versionLine)
	}
	if m[1] != "v0.0.0-itest" {
		t.Errorf("version %q, want v0.0.0-itest (make build VERSION=...)", m[1])
	}
	if want := strings.TrimSpace(string(head))[:12]; strings.TrimSuffix(m[2], "-dirty") != want {
		t.Errorf("commit %q, want %s (git rev-parse HEAD)", m[2], want)
	}
	if at, err := time.Parse(time.RFC3339, m[3]); err != nil || time.Since(at) > time.Hour || time.Since(at) < -time.Minute {
		t.Errorf("build date %q: %v; want the time of the build", m[3], err)
	}
}

// The proxy's and the agent's /metrics say which build runs, as `keyway
// version` does.
func TestBuildInfoMetric(t *testing.T) {
	skipShort(t)
	out, err := exec.Command(Binary, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	m := versionLine.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("keyway version: %q, want %s", out, versionLine)
	}
	labels := map[string]string{"version": m[1], "commit": m[2], "go_version": m[4]}

	p := StartProxy(t, "p1", nil, 1)
	r := StartReplica(t, "orders-0", []string{p.Gossip})
	agentHTTP := r.Agent.WaitLine(t, logField("agent started", "http"), 20*time.Second)[1]
	for what, addr := range map[string]string{"proxy": p.Admin, "agent": agentHTTP} {
		if v := Metric(addr, "keyway_build_info", labels); v != 1 {
			t.Errorf("%s: keyway_build_info%v = %v, want 1", what, labels, v)
		}
	}
}
