package logging

import (
	"errors"
	"fmt"

	"go.uber.org/zap/zapcore"
)

// Config configures keyway's logs. Application logs go to stderr; the
// optional access log goes to stdout on its own core (never sampled).
type Config struct {
	// Level is the minimum level: debug, info (default), warn or error.
	Level string `yaml:"level"`
	// Format is json (default) or console.
	Format string `yaml:"format"`
	// AccessLog writes one line per proxied request to stdout. Default false.
	AccessLog bool `yaml:"access_log"`
}

// DefaultConfig returns the logging configuration used when the YAML omits a field.
func DefaultConfig() Config { return Config{Level: "info", Format: "json"} }

// Validate reports every problem with the configuration. Each error starts
// with the field's YAML name followed by ": ".
func (c Config) Validate() error {
	var errs []error
	if _, err := zapcore.ParseLevel(c.Level); err != nil || (c.Level != "debug" && c.Level != "info" && c.Level != "warn" && c.Level != "error") {
		errs = append(errs, fmt.Errorf("level: must be one of debug, info, warn, error, got %q", c.Level))
	}
	if c.Format != "json" && c.Format != "console" {
		errs = append(errs, fmt.Errorf("format: must be json or console, got %q", c.Format))
	}
	return errors.Join(errs...)
}
