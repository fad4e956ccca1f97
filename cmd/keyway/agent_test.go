package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"keyway/balancer"
	"keyway/config"
	"keyway/demo"
	"keyway/membership"
)

func TestAgentHelp(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"agent", "--help"}, &out, &errb)
	if err != nil || exitCode(err) != 0 || errb.Len() != 0 {
		t.Fatalf("agent --help: %v, stderr %q; want exit 0 and the usage on stdout", err, errb.String())
	}
	help := out.String()
	for _, want := range []string{
		"Usage: keyway agent [-c FILE] [flags]",
		"Precedence: built-in defaults < the file (-c) < KEYWAY_AGENT_* environment",
		"  --replica.addr STRING\n",
		"  --gossip.join LIST\n",
		"  --probe.interval DURATION\n",
		"  --drain.remove\n",
		"(default 30s; $KEYWAY_AGENT_DRAIN_TIMEOUT)",
		"  -c FILE\n",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("agent --help lacks %q:\n%s", want, help)
		}
	}
	// Every key has its flag.
	for _, f := range config.DescribeAgent() {
		if !strings.Contains(help, "  --"+f.Path) {
			t.Errorf("agent --help lacks --%s", f.Path)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"help"}, &out, &errb); err != nil || !strings.Contains(out.String(), "keyway agent") {
		t.Fatalf("top usage does not list agent: %v %q", err, out.String())
	}
}

func TestAgentCheck(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"file": {[]string{"-c", "../../examples/agent.yaml"},
			"ok: replica orders/orders-0 at 127.0.0.1:9001, probe GET /readyz every 1s (rise 2, fall 3), drain timeout 30s, join [127.0.0.1:7946], listen 127.0.0.1:9902\n"},
		"flags only": {[]string{"--replica.set", "orders", "--replica.addr", "127.0.0.1:9001", "--gossip.join", "127.0.0.1:7946", "--gossip.bind_addr", "127.0.0.1"},
			"ok: replica orders/(host name) at 127.0.0.1:9001, probe GET /readyz every 1s (rise 2, fall 3), drain timeout 30s, join [127.0.0.1:7946], listen 127.0.0.1:9902\n"},
		"a command after --": {[]string{"-c", "../../examples/agent.yaml", "--supervise.backoff_min", "100ms", "--", "keyway", "replica", "--name", "orders-0", "--", "x"},
			"ok: replica orders/orders-0 at 127.0.0.1:9001, probe GET /readyz every 1s (rise 2, fall 3), drain timeout 30s, join [127.0.0.1:7946], listen 127.0.0.1:9902, " +
				`supervises ["keyway" "replica" "--name" "orders-0" "--" "x"] (restart backoff 100ms to 30s, give up after 5 restarts in 10m, stop grace 10s)` + "\n"},
		"flags over the file": {[]string{"-c", "../../examples/agent.yaml", "--replica.name", "orders-9", "--probe.interval=250ms", "--gossip.join", "a:1", "--gossip.join", "b:2,c:3", "--listen="},
			"ok: replica orders/orders-9 at 127.0.0.1:9001, probe GET /readyz every 250ms (rise 2, fall 3), drain timeout 30s, join [a:1 b:2 c:3], listen off\n"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if err := run(context.Background(), append([]string{"agent", "--check"}, tc.args...), &out, &errb); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Fatalf("got  %q\nwant %q", out.String(), tc.want)
			}
		})
	}
}

func TestAgentConfigErrors(t *testing.T) {
	t.Setenv("KEYWAY_AGENT_PROBE_FALL", "0")
	t.Setenv("KEYWAY_GOSSIP_KEY", "") // empty: no key
	cases := map[string]struct {
		args []string
		want []string // substrings of the error
		code int
	}{
		"missing keys, bad flag and env values": {
			args: []string{"--replica.set", "orders", "--probe.rise", "x", "--drain.remove=maybe"},
			want: []string{
				"(no config file): replica.addr: required",
				"(no config file): gossip.join: required",
				"$KEYWAY_AGENT_PROBE_FALL: probe.fall: must be between 1 and 100, got 0",
				`--drain.remove: drain.remove: expected true or false, got "maybe"`,
				`--probe.rise: probe.rise: expected a whole number, got "x"`,
			},
			code: exitConfig,
		},
		"keyless gossip off loopback": {
			args: []string{"--check", "--replica.set", "orders", "--replica.addr", "127.0.0.1:9001", "--gossip.join", "127.0.0.1:7946"},
			want: []string{`(no config file): gossip.bind_addr: gossip would listen on "0.0.0.0", which is not a loopback address, without an encryption key`,
				"gossip.key_file or KEYWAY_GOSSIP_KEY", "gossip.insecure: true"},
			code: exitConfig,
		},
		"unknown flag":              {args: []string{"--replica.nmae", "x"}, want: []string{"flag provided but not defined: -replica.nmae"}, code: exitConfig},
		"extra arguments":           {args: []string{"orders"}, want: []string{"unexpected arguments: orders"}, code: exitConfig},
		"extra arguments before --": {args: []string{"orders", "--", "replica"}, want: []string{"unexpected arguments: orders"}, code: exitConfig},
		"nothing after --":          {args: []string{"--replica.set", "orders", "--"}, want: []string{"nothing after --"}, code: exitConfig},
		"empty program after --": {args: []string{"--check", "--replica.set", "orders", "--replica.addr", "127.0.0.1:9001", "--gossip.join", "127.0.0.1:7946",
			"--gossip.bind_addr", "127.0.0.1", "--", ""}, want: []string{"the command after -- is an empty string"}, code: exitConfig},
		"bad supervise values": {args: []string{"--supervise.backoff_min", "5ms", "--supervise.max_restarts", "0", "--supervise.window=500ms", "--", "replica"},
			want: []string{"--supervise.backoff_min: supervise.backoff_min: must be at least 10ms, got 5ms",
				"--supervise.max_restarts: supervise.max_restarts: must be between 1 and 1000, got 0",
				"--supervise.window: supervise.window: must be at least 1s, got 500ms"},
			code: exitConfig},
		"missing file": {args: []string{"-c", "/nonexistent/agent.yaml"}, want: []string{"read agent config"}, code: exitRuntime},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), append([]string{"agent"}, tc.args...), &out, &errb)
			if err == nil || exitCode(err) != tc.code {
				t.Fatalf("err %v, exit %d; want exit %d", err, exitCode(err), tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%s", w, err)
				}
			}
		})
	}
}

// `keyway agent` with flags only, beside a real demo replica, joined to a
// gossip seed: it becomes ready, answers /readyz, and drains, stops and
// returns nil when its context ends (SIGTERM).
func TestAgentRuns(t *testing.T) {
	rep, err := demo.Listen("orders-0", "127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- rep.Run(rctx) }()
	t.Cleanup(func() { rcancel(); <-rdone })

	g := membership.DefaultConfig()
	g.BindAddr, g.BindPort, g.Profile = "127.0.0.1", 0, "fast"
	seed, err := membership.New(g, membership.Meta{Role: membership.RoleReplica, Set: "orders", Replica: "seed", Addr: "127.0.0.1:1"}, membership.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan error, 1)
	go func() { sdone <- seed.Run(sctx) }()
	t.Cleanup(func() { scancel(); <-sdone })
	<-seed.Started()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"agent",
			"--replica.set", "orders", "--replica.name", "orders-0", "--replica.addr", rep.Addr(),
			"--gossip.join", seed.GossipAddr(), "--gossip.bind_addr", "127.0.0.1", "--gossip.profile", "fast",
			"--listen", "127.0.0.1:0", "--probe.interval", "20ms"}, io.Discard, pw)
		pw.Close()
	}()
	// The JSON log line "agent started" names the HTTP address.
	lines := make(chan map[string]any, 100)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				select {
				case lines <- m:
				default:
				}
			}
		}
		close(lines)
	}()
	var httpAddr string
	deadline := time.After(10 * time.Second)
	for httpAddr == "" {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatalf("agent exited: %v", <-done)
			}
			if m["msg"] == "agent started" {
				httpAddr, _ = m["http"].(string)
			}
		case <-deadline:
			t.Fatal("no \"agent started\" log line within 10s")
		}
	}
	readyz := func() int {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	end := time.Now().Add(10 * time.Second)
	for readyz() != 200 {
		if time.Now().After(end) {
			t.Fatal("/readyz not 200 within 10s")
		}
		select {
		case <-lines:
		case <-time.After(20 * time.Millisecond):
		}
	}
	for ready := false; !ready; {
		for _, m := range seed.Members() {
			ready = ready || (m.Meta.Replica == "orders-0" && m.Meta.State == balancer.StateReady && m.Meta.Addr == rep.Addr())
		}
		if time.Now().After(end) {
			t.Fatal("the seed did not see orders-0 ready within 10s")
		}
		if !ready {
			select {
			case <-lines:
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	start := time.Now()
	cancel()
	go func() {
		for range lines {
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not return within 15s of cancel")
	}
	t.Logf("cancel to exit without proxies: %s", time.Since(start))
	// A graceful leave: the seed sees it left (stopped first), not dead.
	for left := false; !left; {
		for _, m := range seed.Members() {
			left = left || (m.Meta.Replica == "orders-0" && m.Status == membership.StatusLeft && m.Meta.State == balancer.StateStopped)
		}
		if time.Now().After(end.Add(10 * time.Second)) {
			t.Fatalf("the seed did not see orders-0 leave: %+v", seed.Members())
		}
		if !left {
			<-time.After(20 * time.Millisecond)
		}
	}
}
