package membership

import (
	"fmt"
	"net"
	"strconv"

	"github.com/hashicorp/memberlist"
)

// SendReliable sends a user message over TCP to the alive member with this
// gossip node name, for messages too large for one packet (Send uses one
// UDP packet). It blocks until the message is written or memberlist's TCP
// timeout passes.
func (n *Node) SendReliable(node string, msg []byte) error {
	ml, addr, err := n.liveMember(node)
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("membership: member %q has no usable address %q: %w", node, addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("membership: member %q has no usable address %q: %w", node, addr, err)
	}
	return ml.SendReliable(&memberlist.Node{Name: node, Addr: net.ParseIP(host), Port: uint16(p)}, encodeEnvelope(n.Name(), n.seal(node, msg)))
}
