package membership

import (
	"fmt"
	"net"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Gossip without a key is open to every host that reaches the gossip port:
// it can join, advertise a replica's name (and take its keys) and send
// agents drain commands. As with the admin listener and its token, a node
// without a key must stay on loopback, unless Config.Insecure says the
// network is trusted.

// CheckKey applies New's key rules to c without building a node, for
// configuration loading ("keyway validate", "keyway agent --check" and
// startup see the same answer as New): the keys (KEYWAY_GOSSIP_KEY, else
// key_file) must parse, and gossip that binds or advertises an address
// off loopback needs one unless Insecure is set. lookup finds
// KEYWAY_GOSSIP_KEY; nil means os.LookupEnv.
//
// Like Validate's, each error starts with the field's YAML name and ": "
// (bind_addr, advertise_addr, key_file), except one about the variable,
// which starts with "$KEYWAY_GOSSIP_KEY: ". An address that is not an IP
// is left to Validate. It is safe for concurrent use.
func (c Config) CheckKey(lookup func(string) (string, bool)) error {
	_, err := c.checkKey(lookup)
	return err
}

// checkKey is CheckKey, returning the keys.
func (c Config) checkKey(lookup func(string) (string, bool)) ([][]byte, error) {
	keys, err := c.keys(lookup)
	if err != nil {
		if strings.HasPrefix(err.Error(), "$"+KeyEnv+": ") {
			return nil, err
		}
		return nil, fmt.Errorf("key_file: %w", err)
	}
	if len(keys) > 0 || c.Insecure {
		return keys, nil
	}
	switch field, addr, off := c.offLoopback(); {
	case !off:
		return nil, nil
	case field == "bind_addr":
		return nil, fmt.Errorf("bind_addr: gossip would listen on %q, which is not a loopback address, without an encryption key: "+
			"any host that reaches it could join the cluster, take a replica's keys by claiming its name and drain replicas; "+
			"set a key with gossip.key_file or %s (make one with: head -c 32 /dev/urandom | base64), "+
			"or bind to loopback (gossip.bind_addr: 127.0.0.1), or set gossip.insecure: true if the network is trusted", addr, KeyEnv)
	default:
		return nil, fmt.Errorf("advertise_addr: gossip would advertise %q, which is not a loopback address, without an encryption key: "+
			"any host that reaches it could join the cluster, take a replica's keys by claiming its name and drain replicas; "+
			"set a key with gossip.key_file or %s (make one with: head -c 32 /dev/urandom | base64), "+
			"or bind and advertise loopback only, or set gossip.insecure: true if the network is trusted", addr, KeyEnv)
	}
}

// offLoopback names the first of BindAddr and AdvertiseAddr that is an IP
// address off loopback (0.0.0.0 included), if any. An empty AdvertiseAddr
// follows BindAddr; one that is not an IP is Validate's to report.
func (c Config) offLoopback() (field, addr string, off bool) {
	if ip := net.ParseIP(c.BindAddr); ip != nil && !ip.IsLoopback() {
		return "bind_addr", c.BindAddr, true
	}
	if ip := net.ParseIP(c.AdvertiseAddr); ip != nil && !ip.IsLoopback() {
		return "advertise_addr", c.AdvertiseAddr, true
	}
	return "", "", false
}

// warnInsecure logs, at error level and without a stack trace, that this
// node gossips in clear off loopback because gossip.insecure allows it.
func (n *Node) warnInsecure() {
	field, addr, off := n.cfg.offLoopback()
	if len(n.keys) > 0 || !off {
		return
	}
	n.log.WithOptions(zap.AddStacktrace(zapcore.FatalLevel)).Error(
		"gossip is NOT ENCRYPTED and reachable off loopback (gossip.insecure: true): any host that reaches the gossip port can join the cluster, "+
			"take a replica's keys by claiming its name and drain replicas; set gossip.key_file or "+KeyEnv+" unless every host on this network is trusted",
		zap.String(field, addr))
}
