package integration

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"keyway/config"
	"keyway/fleetauth"
)

// unitFile is a systemd unit: its keys by section, every value kept
// (a key may repeat).
type unitFile map[string]map[string][]string

func readUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: not a unit file line: %q", path, line)
			}
			u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return u
}

func (u unitFile) get(section, key string) string {
	if v := u[section][key]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// The systemd units in deploy/systemd agree with each other and with
// the configuration they ship: the sockets are the addresses keyway's
// listeners name, under the names keyway matches them by; the service
// is Type=notify with NotifyAccess=all (an upgrade's new process reports
// its PID); it runs keyway proxy on the shipped file; and systemd waits
// longer for a stop than keyway's shutdown_timeout.
func TestSystemdUnits(t *testing.T) {
	dir := filepath.Join("..", "deploy", "systemd")
	// The gossip key file the configuration names is the host's; a test
	// key stands in for it.
	raw, err := os.ReadFile(filepath.Join(dir, "keyway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	key := WriteFile(t, t.TempDir(), "gossip.key", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	if !bytes.Contains(raw, []byte("/etc/keyway/gossip.key")) {
		t.Fatal("deploy/systemd/keyway.yaml names no gossip key file: gossip on 0.0.0.0 needs one")
	}
	raw = bytes.ReplaceAll(raw, []byte("/etc/keyway/gossip.key"), []byte(key))
	// So are the fleet's credentials: the proxies' file.
	creds := WriteFile(t, t.TempDir(), "credentials.yaml", string(fleetauth.Generate([]string{"orders"}).ForProxy().Marshal("test")))
	if !bytes.Contains(raw, []byte("credentials_file: /etc/keyway/credentials.yaml")) {
		t.Fatal("deploy/systemd/keyway.yaml names no credentials file: gossip on 0.0.0.0 needs the proxies' (keyway keys)")
	}
	raw = bytes.ReplaceAll(raw, []byte("/etc/keyway/credentials.yaml"), []byte(creds))
	cfg, err := config.LoadBytes("keyway.yaml", raw, config.WithEnv(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatalf("deploy/systemd/keyway.yaml: %v", err)
	}
	svc := readUnit(t, filepath.Join(dir, "keyway-proxy.service"))
	sockets := map[string]string{"keyway-proxy.socket": "proxy", "keyway-admin.socket": "admin"}
	for file, name := range sockets {
		s := readUnit(t, filepath.Join(dir, file))
		want := map[string]string{"proxy": cfg.Listen, "admin": cfg.Admin.Listen}[name]
		if got := s.get("Socket", "ListenStream"); got != want {
			t.Errorf("%s: ListenStream=%s, but keyway.yaml's %s listener is %s", file, got, name, want)
		}
		if got := s.get("Socket", "FileDescriptorName"); got != name {
			t.Errorf("%s: FileDescriptorName=%s, want %s (keyway matches sockets by it)", file, got, name)
		}
		if got := s.get("Socket", "Service"); got != "keyway-proxy.service" {
			t.Errorf("%s: Service=%s", file, got)
		}
		if !slices.Contains(strings.Fields(svc.get("Unit", "Requires")), file) {
			t.Errorf("keyway-proxy.service does not require %s", file)
		}
	}
	if svc.get("Service", "Type") != "notify" || svc.get("Service", "NotifyAccess") != "all" {
		t.Error("keyway-proxy.service: want Type=notify and NotifyAccess=all: keyway reports READY, and an upgrade's new process its MAINPID")
	}
	exec := strings.Fields(svc.get("Service", "ExecStart"))
	if len(exec) < 4 || exec[1] != "proxy" || exec[2] != "-c" || filepath.Base(exec[3]) != "keyway.yaml" {
		t.Errorf("ExecStart=%v, want keyway proxy -c .../keyway.yaml", exec)
	}
	stop, err := time.ParseDuration(svc.get("Service", "TimeoutStopSec") + "s")
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	if stop <= cfg.Server.ShutdownTimeout {
		t.Errorf("TimeoutStopSec %s <= server.shutdown_timeout %s: systemd would kill a drain in progress", stop, cfg.Server.ShutdownTimeout)
	}
	if cfg.Server.DrainIdle <= 0 || cfg.Server.DrainIdle >= cfg.Server.ShutdownTimeout {
		t.Errorf("server.drain_idle %s: want a grace within shutdown_timeout %s", cfg.Server.DrainIdle, cfg.Server.ShutdownTimeout)
	}
	if got := svc.get("Service", "ExecReload"); got != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload=%s: a reload is SIGHUP to the main process", got)
	}
}
