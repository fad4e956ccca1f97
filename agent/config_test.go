package agent

import (
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Replica.Set = "orders"
	c.Replica.Name = "orders-0"
	c.Replica.Addr = "127.0.0.1:9001"
	c.Gossip.Join = []string{"127.0.0.1:7946"}
	return c
}

func TestConfigValidate(t *testing.T) {
	cases := map[string]struct {
		modify func(*Config)
		want   []string // error lines, in order; none means valid
	}{
		"valid":                  {modify: func(*Config) {}},
		"default is incomplete":  {modify: func(c *Config) { *c = DefaultConfig() }, want: []string{"replica.set: required", "replica.addr: required", "gossip.join: required"}},
		"empty name is the host": {modify: func(c *Config) { c.Replica.Name = "" }},
		"bad set":                {modify: func(c *Config) { c.Replica.Set = "Orders!" }, want: []string{`replica.set: "Orders!" is not a valid set name`}},
		"bad name":               {modify: func(c *Config) { c.Replica.Name = "orders 0" }, want: []string{`replica.name: "orders 0" is not a valid replica name`}},
		"addr without port":      {modify: func(c *Config) { c.Replica.Addr = "10.0.0.5" }, want: []string{`replica.addr: "10.0.0.5" is not host:port`}},
		"addr all interfaces":    {modify: func(c *Config) { c.Replica.Addr = "0.0.0.0:9001" }, want: []string{"replica.addr: \"0.0.0.0:9001\" is an all-interfaces address"}},
		"addr no host":           {modify: func(c *Config) { c.Replica.Addr = ":9001" }, want: []string{`replica.addr: ":9001" has no host`}},
		"addr port 0":            {modify: func(c *Config) { c.Replica.Addr = "10.0.0.5:0" }, want: []string{"replica.addr: \"10.0.0.5:0\" has an invalid port"}},
		"weight":                 {modify: func(c *Config) { c.Replica.Weight = 0 }, want: []string{"replica.weight: must be between 1 and 1000, got 0"}},
		"zone":                   {modify: func(c *Config) { c.Replica.Zone = "eu west" }, want: []string{`replica.zone: "eu west" is not a valid zone`}},
		"probe path":             {modify: func(c *Config) { c.Probe.Path = "readyz" }, want: []string{`probe.path: must start with '/'`}},
		"probe timings": {modify: func(c *Config) {
			c.Probe.Interval, c.Probe.Timeout, c.Probe.Rise, c.Probe.Fall = time.Millisecond, 0, 0, 101
		}, want: []string{"probe.interval: must be at least 10ms, got 1ms", "probe.timeout: must be at least 10ms, got 0s", "probe.rise: must be between 1 and 100, got 0", "probe.fall: must be between 1 and 100, got 101"}},
		"expect_status range":        {modify: func(c *Config) { c.Probe.ExpectStatus = "399-200" }, want: []string{`probe.expect_status: "399-200" is an empty range`}},
		"expect_status junk":         {modify: func(c *Config) { c.Probe.ExpectStatus = "2xx" }, want: []string{`probe.expect_status: "2xx" is not a status code`}},
		"expect_status range bounds": {modify: func(c *Config) { c.Probe.ExpectStatus = "200,600" }, want: []string{`probe.expect_status: "600" is outside 100-599`}},
		"expect_status empty":        {modify: func(c *Config) { c.Probe.ExpectStatus = " " }, want: []string{"probe.expect_status: empty"}},
		"drain negative": {modify: func(c *Config) { c.Drain.Timeout, c.Drain.Quiet = -time.Second, -time.Second },
			want: []string{"drain.timeout: must not be negative", "drain.quiet: must not be negative"}},
		"drain zero is allowed": {modify: func(c *Config) { c.Drain.Timeout = 0 }},
		"supervise": {modify: func(c *Config) {
			c.Supervise.StopGrace, c.Supervise.BackoffMin, c.Supervise.MaxRestarts, c.Supervise.Window = -time.Second, 5*time.Millisecond, 1001, 999*time.Millisecond
		}, want: []string{"supervise.stop_grace: must not be negative, got -1s", "supervise.backoff_min: must be at least 10ms, got 5ms",
			"supervise.max_restarts: must be between 1 and 1000, got 1001", "supervise.window: must be at least 1s, got 999ms"}},
		"supervise backoff_max below min": {modify: func(c *Config) { c.Supervise.BackoffMax = 500 * time.Millisecond },
			want: []string{"supervise.backoff_max: must be at least supervise.backoff_min (1s), got 500ms"}},
		"supervise zero grace is allowed": {modify: func(c *Config) { c.Supervise.StopGrace = 0 }},
		"command":                         {modify: func(c *Config) { c.Command = []string{"/usr/bin/orders", "--port", "9001"} }},
		"command empty program":           {modify: func(c *Config) { c.Command = []string{"", "x"} }, want: []string{"command: the program after -- is empty"}},
		"listen":                          {modify: func(c *Config) { c.Listen = "9902" }, want: []string{`listen: "9902" is not host:port`}},
		"listen off":                      {modify: func(c *Config) { c.Listen = "" }},
		"log":                             {modify: func(c *Config) { c.Log.Level = "loud"; c.Log.AccessLog = true }, want: []string{"log.level: must be one of", "log.access_log: the agent forwards no requests"}},
		"access log keys": {modify: func(c *Config) {
			c.Log.Access.Path = "/tmp/a.log"
			c.Log.Access.Key = "plain"
			c.Log.Access.KeySecretFile = "/s"
		},
			want: []string{"log.access.path: the agent forwards no requests", "log.access.key: the agent", "log.access.key_secret_file: the agent"}},
		"gossip": {modify: func(c *Config) { c.Gossip.BindAddr = "here"; c.Gossip.Join = []string{"a/b"} }, want: []string{`gossip.bind_addr: "here" is not an IP address`, `gossip.join[0]: "a/b" is not host or host:port`}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := validConfig()
			tc.modify(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate succeeded, want %q", tc.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("Validate:\n%s\nwant %d errors starting %q", err, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("error %d: %q, want prefix %q", i, lines[i], w)
				}
			}
		})
	}
}

func TestStatusRanges(t *testing.T) {
	r, err := parseStatusRanges("200-299, 304 ,418")
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{199: false, 200: true, 250: true, 299: true, 300: false, 304: true, 418: true, 503: false} {
		if r.Match(code) != want {
			t.Errorf("match(%d) = %v, want %v", code, !want, want)
		}
	}
}
