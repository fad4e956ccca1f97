package balancer

import (
	"strings"
	"testing"
)

func TestHashConfigValidate(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		modify func(*HashConfig)
		errs   []string // YAML field names expected in the error, none for valid
	}{
		"default":             {func(*HashConfig) {}, nil},
		"smallest":            {func(c *HashConfig) { *c = HashConfig{Partitions: 1, ReplicationFactor: 1, Load: 1.01} }, nil},
		"largest":             {func(c *HashConfig) { *c = HashConfig{Partitions: 65521, ReplicationFactor: 1000, Load: 10} }, nil},
		"zero":                {func(c *HashConfig) { *c = HashConfig{} }, []string{"partitions:", "replication_factor:", "load:"}},
		"partitions too many": {func(c *HashConfig) { c.Partitions = 65522 }, []string{"partitions:"}},
		"negative partitions": {func(c *HashConfig) { c.Partitions = -1 }, []string{"partitions:"}},
		"vnodes too many":     {func(c *HashConfig) { c.ReplicationFactor = 1001 }, []string{"replication_factor:"}},
		"load 1":              {func(c *HashConfig) { c.Load = 1 }, []string{"load:"}},
		"load too big":        {func(c *HashConfig) { c.Load = 10.5 }, []string{"load:"}},
		"load NaN":            {func(c *HashConfig) { c.Load = nan() }, []string{"load:"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := DefaultHashConfig()
			tc.modify(&c)
			err := c.Validate()
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.errs) {
				t.Fatalf("errors %q, want %d", lines, len(tc.errs))
			}
			for i, want := range tc.errs {
				if !strings.HasPrefix(lines[i], want) {
					t.Errorf("error %q, want prefix %q", lines[i], want)
				}
			}
		})
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	d := DefaultHashConfig()
	if got := d.Fingerprint(); got != "v1-xxh64-cons1.1-p7919-r100-l1.25" {
		t.Fatalf("default fingerprint %q", got)
	}
	seen := map[string]bool{d.Fingerprint(): true}
	for _, c := range []HashConfig{
		{Partitions: 7907, ReplicationFactor: 100, Load: 1.25},
		{Partitions: 7919, ReplicationFactor: 101, Load: 1.25},
		{Partitions: 7919, ReplicationFactor: 100, Load: 1.3},
	} {
		if seen[c.Fingerprint()] {
			t.Fatalf("%+v shares a fingerprint", c)
		}
		seen[c.Fingerprint()] = true
	}
}

func TestFailoverFallbackText(t *testing.T) {
	t.Parallel()
	for _, f := range []Failover{FailoverNext, FailoverStrict} {
		b, _ := f.MarshalText()
		var g Failover
		if err := g.UnmarshalText(b); err != nil || g != f {
			t.Fatalf("failover %v round trip: %v %v", f, g, err)
		}
	}
	var f Failover
	if err := f.UnmarshalText([]byte("nearest")); err == nil {
		t.Fatal("bad failover accepted")
	}
	for fb := FallbackRoundRobin; fb <= FallbackReject; fb++ {
		b, _ := fb.MarshalText()
		var g Fallback
		if err := g.UnmarshalText(b); err != nil || g != fb {
			t.Fatalf("fallback %v round trip: %v %v", fb, g, err)
		}
	}
	var fb Fallback
	if err := fb.UnmarshalText([]byte("roundrobin")); err == nil || !strings.Contains(err.Error(), "round_robin") {
		t.Fatalf("bad fallback: %v", err)
	}
	if Fallback(9).String() != "fallback(9)" {
		t.Fatal(Fallback(9).String())
	}
}

func TestKeySource(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		src KeySource
		str string
		err string // substring; "" for valid
	}{
		"header":          {KeySource{Header: "X-Key"}, "header X-Key", ""},
		"path":            {KeySource{PathSegment: 2}, "path segment 2", ""},
		"query":           {KeySource{Query: "key"}, "query key", ""},
		"path 64":         {KeySource{PathSegment: 64}, "path segment 64", ""},
		"empty":           {KeySource{}, "empty key source", "set exactly one"},
		"two":             {KeySource{Header: "X-Key", Query: "key"}, "header X-Key", "set exactly one"},
		"bad header":      {KeySource{Header: "X Key"}, "header X Key", "header:"},
		"header colon":    {KeySource{Header: "X-Key:"}, "header X-Key:", "header:"},
		"path 0 is unset": {KeySource{PathSegment: 0, Query: "k"}, "query k", ""},
		"path negative":   {KeySource{PathSegment: -1}, "empty key source", "path_segment:"},
		"path 65":         {KeySource{PathSegment: 65}, "path segment 65", "path_segment:"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.src.String(); got != tc.str {
				t.Errorf("String() = %q, want %q", got, tc.str)
			}
			err := tc.src.Validate()
			if tc.err == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}
