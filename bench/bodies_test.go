package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/config"
	"keyway/internal/slow"
	"keyway/proxy"
)

func TestParseBodies(t *testing.T) {
	for in, tc := range map[string]struct {
		want []proxy.ByteSize
		err  string
	}{
		"":                {},
		"1MiB,64MiB":      {want: []proxy.ByteSize{1 << 20, 64 << 20}},
		" 4096 , 500KB":   {want: []proxy.ByteSize{4096, 500_000}},
		"1GiB":            {want: []proxy.ByteSize{1 << 30}},
		"2GiB":            {err: "want 1B..1GiB"},
		"0":               {err: "want 1B..1GiB"},
		"1MiB,x":          {err: "invalid size"},
		"-1MiB":           {err: "invalid size"},
		"1MiB,1048576":    {err: "given twice"},
		"64MiB,,1MiB":     {want: []proxy.ByteSize{64 << 20, 1 << 20}},
		"1MiB,64MiB,1MiB": {err: "1MiB given twice"},
	} {
		got, err := parseBodies(in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseBodies(%q) = %v, %v; want an error with %q", in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseBodies(%q) = %v, %v; want %v", in, got, err, tc.want)
		}
	}
}

func TestBodiesValidate(t *testing.T) {
	base := func() Config {
		return Config{Duration: time.Second, Connections: 1, Replicas: 1, Keys: 1, Rounds: 1, LoadGen: "auto",
			Targets: []string{"keyway"}, Bodies: []proxy.ByteSize{1 << 20}, BodyConns: 4}
	}
	for name, tc := range map[string]struct {
		modify func(*Config)
		err    string
	}{
		"valid":          {modify: func(*Config) {}},
		"no connections": {modify: func(c *Config) { c.BodyConns = 0 }, err: "-body-conns 0"},
		"too large":      {modify: func(c *Config) { c.Bodies = []proxy.ByteSize{2 << 30} }, err: "want 1B..1GiB"},
		"saturation":     {modify: func(c *Config) { c.Saturation = true; c.Sat = SatConfig{} }, err: "-bodies cannot be combined"},
		"tls":            {modify: func(c *Config) { c.TLS = true }, err: "-bodies cannot be combined"},
		"instructions":   {modify: func(c *Config) { c.Instructions = 100 }, err: "-bodies cannot be combined"},
	} {
		c := base()
		tc.modify(&c)
		err := c.validate()
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: validate() = %v; want an error with %q", name, err, tc.err)
		}
	}
}

// TestBodyTargetConfigs: with bodies, every proxy is set up to stream
// them up to the largest size with long timeouts; without, the configs
// are those of the other modes.
func TestBodyTargetConfigs(t *testing.T) {
	env := func(sizes ...proxy.ByteSize) *targetEnv {
		return &targetEnv{replicas: []string{"127.0.0.1:1"}, maxConns: 100, nofile: 1024, bodies: bodyTargetEnv(sizes)}
	}
	read := func(t *testing.T, dir, name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	check := func(t *testing.T, file, text string, want, not []string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s lacks %q:\n%s", file, w, text)
			}
		}
		for _, n := range not {
			if strings.Contains(text, n) {
				t.Errorf("%s has %q:\n%s", file, n, text)
			}
		}
	}

	t.Run("keyway", func(t *testing.T) {
		dir := t.TempDir()
		args, err := keywayConfig(dir, 8080, env(1<<20, 64<<20))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(args[len(args)-1])
		if err != nil {
			t.Fatal(err)
		}
		s := cfg.ReplicaSets[0]
		if s.MaxBodyBytes != 64<<20 || s.Timeouts.Request != bodyTimeout || s.Timeouts.Idle != 10*time.Minute {
			t.Errorf("max_body_bytes %v, timeouts %+v; want 64MiB, request %v", s.MaxBodyBytes, s.Timeouts, bodyTimeout)
		}
		if cfg.Server.ReadTimeout != bodyTimeout || cfg.Server.WriteTimeout != bodyTimeout {
			t.Errorf("server read_timeout %v, write_timeout %v; want %v", cfg.Server.ReadTimeout, cfg.Server.WriteTimeout, bodyTimeout)
		}
		dir = t.TempDir()
		args, err = keywayConfig(dir, 8080, env())
		if err != nil {
			t.Fatal(err)
		}
		check(t, "keyway.yaml", read(t, dir, "keyway.yaml"), []string{"    timeouts: {idle: 10m}\n"}, []string{"max_body_bytes", "read_timeout"})
	})
	t.Run("nginx", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := nginxConfig(dir, 8080, env(64<<20)); err != nil {
			t.Fatal(err)
		}
		check(t, "nginx.conf", read(t, dir, "nginx.conf"), []string{
			"  client_max_body_size 0;\n", "  client_body_timeout 600s;\n",
			"      proxy_http_version 1.1;\n", "      proxy_request_buffering off;\n", "      proxy_buffering off;\n",
			"      proxy_send_timeout 600s;\n", "      proxy_read_timeout 600s;\n",
		}, []string{"8m"})
		dir = t.TempDir()
		if _, err := nginxConfig(dir, 8080, env()); err != nil {
			t.Fatal(err)
		}
		check(t, "nginx.conf", read(t, dir, "nginx.conf"), []string{"  client_max_body_size 8m;\n  upstream be {\n", "      proxy_set_header Connection \"\";\n    }\n"},
			[]string{"buffering", "client_body_timeout"})
	})
	t.Run("haproxy", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := haproxyConfig(dir, 8080, env(64<<20)); err != nil {
			t.Fatal(err)
		}
		check(t, "haproxy.cfg", read(t, dir, "haproxy.cfg"), []string{"  timeout server 600s\n"}, []string{"http-buffer-request", "30s\n  timeout http-keep-alive"})
		dir = t.TempDir()
		if _, err := haproxyConfig(dir, 8080, env()); err != nil {
			t.Fatal(err)
		}
		check(t, "haproxy.cfg", read(t, dir, "haproxy.cfg"), []string{"  timeout server 30s\n"}, nil)
	})
	t.Run("gofloor", func(t *testing.T) {
		for _, tc := range []struct {
			e    *targetEnv
			want bool
		}{{env(1 << 20), true}, {env(), false}} {
			args, err := floorConfig("", 8080, tc.e)
			if err != nil {
				t.Fatal(err)
			}
			if got := slices.Contains(args, "-stream-bodies"); got != tc.want {
				t.Errorf("floor args %q: -stream-bodies %v, want %v", args, got, tc.want)
			}
		}
	})
}

func TestBodyReader(t *testing.T) {
	buf := []byte("0123456789")
	r := &bodyReader{buf: buf, left: 25}
	b, err := io.ReadAll(struct{ io.Reader }{r}) // Read, not WriteTo
	if err != nil || string(b) != "0123456789012345678901234" {
		t.Errorf("Read: %q, %v", b, err)
	}
	var sb strings.Builder
	r.left = 13
	if n, err := io.Copy(&sb, r); err != nil || n != 13 || sb.String() != "0123456789012" {
		t.Errorf("WriteTo: %d %q %v", n, sb.String(), err)
	}
}

// TestBodyLoad runs the body client against the streaming replica, then
// through gofloor streaming in this process, then against a server that
// refuses the bodies: every body arrives whole, and refusals are errors.
func TestBodyLoad(t *testing.T) {
	rep, err := startBodyReplica("r0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.close() })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	floor := newFloorProxy([]string{rep.addr()}, 100, true)
	go floor.Serve(ln)
	t.Cleanup(func() { floor.Shutdown() })

	body := []byte(strings.Repeat("x", 64<<10))
	size := int64(1<<20 + 12345) // not a multiple of the buffer
	ctx := context.Background()
	for name, addr := range map[string]string{"direct": rep.addr(), "gofloor": ln.Addr().String()} {
		rep.bodyBytes.Store(0)
		l := runBodyLoad(ctx, addr, size, 3, 300*time.Millisecond, body)
		if l.errors != 0 || l.requests < 3 || l.bytes != l.requests*size || !(l.seconds >= 0.3) {
			t.Errorf("%s: %+v; want no errors, at least one request per connection, %d bytes each, at least 0.3s", name, l, size)
		}
		if got := rep.bodyBytes.Load(); got != l.bytes {
			t.Errorf("%s: the replica read %d bytes, the client had %d answered", name, got, l.bytes)
		}
	}

	// fasthttp answers 413 to a body over MaxRequestBodySize and closes.
	small, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refuse := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {}, MaxRequestBodySize: 1 << 10, Logger: quietLogger{}}
	go refuse.Serve(small)
	t.Cleanup(func() { refuse.Shutdown() })
	l := runBodyLoad(ctx, small.Addr().String(), size, 2, 100*time.Millisecond, body)
	if l.requests != 0 || l.errors == 0 || l.firstErr == "" {
		t.Errorf("refused bodies: %+v; want errors and no request", l)
	}
}

func TestSummariseBodies(t *testing.T) {
	run := func(round int, target string, size proxy.ByteSize, mbps, cpu float64, peak int64) BodyRun {
		r := BodyRun{Round: round, Target: target, Size: size, Seconds: 10, Bytes: int64(mbps * 10e6), Requests: int64(mbps*10e6) / int64(size)}
		r.ReplicaBytes = r.Bytes
		r.MBps = mbps
		if cpu > 0 {
			r.setCPU(cpu, cpu/2)
			r.PeakRSSBytes, r.RSSStartBytes = peak, 10<<20
		}
		return r
	}
	sizes := []proxy.ByteSize{1 << 20, 64 << 20}
	runs := []BodyRun{
		run(1, "keyway", 1<<20, 500, 5, 20<<20),
		run(2, "keyway", 1<<20, 700, 5, 22<<20),
		run(3, "keyway", 1<<20, 600, 6, 21<<20),
		{Round: 1, Target: "keyway", Size: 64 << 20, Failure: "keyway did not start", Errors: 2},
		run(2, "keyway", 64<<20, 800, 8, 30<<20),
		run(1, "haproxy", 64<<20, 1000, 4, 10<<20),
		run(1, "direct", 1<<20, 2000, 0, 0),
	}
	runs[4].ReplicaBytes -= 100 // a cut body
	runs[5].SyscallsPerMiB = map[string]float64{"all": 100, "read": 50, "write": 40, "futex": 0.5, "context-switches": 3}
	sum := summariseBodies(runs, sizes)
	var got []string
	for _, s := range sum {
		got = append(got, s.Target+" "+s.Size.String())
	}
	if want := []string{"direct 1MiB", "keyway 1MiB", "keyway 64MiB", "haproxy 64MiB"}; !slices.Equal(got, want) {
		t.Fatalf("summaries %v, want %v", got, want)
	}
	k := sum[1]
	// 6,000 MB over 10 s per round; 5 CPU-seconds for 5 GB: 1 s/GB.
	if k.Rounds != 3 || k.MBps.Median != 600 || k.MBps.Min != 500 || k.MBps.Max != 700 || k.CPUPerGB.Median != 1 || k.SysPerGB.Median != 0.5 || k.PeakRSSMiB.Median != 21 {
		t.Errorf("keyway 1MiB: %+v, MB/s %+v, s/GB %+v, peak %+v", k, k.MBps, k.CPUPerGB, k.PeakRSSMiB)
	}
	if k.MBpsPerCore.Median != 1000 {
		t.Errorf("keyway 1MiB MB/s per core %+v, want 1000 (6,000 MB ÷ 6 s)", k.MBpsPerCore)
	}
	k64 := sum[2]
	if k64.Rounds != 1 || len(k64.Failures) != 1 || k64.Errors != 2 || k64.ShortBytes != 100 {
		t.Errorf("keyway 64MiB: %+v", k64)
	}
	if d := sum[0]; d.CPUPerGB != nil || d.PeakRSSMiB != nil || d.MBps.Median != 2000 {
		t.Errorf("direct: %+v", d)
	}

	rep := &Report{Config: Config{Bodies: sizes, BodyConns: 4, Duration: 10 * time.Second, Rounds: 3}, BodyRuns: runs}
	rep.summarise()
	md := rep.Markdown()
	for _, want := range []string{
		"### Body throughput: 4 connections",
		"| keyway | 1MiB | 600 (500–700) | 0.50 (0.50–0.60) | 1.00 (0.71–1.00) | 0.50 (0.36–0.50) | 1000 (1000–1400) |",
		"| haproxy | 64MiB | 1000 |",
		"**2 (flagged)** **100 bytes short at the replica** **1 round(s) failed**",
		"- keyway 64MiB round 1: keyway did not start",
		"request bodies of 1MiB, 64MiB",
		"| target | body | all | read | write | context-switches |\n|---|---|---|---|---|---|\n| haproxy | 64MiB | 100.0 | 50.0 | 40.0 | 3.0 |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Fatal(err)
	}
}

// TestBodiesSmoke runs the body mode for a second per size against keyway
// and direct (nothing to install) and checks what does not depend on the
// machine's speed.
func TestBodiesSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyway and runs load for a few seconds; skipped under -short")
	}
	slow.Skip(t)
	skipOffLinux(t)
	repo, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cfg := Config{
		Duration: time.Second, Warmup: 200 * time.Millisecond, Connections: 1, Replicas: 3, Keys: 10, Rounds: 1,
		Targets: []string{"direct", "keyway"}, LoadGen: "auto", Pin: false,
		Bodies: []proxy.ByteSize{256 << 10, 9 << 20}, BodyConns: 2, Rates: []int{1000}, LatencyDuration: time.Second,
		OutDir: out, Repo: repo, Keyway: testKeyway(t), Race: raceEnabled, Log: testLog{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	files, err := writeFiles(rep, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Markdown())
	if len(files) != 2 {
		t.Errorf("files %v: want results.json and results.md only", files)
	}
	if len(rep.BodyRuns) != 4 || len(rep.BodySummary) != 4 || len(rep.Runs) != 0 {
		t.Fatalf("%d runs, %d summaries, %d other runs; want 4, 4, 0", len(rep.BodyRuns), len(rep.BodySummary), len(rep.Runs))
	}
	for _, r := range rep.BodyRuns {
		if r.Failure != "" || r.Errors != 0 || r.Requests < 2 || r.Bytes != r.Requests*int64(r.Size) || r.ReplicaBytes != r.Bytes || !(r.MBps > 0) {
			t.Errorf("%s %s: %+v", r.Target, r.Size, r)
		}
		proxied := r.Target == "keyway"
		if got := r.CPUPerGB > 0 && r.MBpsPerCore > 0 && r.PeakRSSBytes > 0; got != proxied {
			t.Errorf("%s %s: proxy figures %v, want %v: %+v", r.Target, r.Size, got, proxied, r)
		}
	}
	if !strings.Contains(rep.Markdown(), "| keyway | 9MiB |") {
		t.Errorf("no keyway 9MiB row")
	}
}

// quietLogger drops a fasthttp server's log lines.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}
