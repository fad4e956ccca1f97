package health

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigValidates(t *testing.T) {
	t.Parallel()
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if DefaultConfig().FailOpen() {
		t.Fatal("default is fail open")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		modify func(*Config)
		want   []string // error prefixes, in order; none: valid
	}{
		"active off still validated": {func(c *Config) { c.Active.Path = "healthz" }, []string{"active.path: "}},
		"interval floor":             {func(c *Config) { c.Active.Interval = 99 * time.Millisecond; c.Active.Timeout = 10 * time.Millisecond }, []string{"active.interval: "}},
		"interval at floor":          {func(c *Config) { c.Active.Interval = 100 * time.Millisecond; c.Active.Timeout = 10 * time.Millisecond }, nil},
		"timeout floor":              {func(c *Config) { c.Active.Timeout = 9 * time.Millisecond }, []string{"active.timeout: "}},
		"timeout equal to interval":  {func(c *Config) { c.Active.Timeout = c.Active.Interval }, []string{"active.timeout: "}},
		"rise 0":                     {func(c *Config) { c.Active.Rise = 0 }, []string{"active.rise: "}},
		"fall 101":                   {func(c *Config) { c.Active.Fall = 101 }, []string{"active.fall: "}},
		"expect_status empty":        {func(c *Config) { c.Active.ExpectStatus = "" }, []string{"active.expect_status: "}},
		"expect_status bad":          {func(c *Config) { c.Active.ExpectStatus = "200-x" }, []string{"active.expect_status: "}},
		"concurrency 0":              {func(c *Config) { c.Active.Concurrency = 0 }, []string{"active.concurrency: "}},
		"consecutive 0":              {func(c *Config) { c.Passive.ConsecutiveFailures = 0 }, []string{"passive.consecutive_failures: "}},
		"count unknown":              {func(c *Config) { c.Passive.Count = []string{"5xx", "4xx"} }, []string{"passive.count: "}},
		"count twice":                {func(c *Config) { c.Passive.Count = []string{"5xx", "5xx"} }, []string{"passive.count: "}},
		"count empty":                {func(c *Config) { c.Passive.Count = nil }, []string{"passive.count: "}},
		"count empty, passive off":   {func(c *Config) { c.Passive.Count = nil; c.Passive.Enabled = false }, nil},
		"base_ejection floor":        {func(c *Config) { c.Passive.BaseEjection = 99 * time.Millisecond }, []string{"passive.base_ejection: "}},
		"max below base":             {func(c *Config) { c.Passive.MaxEjection = 9 * time.Second }, []string{"passive.max_ejection: "}},
		"share 0":                    {func(c *Config) { c.Passive.MaxEjectedShare = 0 }, []string{"passive.max_ejected_share: "}},
		"share 1.1":                  {func(c *Config) { c.Passive.MaxEjectedShare = 1.1 }, []string{"passive.max_ejected_share: "}},
		"share NaN":                  {func(c *Config) { c.Passive.MaxEjectedShare = math.NaN() }, []string{"passive.max_ejected_share: "}},
		"share 1":                    {func(c *Config) { c.Passive.MaxEjectedShare = 1 }, nil},
		"sweep interval floor":       {func(c *Config) { c.Passive.Interval = time.Millisecond }, []string{"passive.interval: "}},
		"sweep interval above base":  {func(c *Config) { c.Passive.Interval = 11 * time.Second }, []string{"passive.interval: "}},
		"supervision off":            {func(c *Config) { c.Supervision = SupervisionConfig{} }, nil},
		"supervision negative":       {func(c *Config) { c.Supervision.MaxEjections = -1 }, []string{"supervision.max_ejections: "}},
		"supervision without window": {func(c *Config) { c.Supervision.Window = 0; c.Supervision.Cooldown = 0 }, []string{"supervision.window: ", "supervision.cooldown: "}},
		"all_down empty is closed":   {func(c *Config) { c.AllDown = "" }, nil},
		"all_down fail_open":         {func(c *Config) { c.AllDown = AllDownFailOpen }, nil},
		"all_down typo":              {func(c *Config) { c.AllDown = "open" }, []string{"all_down: "}},
		"zero config: every problem": {func(c *Config) { *c = Config{} }, []string{"active.path: ", "active.interval: ", "active.timeout: ", "active.rise: ", "active.fall: ", "active.expect_status: ", "active.concurrency: ", "passive.consecutive_failures: ", "passive.base_ejection: ", "passive.max_ejected_share: ", "passive.interval: "}},
		"several sections at once":   {func(c *Config) { c.Active.Rise = 0; c.Passive.MaxEjectedShare = 2 }, []string{"active.rise: ", "passive.max_ejected_share: "}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			tc.modify(&cfg)
			err := cfg.Validate()
			var got []string
			if err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					got = append(got, e.Error())
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("errors %q, want prefixes %q", got, tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Fatalf("error %d %q, want prefix %q", i, got[i], w)
				}
			}
		})
	}
}

func TestParseStatusRanges(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		in      string
		match   []int
		nomatch []int
		err     string
	}{
		"default":          {in: "200-399", match: []int{200, 204, 301, 399}, nomatch: []int{199, 400, 500}},
		"codes":            {in: "200,204", match: []int{200, 204}, nomatch: []int{201, 203, 205}},
		"mixed, spaces":    {in: " 200 - 299 , 304 ", match: []int{200, 250, 299, 304}, nomatch: []int{300, 305}},
		"single":           {in: "418", match: []int{418}, nomatch: []int{200}},
		"empty":            {in: " ", err: "empty"},
		"not a number":     {in: "2xx", err: "not a status code"},
		"half range":       {in: "200-", err: "not a status code"},
		"outside":          {in: "99-200", err: "outside 100-599"},
		"above":            {in: "600", err: "outside 100-599"},
		"reversed":         {in: "399-200", err: "empty range"},
		"one bad of many":  {in: "200,abc", err: "\"abc\""},
		"trailing comma":   {in: "200,", err: "not a status code"},
		"negative looking": {in: "-200", err: "not a status code"},
	}
	for name, tc := range cases {
		r, err := ParseStatusRanges(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %q: error %v, want %q", name, tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, c := range tc.match {
			if !r.Match(c) {
				t.Errorf("%s: %d does not match %q", name, c, tc.in)
			}
		}
		for _, c := range tc.nomatch {
			if r.Match(c) {
				t.Errorf("%s: %d matches %q", name, c, tc.in)
			}
		}
	}
}

func TestParseCount(t *testing.T) {
	t.Parallel()
	m, err := parseCount([]string{"connect", "5xx"})
	if err != nil || m != 1<<kindConnect|1<<kind5xx {
		t.Fatalf("mask %b, %v", m, err)
	}
	if _, err := parseCount([]string{"Connect"}); err == nil {
		t.Fatal("names are case-sensitive, as in YAML")
	}
	var names []string
	for k := kindConnect; k < numKinds; k++ {
		names = append(names, k.String())
	}
	if !slices.Equal(names, DefaultConfig().Passive.Count) {
		t.Fatalf("kinds %v, default count %v", names, DefaultConfig().Passive.Count)
	}
}
