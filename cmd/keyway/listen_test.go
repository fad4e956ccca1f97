package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A port another process holds stops keyway with one line naming the key,
// the flag and the environment variable that change it, exit 2, and no
// stack trace in the logs.
func TestTakenPortNamesItsKey(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().String()
	_, port, _ := net.SplitHostPort(taken)

	dir := t.TempDir()
	proxyFile := filepath.Join(dir, "proxy.yaml")
	os.WriteFile(proxyFile, []byte(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: "127.0.0.1:9"}]
`), 0o644)
	agentFile := filepath.Join(dir, "agent.yaml")
	os.WriteFile(agentFile, []byte(`replica: {set: orders, name: orders-0, addr: "127.0.0.1:9"}
listen: 127.0.0.1:0
gossip: {bind_addr: 127.0.0.1, bind_port: 0, join: ["127.0.0.1:9"]}
`), 0o644)

	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"proxy listen": {
			[]string{"proxy", "-c", proxyFile, "--listen", taken},
			"listen: cannot listen on " + taken + ": the address is already in use (another process, perhaps another keyway, listens there); choose another port: change listen in " + proxyFile + ", pass --listen ADDR or set KEYWAY_LISTEN",
		},
		"admin listen": {
			[]string{"proxy", "-c", proxyFile, "--admin-listen", taken},
			"admin.listen: cannot listen on " + taken + ": the address is already in use",
		},
		"proxy gossip": {
			[]string{"proxy", "-c", proxyFile, "--gossip-bind-port", port},
			"gossip.bind_port: cannot listen on " + taken + ": the address is already in use (another process, perhaps another keyway, listens there); choose another port: change gossip.bind_port in " + proxyFile + ", pass --gossip-bind-port PORT or set KEYWAY_GOSSIP_BIND_PORT (0 picks a free port)",
		},
		"agent listen": {
			[]string{"agent", "-c", agentFile, "--listen", taken},
			"listen: cannot listen on " + taken + ": the address is already in use (another process, perhaps another keyway, listens there); choose another port: change listen in " + agentFile + ", pass --listen ADDR or set KEYWAY_AGENT_LISTEN",
		},
		"agent gossip without a file": {
			[]string{"agent", "--replica.set", "orders", "--replica.addr", "127.0.0.1:9", "--listen", "", "--gossip.bind_addr", "127.0.0.1",
				"--gossip.bind_port", port, "--gossip.join", "127.0.0.1:9"},
			"gossip.bind_port: cannot listen on " + taken + ": the address is already in use (another process, perhaps another keyway, listens there); choose another port: pass --gossip.bind_port PORT or set KEYWAY_AGENT_GOSSIP_BIND_PORT (key gossip.bind_port) (0 picks a free port)",
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			err := run(ctx, tc.args, &out, &errb)
			if err == nil || err.Error() != tc.want && !strings.HasPrefix(err.Error(), tc.want) || exitCode(err) != exitConfig {
				t.Fatalf("err %v (exit %d)\nwant exit 2 and %q", err, exitCode(err), tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("want one line, got %q", err)
			}
			if strings.Contains(errb.String(), "stacktrace") {
				t.Errorf("the logs carry a stack trace:\n%s", errb.String())
			}
		})
	}
}
