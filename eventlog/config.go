package eventlog

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Limits enforced by [Config.Validate].
const (
	minFileBytes = 4096
	maxQueue     = 1 << 20 // Buffer and Memory: about 100 MB of events at most
)

// Config configures the audit trail. In the proxy's YAML it lives under
// "audit:". Each field's comment gives its unit, its default and what zero
// means. A Config is a plain value, safe to copy.
type Config struct {
	// Dir is the directory under which each node writes its files, as
	// DIR/NODE/events-NNNNNN.jsonl. It is created (with parents) when the
	// log runs. Default "" disables the files: events are still kept in
	// memory for [Log.Recent].
	Dir string `yaml:"dir"`
	// MaxFileBytes is the size in bytes a file may reach: a line that
	// would take the file past it goes to the next file. A single line
	// longer than MaxFileBytes gets a file of its own. Default 16 MiB
	// (16777216); at least 4096.
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// Retain is the number of files kept per node, the one being written
	// included; older files are deleted when a new one starts. Default 10;
	// at least 1.
	Retain int `yaml:"retain"`
	// Buffer is the number of events queued for the writer. When it is
	// full, new events are not written to the file (they stay in memory)
	// and are counted in keyway_audit_dropped_total{reason="queue_full"}.
	// Default 4096; 1 to 1048576.
	Buffer int `yaml:"buffer"`
	// Memory is the number of most recent events kept in memory for
	// [Log.Recent] (the admin API's GET /v1/events). Default 1000; 0 keeps
	// none; at most 1048576.
	Memory int `yaml:"memory"`
	// Sink is an object-storage address, s3://BUCKET/PREFIX, that the
	// events are also written to, as segments under
	// PREFIX/SET/run-RUN/events-NNNNNN.jsonl (package eventlog/objstore).
	// Credentials and endpoint come from the standard AWS_* environment
	// (AWS_ENDPOINT_URL for an S3-compatible server) or the pod's
	// workload identity. Default "": off.
	Sink string `yaml:"sink"`
	// SegmentBytes and SegmentAge cut a set's segment when it reaches
	// that size or its first event that age, whichever comes first: a
	// crash loses at most SegmentAge of events. Defaults 1 MiB and 10s.
	SegmentBytes int64         `yaml:"segment_bytes"`
	SegmentAge   time.Duration `yaml:"segment_age"`
	// SpoolBytes bounds the segments kept while the store is unreachable
	// (uploaded in order once it is back; beyond, dropped and counted).
	// With Dir set they are files in DIR/NODE/spool, and this bounds
	// their bytes: the segments not uploaded at a stop or a crash are
	// uploaded first by the node's next process. Without Dir they are in
	// memory and lost with the process. Default 64 MiB.
	SpoolBytes int64 `yaml:"spool_bytes"`
	// PathStyle addresses objects as ENDPOINT/BUCKET/KEY, which SeaweedFS
	// and MinIO on host:port need. Default false (BUCKET.ENDPOINT/KEY).
	PathStyle bool `yaml:"path_style"`
}

// DefaultConfig returns the configuration used when the YAML omits a
// field. Its Dir is empty: files are off until a directory is configured.
func DefaultConfig() Config {
	return Config{
		MaxFileBytes: 16 << 20,
		Retain:       10,
		Buffer:       4096,
		Memory:       1000,
		SegmentBytes: 1 << 20,
		SegmentAge:   10 * time.Second,
		SpoolBytes:   64 << 20,
	}
}

// Validate reports every problem, joined with errors.Join. Each error's
// text starts with the field's YAML key followed by ": ". It is safe for
// concurrent use.
func (c Config) Validate() error {
	var errs []error
	if c.MaxFileBytes < minFileBytes {
		errs = append(errs, fmt.Errorf("max_file_bytes: must be at least %d, got %d", minFileBytes, c.MaxFileBytes))
	}
	if c.Retain < 1 {
		errs = append(errs, fmt.Errorf("retain: must be at least 1, got %d", c.Retain))
	}
	if c.Buffer < 1 || c.Buffer > maxQueue {
		errs = append(errs, fmt.Errorf("buffer: must be between 1 and %d, got %d", maxQueue, c.Buffer))
	}
	if c.Memory < 0 || c.Memory > maxQueue {
		errs = append(errs, fmt.Errorf("memory: must be between 0 and %d, got %d", maxQueue, c.Memory))
	}
	if c.Sink != "" {
		if u, err := url.Parse(c.Sink); err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			errs = append(errs, fmt.Errorf("sink: %q is not an object-storage address: write s3://BUCKET/PREFIX, e.g. s3://audit/keyway, or leave it empty", c.Sink))
		}
	}
	if c.SegmentBytes < 1024 || c.SegmentBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("segment_bytes: must be between 1024 and 1073741824, got %d", c.SegmentBytes))
	}
	if c.SegmentAge < 100*time.Millisecond || c.SegmentAge > time.Hour {
		errs = append(errs, fmt.Errorf("segment_age: must be between 100ms and 1h, got %s", c.SegmentAge))
	}
	if c.SpoolBytes < c.SegmentBytes {
		errs = append(errs, fmt.Errorf("spool_bytes: must hold a segment (segment_bytes %d), got %d", c.SegmentBytes, c.SpoolBytes))
	}
	return errors.Join(errs...)
}
