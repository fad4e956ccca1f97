package eventlog

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigValidates(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	c := DefaultConfig()
	if c.Dir != "" || c.MaxFileBytes != 16<<20 || c.Retain != 10 || c.Buffer != 4096 || c.Memory != 1000 {
		t.Errorf("DefaultConfig() = %+v, want dir \"\", 16 MiB, retain 10, buffer 4096, memory 1000", c)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		modify func(*Config)
		want   []string // error prefixes, one per problem; nil = valid
	}{
		"files on":        {modify: func(c *Config) { c.Dir = "/var/log/keyway" }},
		"smallest file":   {modify: func(c *Config) { c.MaxFileBytes = 4096 }},
		"no memory":       {modify: func(c *Config) { c.Memory = 0 }},
		"largest buffer":  {modify: func(c *Config) { c.Buffer = 1 << 20 }},
		"file too small":  {modify: func(c *Config) { c.MaxFileBytes = 4095 }, want: []string{"max_file_bytes: must be at least 4096, got 4095"}},
		"retain zero":     {modify: func(c *Config) { c.Retain = 0 }, want: []string{"retain: must be at least 1, got 0"}},
		"buffer zero":     {modify: func(c *Config) { c.Buffer = 0 }, want: []string{"buffer: "}},
		"buffer too big":  {modify: func(c *Config) { c.Buffer = 1<<20 + 1 }, want: []string{"buffer: "}},
		"memory negative": {modify: func(c *Config) { c.Memory = -1 }, want: []string{"memory: "}},
		"every problem at once": {modify: func(c *Config) { *c = Config{Memory: -1, Sink: "audit/keyway"} },
			want: []string{"max_file_bytes: ", "retain: ", "buffer: ", "memory: ", "sink: ", "segment_bytes: ", "segment_age: "}},
		"a sink":                {modify: func(c *Config) { c.Sink = "s3://audit/keyway" }},
		"a sink, no prefix":     {modify: func(c *Config) { c.Sink = "s3://audit" }},
		"not a sink":            {modify: func(c *Config) { c.Sink = "https://audit/keyway" }, want: []string{`sink: "https://audit/keyway" is not an object-storage address`}},
		"tiny segments":         {modify: func(c *Config) { c.SegmentBytes = 100 }, want: []string{"segment_bytes: "}},
		"quick segments":        {modify: func(c *Config) { c.SegmentAge = time.Millisecond }, want: []string{"segment_age: "}},
		"spool under a segment": {modify: func(c *Config) { c.SpoolBytes = 1000 }, want: []string{"spool_bytes: must hold a segment"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			tc.modify(&c)
			err := c.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %q", tc.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("Validate() = %q, want %d errors", err, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("error %d = %q, want prefix %q", i, lines[i], w)
				}
			}
		})
	}
}
