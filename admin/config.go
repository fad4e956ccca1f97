package admin

import (
	"fmt"
	"net"
)

// Config configures the admin listener: /metrics, /healthz, /readyz.
type Config struct {
	// Listen is the admin listener's address. Default "127.0.0.1:9901"
	// (loopback only). Empty disables the admin listener.
	Listen string `yaml:"listen"`
}

// DefaultConfig returns the admin configuration used when the YAML omits a field.
func DefaultConfig() Config { return Config{Listen: "127.0.0.1:9901"} }

// Validate reports every problem with the configuration. Each error starts
// with the field's YAML name followed by ": ".
func (c Config) Validate() error {
	if c.Listen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen: %q is not host:port (e.g. \"127.0.0.1:9901\"), or empty to disable the admin listener", c.Listen)
	}
	return nil
}
