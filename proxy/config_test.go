package proxy

import (
	"keyway/balancer"

	"strings"
	"testing"
)

// The set-name, replica-name and replica-count rules come from package
// balancer; the messages are the proxy's own.
func TestSetConfigNameAndCountRules(t *testing.T) {
	cases := map[string]struct {
		modify func(*SetConfig)
		want   string // "" for valid
	}{
		"valid":              {modify: func(*SetConfig) {}},
		"upper-case set":     {modify: func(s *SetConfig) { s.Name = "Orders" }, want: `name: "Orders" is not a valid set name: use 1 to 63 lower-case letters, digits, '-' or '_', e.g. orders`},
		"empty set":          {modify: func(s *SetConfig) { s.Name = "" }, want: `name: "" is not a valid set name`},
		"64-byte set":        {modify: func(s *SetConfig) { s.Name = strings.Repeat("a", 64) }, want: "is not a valid set name"},
		"0 replicas":         {modify: func(s *SetConfig) { s.Replicas = 0 }, want: "replicas: must be between 1 and 1000, got 0"},
		"1001 replicas":      {modify: func(s *SetConfig) { s.Replicas = 1001 }, want: "replicas: must be between 1 and 1000, got 1001"},
		"1000 replicas":      {modify: func(s *SetConfig) { s.Replicas = 1000 }},
		"static with space":  {modify: func(s *SetConfig) { s.Static[0].Name = "orders 0" }, want: `static[0].name: "orders 0" is not a valid replica name: use 1 to 128 bytes without spaces, e.g. orders-0`},
		"static too long":    {modify: func(s *SetConfig) { s.Static[0].Name = strings.Repeat("r", 129) }, want: "static[0].name:"},
		"static 128 bytes":   {modify: func(s *SetConfig) { s.Static[0].Name = strings.Repeat("r", 128) }},
		"static upper, dots": {modify: func(s *SetConfig) { s.Static[0].Name = "Orders.0" }},
		"key header User-Agent": {modify: func(s *SetConfig) { s.Key = []balancer.KeySource{{Header: "user-agent"}} },
			want: `key[0].header: "user-agent" is a header HTTP or fasthttp gives a meaning of its own, and two of them in one request cannot be told apart; choose a header of your own, e.g. X-Key`},
		"key header Content-Type": {modify: func(s *SetConfig) { s.Key = []balancer.KeySource{{Header: "X-Key"}, {Header: "Content-Type"}} }, want: `key[1].header: "Content-Type" is a header`},
		"key header hop-by-hop":   {modify: func(s *SetConfig) { s.Key = []balancer.KeySource{{Header: "Keep-Alive"}} }, want: `key[0].header: "Keep-Alive" is a hop-by-hop header`},
		"key header own":          {modify: func(s *SetConfig) { s.Key = []balancer.KeySource{{Header: "X-Tenant"}, {Query: "key"}} }},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			sc := DefaultSetConfig()
			sc.Name = "orders"
			sc.Static = []StaticReplica{{Name: "orders-0", Addr: "127.0.0.1:9001", Weight: 1}}
			c.modify(&sc)
			err := sc.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Validate: %v, want an error containing %q", err, c.want)
			}
		})
	}
}
