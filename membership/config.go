package membership

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"keyway/fleetauth"
)

// Config configures a gossip node. Proxies and agents share it.
type Config struct {
	// BindAddr is the address gossip listens on (UDP and TCP). Default
	// "0.0.0.0".
	BindAddr string `yaml:"bind_addr"`
	// BindPort is the gossip port. Default 7946; 0 picks a free port.
	BindPort int `yaml:"bind_port"`
	// AdvertiseAddr is the address other members reach this one at. Empty
	// means BindAddr, or a private address of this host when BindAddr is
	// 0.0.0.0. Set it in containers.
	AdvertiseAddr string `yaml:"advertise_addr"`
	// AdvertisePort is the advertised port. 0 means the bound port.
	AdvertisePort int `yaml:"advertise_port"`
	// Join lists members to join: host:port or a DNS name (a Kubernetes
	// headless Service) that resolves to several. Empty starts a new cluster.
	Join []string `yaml:"join"`
	// RejoinInterval re-joins the Join addresses periodically so that a
	// healed network partition merges again. Default 30s; 0 disables.
	RejoinInterval time.Duration `yaml:"rejoin_interval"`
	// Label is prepended to every gossip packet: members with another label
	// never join. Default "keyway".
	Label string `yaml:"label"`
	// KeyFile names a file of base64 AES keys (16, 24 or 32 bytes each),
	// one per line; the first is used to encrypt, all are tried to decrypt
	// (rotation). The environment variable KEYWAY_GOSSIP_KEY, if set, is
	// used instead. Empty means no encryption: any host that can reach the
	// gossip port and knows the label can join, so gossip without a key
	// must stay on loopback unless Insecure is set (see CheckKey).
	KeyFile string `yaml:"key_file"`
	// Insecure allows gossip without an encryption key on an address off
	// loopback (BindAddr or AdvertiseAddr): any host that reaches the
	// gossip port can then join, advertise a replica's name to take its
	// keys, and send agents drain commands. Only for a network where every
	// host is trusted; a node started so logs an error-level line saying
	// so. Default false: such a node refuses to start.
	Insecure bool `yaml:"insecure"`
	// CredentialsFile names the fleet credentials file that "keyway keys"
	// writes: the public keys of the proxies and of every set's agents,
	// and the private keys of this node's role (a proxy's, or its set's
	// agents'). What changes state across the fleet is signed with them:
	// run-time records, commands to agents, fleet views, a replica's
	// claim to its name and a proxy's to its role. Required wherever a
	// gossip key is (off loopback, unless Insecure): every member holds
	// the gossip key, so it keeps only strangers out.
	CredentialsFile string `yaml:"credentials_file"`
	// Signatures says what a node with credentials does with unsigned
	// messages and claims: "required" (the default) refuses them, counted
	// in keyway_gossip_rejected_total; "optional" also believes members of
	// a keyway version without signatures, as that version did (a
	// member's role from its own metadata), for the time of a rolling
	// upgrade. Signed ones are verified either way.
	Signatures string `yaml:"signatures"`
	// ForgetAfter is how long a dead replica stays on the ring (out of
	// rotation) before its partitions move for good. A restart within it
	// gets its partitions back. Default 5m.
	ForgetAfter time.Duration `yaml:"forget_after"`
	// Profile tunes failure detection: "lan" (memberlist's LAN preset:
	// ~5s to detect a crash) or "fast" (probe every 500ms, ~2s, more false
	// suspicions under CPU stalls). Default "lan".
	Profile string `yaml:"profile"`
	// PushPullInterval is the full state sync period that bounds how stale
	// a member's view can get. Default 15s.
	PushPullInterval time.Duration `yaml:"push_pull_interval"`
}

// DefaultConfig returns the configuration used when the YAML omits a field.
func DefaultConfig() Config {
	return Config{
		BindAddr:         "0.0.0.0",
		BindPort:         7946,
		RejoinInterval:   30 * time.Second,
		Label:            "keyway",
		ForgetAfter:      5 * time.Minute,
		Profile:          "lan",
		PushPullInterval: 15 * time.Second,
		Signatures:       SignaturesRequired,
	}
}

// The values of Config.Signatures.
const (
	SignaturesRequired = "required"
	SignaturesOptional = "optional"
)

// Validate reports every problem. Each error starts with the field's YAML
// name followed by ": ".
func (c Config) Validate() error {
	var errs []error
	if net.ParseIP(c.BindAddr) == nil {
		errs = append(errs, fmt.Errorf("bind_addr: %q is not an IP address (use 0.0.0.0 for all interfaces)", c.BindAddr))
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		errs = append(errs, fmt.Errorf("bind_port: must be between 0 and 65535, got %d", c.BindPort))
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		errs = append(errs, fmt.Errorf("advertise_addr: %q is not an IP address", c.AdvertiseAddr))
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		errs = append(errs, fmt.Errorf("advertise_port: must be between 0 and 65535, got %d", c.AdvertisePort))
	}
	for i, j := range c.Join {
		if strings.TrimSpace(j) == "" || strings.Contains(j, "/") {
			errs = append(errs, fmt.Errorf("join[%d]: %q is not host or host:port", i, j))
		} else if _, port, err := net.SplitHostPort(j); err == nil {
			// memberlist parses the port as a 16-bit number.
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
				errs = append(errs, fmt.Errorf("join[%d]: %q has an invalid port: use 1 to 65535", i, j))
			}
		}
	}
	if c.RejoinInterval != 0 && c.RejoinInterval < time.Second {
		errs = append(errs, fmt.Errorf("rejoin_interval: must be 0 (off) or at least 1s, got %s", c.RejoinInterval))
	}
	if len(c.Label) > 255 {
		errs = append(errs, fmt.Errorf("label: must be at most 255 bytes, got %d", len(c.Label)))
	}
	if c.KeyFile != "" {
		if _, err := readKeyFile(c.KeyFile); err != nil {
			errs = append(errs, fmt.Errorf("key_file: %w", err))
		}
	}
	if c.CredentialsFile != "" {
		if _, err := fleetauth.Load(c.CredentialsFile); err != nil {
			errs = append(errs, fmt.Errorf("credentials_file: %w", err))
		}
	}
	if c.Signatures != SignaturesRequired && c.Signatures != SignaturesOptional && c.Signatures != "" {
		errs = append(errs, fmt.Errorf("signatures: must be required or optional (optional only while members of a version without signatures run), got %q", c.Signatures))
	}
	if c.ForgetAfter < time.Second {
		errs = append(errs, fmt.Errorf("forget_after: must be at least 1s, got %s", c.ForgetAfter))
	}
	if c.Profile != "lan" && c.Profile != "fast" {
		errs = append(errs, fmt.Errorf("profile: must be lan or fast, got %q", c.Profile))
	}
	if c.PushPullInterval < time.Second {
		errs = append(errs, fmt.Errorf("push_pull_interval: must be at least 1s, got %s", c.PushPullInterval))
	}
	return errors.Join(errs...)
}

// KeyEnv is the environment variable holding the gossip keys (comma-
// separated base64); when set and not empty it is used instead of
// KeyFile. Proxies and agents read the same variable.
const KeyEnv = "KEYWAY_GOSSIP_KEY"

// keys returns the gossip keys: from KEYWAY_GOSSIP_KEY (comma-separated
// base64 keys) if set, else from KeyFile, else none. An error about the
// variable starts with "$KEYWAY_GOSSIP_KEY: ".
func (c Config) keys(lookup func(string) (string, bool)) ([][]byte, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if v, ok := lookup(KeyEnv); ok && v != "" {
		return parseKeys(strings.Split(v, ","), "$"+KeyEnv)
	}
	if c.KeyFile == "" {
		return nil, nil
	}
	return readKeyFile(c.KeyFile)
}

func readKeyFile(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseKeys(strings.Split(string(b), "\n"), path)
}

func parseKeys(lines []string, source string) ([][]byte, error) {
	var keys [][]byte
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(l)
		if err != nil {
			return nil, fmt.Errorf("%s: key %d is not base64 (make one with: head -c 32 /dev/urandom | base64)", source, i+1)
		}
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return nil, fmt.Errorf("%s: key %d is %d bytes; AES keys are 16, 24 or 32 bytes (32 recommended)", source, i+1, n)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no key found", source)
	}
	return keys, nil
}
