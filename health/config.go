package health

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Config configures a [Checker]: the active prober, the passive outlier
// detector, the supervision of repeat offenders, and the all-down policy
// the proxy applies. It is a plain value: copy it freely. Start from
// [DefaultConfig]; the zero Config does not validate.
type Config struct {
	// Active configures HTTP probes of every ring member.
	Active ActiveConfig `yaml:"active"`
	// Passive configures ejection on failed requests.
	Passive PassiveConfig `yaml:"passive"`
	// Supervision holds out replicas that are ejected again and again.
	Supervision SupervisionConfig `yaml:"supervision"`
	// AllDown says what the proxy does when no replica of a set is in
	// rotation: "fail_closed" (503 + Retry-After; the default, and what ""
	// means) or "fail_open" (route by hash anyway, ignoring health and
	// lifecycle). The Checker does not use it; the proxy applies it. It
	// lives here so that health is configured in one place.
	AllDown string `yaml:"all_down"`
}

// The values of [Config.AllDown].
const (
	AllDownFailClosed = "fail_closed"
	AllDownFailOpen   = "fail_open"
)

// FailOpen reports whether AllDown is "fail_open".
func (c Config) FailOpen() bool { return c.AllDown == AllDownFailOpen }

// ActiveConfig configures the active prober: GET http://ADDR/PATH of every
// ring member, with rise/fall hysteresis. A member failing its probes is
// held out of rotation with [balancer.ReasonProbe].
type ActiveConfig struct {
	// Enabled turns active probing on. Default false: agents already probe
	// their replica's readiness and gossip it; turn it on for static
	// replicas, which have no agent.
	Enabled bool `yaml:"enabled"`
	// Path is the probed path, with an optional query. Default "/healthz";
	// must start with "/".
	Path string `yaml:"path"`
	// Interval is the time between the starts of two probes of one
	// replica. Default 5s; at least 100ms. The first probe of a new replica
	// starts after a random delay within one interval.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe (connect, answer and up to 64 KiB of body);
	// a probe that takes longer fails. Default 1s; at least 10ms and less
	// than Interval.
	Timeout time.Duration `yaml:"timeout"`
	// Rise is the number of consecutive passes that bring a replica whose
	// probes failed back into rotation. Default 2; 1 to 100.
	Rise int `yaml:"rise"`
	// Fall is the number of consecutive failures that take a replica out.
	// Default 3; 1 to 100. A new replica starts as passing.
	Fall int `yaml:"fall"`
	// ExpectStatus lists the status codes that pass, as codes and
	// inclusive ranges separated by commas: "200-399" (default), "200,204".
	ExpectStatus string `yaml:"expect_status"`
	// Concurrency is the most probes in flight at once, across all
	// replicas of all sets. Default 16; 1 to 1024. Probes that are due while
	// all slots are taken start as soon as one frees.
	Concurrency int `yaml:"concurrency"`
}

// PassiveConfig configures the passive outlier detector, fed by the
// proxy's request outcomes ([Checker.Observe]). A replica with
// ConsecutiveFailures counted failures in a row is ejected — held out with
// [balancer.ReasonEjected] — for BaseEjection, doubled on each repeat up to
// MaxEjection.
type PassiveConfig struct {
	// Enabled turns passive ejection on. Default true.
	Enabled bool `yaml:"enabled"`
	// ConsecutiveFailures is the number of counted failures in a row that
	// eject a replica; any success (an answer below 500) resets the count.
	// The ejection is made on the failure that reaches it, before that
	// request's answer is relayed: that request is the last one routed to
	// the replica. Default 5; 1 to 10000.
	ConsecutiveFailures int `yaml:"consecutive_failures"`
	// Count lists the outcomes that count as failures, any of "connect"
	// (the connection could not be made), "timeout" (no answer in time),
	// "reset" (the connection failed after the request was sent) and "5xx"
	// (the replica answered 500-599). Default all four; empty is an error
	// while Enabled. Outcomes not listed neither count nor reset the count.
	Count []string `yaml:"count"`
	// BaseEjection is how long the first ejection lasts. Default 10s; at
	// least 100ms.
	BaseEjection time.Duration `yaml:"base_ejection"`
	// MaxEjection caps an ejection. Each ejection lasts twice the previous
	// one, up to MaxEjection, until the replica answers a request
	// successfully after its readmission, which resets it to BaseEjection.
	// Default 5m; at least BaseEjection.
	MaxEjection time.Duration `yaml:"max_ejection"`
	// MaxEjectedShare is the largest share of a set's replicas that passive
	// checks (ejections and supervision holds together) may hold out at
	// once, in (0, 1]. Default 0.5. With 2 or more replicas at least one
	// may always be ejected; a set of one is never ejected unless the share
	// is 1. A replica that should be ejected but would exceed the share
	// stays in rotation, and that is counted.
	MaxEjectedShare float64 `yaml:"max_ejected_share"`
	// Interval is how often the sweeper runs: a replica is readmitted at
	// most Interval after its ejection ends, and one that the share cap
	// kept in is ejected at most Interval after there is room. (Ejection on
	// ConsecutiveFailures does not wait for it.) Default 500ms; at least
	// 10ms and at most BaseEjection.
	Interval time.Duration `yaml:"interval"`
}

// SupervisionConfig holds out replicas that keep failing: a replica ejected
// MaxEjections times within Window is held out as failed
// ([balancer.ReasonFailed]) by this proxy until Cooldown passes or an
// operator resets it ([Checker.Reset]; the admin API's undrain), instead of
// flapping in and out forever. The ejection that reaches MaxEjections
// starts the hold instead of an ordinary ejection.
type SupervisionConfig struct {
	// MaxEjections is the number of ejections within Window that start a
	// hold. Default 5; 0 turns supervision off; at most 1000.
	MaxEjections int `yaml:"max_ejections"`
	// Window is the sliding window ejections are counted in. Default 10m;
	// must be positive when MaxEjections is set.
	Window time.Duration `yaml:"window"`
	// Cooldown is how long a hold lasts unless reset first. Default 30m;
	// must be positive when MaxEjections is set.
	Cooldown time.Duration `yaml:"cooldown"`
}

// DefaultConfig returns the configuration used for every key a file leaves
// out. It validates.
func DefaultConfig() Config {
	return Config{
		Active: ActiveConfig{
			Path:         "/healthz",
			Interval:     5 * time.Second,
			Timeout:      time.Second,
			Rise:         2,
			Fall:         3,
			ExpectStatus: "200-399",
			Concurrency:  16,
		},
		Passive: PassiveConfig{
			Enabled:             true,
			ConsecutiveFailures: 5,
			Count:               []string{"connect", "timeout", "reset", "5xx"},
			BaseEjection:        10 * time.Second,
			MaxEjection:         5 * time.Minute,
			MaxEjectedShare:     0.5,
			Interval:            500 * time.Millisecond,
		},
		Supervision: SupervisionConfig{
			MaxEjections: 5,
			Window:       10 * time.Minute,
			Cooldown:     30 * time.Minute,
		},
		AllDown: AllDownFailClosed,
	}
}

// Validate reports every problem, joined with errors.Join. Each error's
// text starts with the YAML path of its key below the health section
// ("active.timeout: ...", "passive.base_ejection: ...") followed by ": ".
func (c Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf(path+": "+format, args...))
	}

	a := c.Active
	if !strings.HasPrefix(a.Path, "/") {
		bad("active.path", "must start with \"/\", got %q", a.Path)
	}
	if a.Interval < 100*time.Millisecond {
		bad("active.interval", "must be at least 100ms, got %s", a.Interval)
	}
	switch {
	case a.Timeout < 10*time.Millisecond:
		bad("active.timeout", "must be at least 10ms, got %s", a.Timeout)
	case a.Timeout >= a.Interval:
		bad("active.timeout", "must be less than active.interval (%s), got %s", a.Interval, a.Timeout)
	}
	if a.Rise < 1 || a.Rise > 100 {
		bad("active.rise", "must be between 1 and 100, got %d", a.Rise)
	}
	if a.Fall < 1 || a.Fall > 100 {
		bad("active.fall", "must be between 1 and 100, got %d", a.Fall)
	}
	if _, err := ParseStatusRanges(a.ExpectStatus); err != nil {
		bad("active.expect_status", "%v", err)
	}
	if a.Concurrency < 1 || a.Concurrency > 1024 {
		bad("active.concurrency", "must be between 1 and 1024, got %d", a.Concurrency)
	}

	p := c.Passive
	if p.ConsecutiveFailures < 1 || p.ConsecutiveFailures > 10000 {
		bad("passive.consecutive_failures", "must be between 1 and 10000, got %d", p.ConsecutiveFailures)
	}
	if _, err := parseCount(p.Count); err != nil {
		bad("passive.count", "%v", err)
	} else if len(p.Count) == 0 && p.Enabled {
		bad("passive.count", "must list at least one of connect, timeout, reset, 5xx while passive.enabled is true")
	}
	if p.BaseEjection < 100*time.Millisecond {
		bad("passive.base_ejection", "must be at least 100ms, got %s", p.BaseEjection)
	}
	if p.MaxEjection < p.BaseEjection {
		bad("passive.max_ejection", "must be at least passive.base_ejection (%s), got %s", p.BaseEjection, p.MaxEjection)
	}
	// The negated form also rejects NaN.
	if !(p.MaxEjectedShare > 0 && p.MaxEjectedShare <= 1) {
		bad("passive.max_ejected_share", "must be greater than 0 and at most 1, got %v", p.MaxEjectedShare)
	}
	switch {
	case p.Interval < 10*time.Millisecond:
		bad("passive.interval", "must be at least 10ms, got %s", p.Interval)
	case p.BaseEjection >= 100*time.Millisecond && p.Interval > p.BaseEjection:
		bad("passive.interval", "must be at most passive.base_ejection (%s), got %s", p.BaseEjection, p.Interval)
	}

	s := c.Supervision
	if s.MaxEjections < 0 || s.MaxEjections > 1000 {
		bad("supervision.max_ejections", "must be between 0 (off) and 1000, got %d", s.MaxEjections)
	}
	if s.MaxEjections > 0 {
		if s.Window <= 0 {
			bad("supervision.window", "must be positive while supervision.max_ejections is set, got %s", s.Window)
		}
		if s.Cooldown <= 0 {
			bad("supervision.cooldown", "must be positive while supervision.max_ejections is set, got %s", s.Cooldown)
		}
	}

	switch c.AllDown {
	case "", AllDownFailClosed, AllDownFailOpen:
	default:
		bad("all_down", "must be fail_closed or fail_open, got %q", c.AllDown)
	}
	return errors.Join(errs...)
}

// StatusRanges is a parsed expect_status: inclusive [lo, hi] pairs. The
// agent's readiness probe uses the same syntax.
type StatusRanges [][2]int

// Match reports whether code lies in one of the ranges.
func (s StatusRanges) Match(code int) bool {
	for _, r := range s {
		if code >= r[0] && code <= r[1] {
			return true
		}
	}
	return false
}

// ParseStatusRanges parses "200-399", "200,204", "200-299, 304".
func ParseStatusRanges(s string) (StatusRanges, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty: list status codes or ranges, e.g. \"200-399\" or \"200,204\"")
	}
	var out StatusRanges
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, errA := strconv.Atoi(strings.TrimSpace(lo))
		b := a
		var errB error
		if isRange {
			b, errB = strconv.Atoi(strings.TrimSpace(hi))
		}
		switch {
		case errA != nil || errB != nil:
			return nil, fmt.Errorf("%q is not a status code or a range such as 200-399", part)
		case a < 100 || b > 599:
			return nil, fmt.Errorf("%q is outside 100-599", part)
		case a > b:
			return nil, fmt.Errorf("%q is an empty range: write the lower code first", part)
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

// parseCount turns passive.count into a bit mask over failure kinds.
func parseCount(names []string) (uint8, error) {
	var mask uint8
	for _, n := range names {
		k, ok := parseKind(n)
		if !ok {
			return 0, fmt.Errorf("unknown outcome %q (want any of connect, timeout, reset, 5xx)", n)
		}
		if mask&(1<<k) != 0 {
			return 0, fmt.Errorf("%q is listed twice", n)
		}
		mask |= 1 << k
	}
	return mask, nil
}
