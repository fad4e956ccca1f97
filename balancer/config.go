package balancer

import (
	"errors"
	"fmt"
	"strings"
)

// HashConfig fixes the shape of a replica set's ring. Every proxy of a
// fleet must use the same values: they form the ring fingerprint that
// proxies compare (see [HashConfig.Fingerprint]). A plain value: copy it
// freely. The zero value is invalid; start from [DefaultHashConfig].
type HashConfig struct {
	// Partitions is the fixed number of partitions keys are hashed into.
	// Keep it much larger than the replica count; a prime spreads best.
	// Default 7919. Allowed 1..65521.
	Partitions int `yaml:"partitions" json:"partitions"`
	// ReplicationFactor is the number of virtual nodes per replica on the
	// ring. Default 100. Allowed 1..1000.
	ReplicationFactor int `yaml:"replication_factor" json:"replication_factor"`
	// Load is the bounded-load factor: no replica owns more than
	// ceil(Load × partitions / replicas) partitions. Default 1.25.
	// Allowed 1.01..10.
	Load float64 `yaml:"load" json:"load"`
}

// DefaultHashConfig returns the recommended ring shape: 7919 partitions,
// 100 virtual nodes per replica and a load bound of 1.25 (about 9–10% of
// keys move when one of 10 replicas joins or leaves; max/mean ≈ 1.16).
func DefaultHashConfig() HashConfig {
	return HashConfig{Partitions: 7919, ReplicationFactor: 100, Load: 1.25}
}

// Validate reports every problem with the configuration. Each error starts
// with the field's YAML name, followed by ": ".
func (c HashConfig) Validate() error {
	var errs []error
	if c.Partitions < 1 || c.Partitions > maxPartitions {
		errs = append(errs, fmt.Errorf("partitions: must be between 1 and %d, got %d", maxPartitions, c.Partitions))
	}
	if c.ReplicationFactor < 1 || c.ReplicationFactor > 1000 {
		errs = append(errs, fmt.Errorf("replication_factor: must be between 1 and 1000, got %d", c.ReplicationFactor))
	}
	if !(c.Load >= 1.01 && c.Load <= 10) {
		errs = append(errs, fmt.Errorf("load: must be between 1.01 and 10 (1.25 is recommended), got %g", c.Load))
	}
	return errors.Join(errs...)
}

// maxPartitions keeps partition numbers and slots within uint16.
const maxPartitions = 65521

// Fingerprint identifies everything that decides placement: the hash
// parameters, the hasher and the ring algorithm's version. Two proxies
// with the same fingerprint and the same ring members route every key
// identically.
func (c HashConfig) Fingerprint() string {
	return fmt.Sprintf("v1-xxh64-cons1.1-p%d-r%d-l%g", c.Partitions, c.ReplicationFactor, c.Load)
}

// Failover says where a key goes when its owner is out of rotation.
type Failover uint8

const (
	// FailoverNext sends the key to the next in-rotation replica along the
	// ring for its partition (the same one on every proxy). The default.
	FailoverNext Failover = iota
	// FailoverStrict answers 503 with Retry-After instead, for keys whose
	// state must never be split between two replicas.
	FailoverStrict
)

// String returns "next" or "strict".
func (f Failover) String() string {
	if f == FailoverStrict {
		return "strict"
	}
	return "next"
}

// MarshalText implements encoding.TextMarshaler.
func (f Failover) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (f *Failover) UnmarshalText(b []byte) error {
	switch string(b) {
	case "next":
		*f = FailoverNext
	case "strict":
		*f = FailoverStrict
	default:
		return fmt.Errorf("must be one of next, strict, got %q", b)
	}
	return nil
}

// Fallback says how a request without a key is routed.
type Fallback uint8

const (
	FallbackRoundRobin    Fallback = iota // cycle through the replicas in rotation (default)
	FallbackLeastInflight                 // power of two choices on in-flight requests
	FallbackRandom                        // uniformly random replica in rotation
	FallbackReject                        // 400, naming the key sources tried
)

var fallbackNames = [...]string{"round_robin", "least_inflight", "random", "reject"}

// String returns the policy's config name.
func (f Fallback) String() string {
	if int(f) < len(fallbackNames) {
		return fallbackNames[f]
	}
	return fmt.Sprintf("fallback(%d)", uint8(f))
}

// MarshalText implements encoding.TextMarshaler.
func (f Fallback) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (f *Fallback) UnmarshalText(b []byte) error {
	for i, n := range fallbackNames {
		if n == string(b) {
			*f = Fallback(i)
			return nil
		}
	}
	return fmt.Errorf("must be one of %s, got %q", strings.Join(fallbackNames[:], ", "), b)
}

// KeySource is one place a request's key may come from. Exactly one field
// is set. Sources are tried in the configured order; the first present one
// wins. A plain value. [HashHeader], [HashPathSegment] and [HashQuery]
// extract and hash a key from each kind of source.
type KeySource struct {
	// Header names a request header, matched case-insensitively (e.g. X-Key).
	Header string `yaml:"header,omitempty" json:"header,omitempty"`
	// PathSegment is the 1-based index of a path segment: 2 takes "abc"
	// from "/ingest/abc/more".
	PathSegment int `yaml:"path_segment,omitempty" json:"path_segment,omitempty"`
	// Query names a query-string parameter.
	Query string `yaml:"query,omitempty" json:"query,omitempty"`
}

// String describes the source for error messages, e.g. "header X-Key".
func (s KeySource) String() string {
	switch {
	case s.Header != "":
		return "header " + s.Header
	case s.PathSegment > 0:
		return fmt.Sprintf("path segment %d", s.PathSegment)
	case s.Query != "":
		return "query " + s.Query
	}
	return "empty key source"
}

// Validate checks that exactly one field is set and well-formed.
func (s KeySource) Validate() error {
	n := 0
	if s.Header != "" {
		n++
		if !validHeaderName(s.Header) {
			return fmt.Errorf("header: %q is not a valid HTTP header name (letters, digits and !#$%%&'*+-.^_`|~ only)", s.Header)
		}
	}
	if s.PathSegment != 0 {
		n++
		if s.PathSegment < 1 || s.PathSegment > 64 {
			return fmt.Errorf("path_segment: must be between 1 and 64 (1-based segment index), got %d", s.PathSegment)
		}
	}
	if s.Query != "" {
		n++
	}
	if n != 1 {
		return errors.New("set exactly one of header, path_segment or query, e.g. {header: X-Key}")
	}
	return nil
}

func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}
