package membership

import (
	"fmt"
	"log"
	"strings"

	"github.com/hashicorp/memberlist"
)

// netTransport binds the node's gossip transport itself, as memberlist
// would, and hands it to Options.Transport to wrap. It sets c.Transport,
// and the ports memberlist would have filled in for a bind port of 0.
func (n *Node) netTransport(c *memberlist.Config) error {
	nc := &memberlist.NetTransportConfig{
		BindAddrs: []string{c.BindAddr},
		BindPort:  c.BindPort,
		Logger:    log.New(c.LogOutput, "", log.LstdFlags),
	}
	// Binding UDP and TCP to one kernel-chosen port races with other
	// processes; memberlist retries too.
	tries := 1
	if c.BindPort == 0 {
		tries = 10
	}
	var (
		nt  *memberlist.NetTransport
		err error
	)
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("gossip transport: %w", err)
	}
	if c.BindPort == 0 {
		port := nt.GetAutoBindPort()
		c.BindPort = port
		if n.cfg.AdvertisePort == 0 {
			c.AdvertisePort = port
		}
	}
	t := n.opts.Transport(nt)
	if t == nil {
		_ = nt.Shutdown()
		return fmt.Errorf("gossip transport: the Transport hook returned nil")
	}
	c.Transport = t
	return nil
}
