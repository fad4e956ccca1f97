package logging

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.uber.org/zap/zapcore"
)

// Config configures keyway's logs. Application logs go to stderr; the
// optional access log goes to stdout or a file (Access.Path).
type Config struct {
	// Level is the minimum level: debug, info (default), warn or error.
	Level string `yaml:"level"`
	// Format is json (default) or console.
	Format string `yaml:"format"`
	// AccessLog turns the access log on: one JSON line per request.
	// Default false. It is the switch; Access says where and what.
	AccessLog bool `yaml:"access_log"`
	// Access configures the access log. Setting any of it while
	// AccessLog is false is an error (it would do nothing).
	Access AccessConfig `yaml:"access"`
}

// AccessConfig configures the access log (docs/logging.md).
type AccessConfig struct {
	// Path is the file the access log is appended to, created with mode
	// 0640 if missing and reopened on SIGUSR1 (log rotation). "" (the
	// default) or "stdout" writes to stdout instead.
	Path string `yaml:"path"`
	// Key says whether the request's key appears in the log: omit (the
	// default: the key may be personal data), hmac (a keyed hash,
	// HMAC-SHA256 with the key secret truncated to 16 hex digits: lines of
	// one key can be correlated, the key cannot be read back), or plain.
	// omit and hmac also hide the key segments of the logged path.
	Key string `yaml:"key"`
	// KeySecretFile holds the secret of key: hmac (at least 16 bytes;
	// surrounding white space is ignored). The environment variable
	// KEYWAY_ACCESS_LOG_KEY_SECRET, when set, is used instead.
	KeySecretFile string `yaml:"key_secret_file"`
}

// Key modes of [AccessConfig.Key].
const (
	KeyOmit  = "omit"
	KeyHMAC  = "hmac"
	KeyPlain = "plain"
)

// KeySecretEnv is the environment variable that holds the access log's
// key secret; it takes precedence over log.access.key_secret_file.
const KeySecretEnv = "KEYWAY_ACCESS_LOG_KEY_SECRET"

// minSecret is the shortest key secret accepted: a short secret can be
// guessed, and with it every logged key recovered by trying candidates.
const minSecret = 16

// DefaultConfig returns the logging configuration used when the YAML omits a field.
func DefaultConfig() Config {
	return Config{Level: "info", Format: "json", Access: AccessConfig{Key: KeyOmit}}
}

// Validate reports every problem with the configuration. Each error starts
// with the field's YAML name followed by ": ". It reads key_secret_file
// (but not the environment: see [Config.CheckKeySecret]) and checks that
// the access log file's directory exists.
func (c Config) Validate() error {
	var errs []error
	if _, err := zapcore.ParseLevel(c.Level); err != nil || (c.Level != "debug" && c.Level != "info" && c.Level != "warn" && c.Level != "error") {
		errs = append(errs, fmt.Errorf("level: must be one of debug, info, warn, error, got %q", c.Level))
	}
	if c.Format != "json" && c.Format != "console" {
		errs = append(errs, fmt.Errorf("format: must be json or console, got %q", c.Format))
	}
	a := c.Access
	switch a.Key {
	case KeyOmit, KeyHMAC, KeyPlain:
	default:
		errs = append(errs, fmt.Errorf("access.key: must be omit, hmac or plain, got %q", a.Key))
	}
	if !c.AccessLog {
		if a.Path != "" {
			errs = append(errs, fmt.Errorf("access.path: %q is set but access_log is false, so nothing is written: set log.access_log: true, or remove log.access.path", a.Path))
		}
		if a.Key == KeyHMAC || a.Key == KeyPlain {
			errs = append(errs, fmt.Errorf("access.key: %q is set but access_log is false, so nothing is written: set log.access_log: true, or remove log.access.key", a.Key))
		}
	}
	if a.Path != "" && a.Path != "stdout" {
		if strings.TrimSpace(a.Path) != a.Path {
			errs = append(errs, fmt.Errorf("access.path: %q has leading or trailing white space", a.Path))
		} else if fi, err := os.Stat(filepath.Dir(a.Path)); err != nil || !fi.IsDir() {
			errs = append(errs, fmt.Errorf("access.path: the directory of %q does not exist: create it (keyway creates the file, not its directory), or leave the key empty for stdout", a.Path))
		}
	}
	if a.KeySecretFile != "" {
		if _, err := readSecretFile(a.KeySecretFile); err != nil {
			errs = append(errs, fmt.Errorf("access.key_secret_file: %w", err))
		}
	}
	return errors.Join(errs...)
}

// CheckKeySecret reports what [New] would refuse beyond Validate: key:
// hmac with no secret in the environment (through lookup; nil means
// os.LookupEnv) nor in key_secret_file, or a secret in the environment
// that is too short. An error starts with "access.key: " or with
// "$KEYWAY_ACCESS_LOG_KEY_SECRET: ".
func (c Config) CheckKeySecret(lookup func(string) (string, bool)) error {
	if !c.AccessLog || c.Access.Key != KeyHMAC {
		return nil
	}
	_, err := c.Access.secret(lookup)
	return err
}

// secret returns the HMAC secret: the environment's, else the file's.
func (a AccessConfig) secret(lookup func(string) (string, bool)) ([]byte, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if v, ok := lookup(KeySecretEnv); ok && strings.TrimSpace(v) != "" {
		s := strings.TrimSpace(v)
		if len(s) < minSecret {
			return nil, fmt.Errorf("$%s: the secret has %d bytes, want at least %d (e.g. openssl rand -hex 32)", KeySecretEnv, len(s), minSecret)
		}
		return []byte(s), nil
	}
	if a.KeySecretFile == "" {
		return nil, fmt.Errorf("access.key: hmac needs a secret: set log.access.key_secret_file to a file holding at least %d random bytes (e.g. openssl rand -hex 32 > FILE) or the environment variable %s, or use key: omit", minSecret, KeySecretEnv)
	}
	s, err := readSecretFile(a.KeySecretFile)
	if err != nil {
		return nil, fmt.Errorf("access.key_secret_file: %w", err)
	}
	return s, nil
}

func readSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := strings.TrimSpace(string(b))
	if len(s) < minSecret {
		return nil, fmt.Errorf("%s holds %d bytes (white space aside), want at least %d (e.g. openssl rand -hex 32 > %s)", path, len(s), minSecret, path)
	}
	return []byte(s), nil
}
