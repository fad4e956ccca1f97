package membership

import (
	"encoding/json"
	"errors"
)

// AdminDrain is the user message a proxy's admin API sends to a replica's
// agent to drain it for an operator (Drain true) or end that drain (Drain
// false). The agent advertises draining while it holds the drain, so every
// proxy takes the replica out of rotation, not only the one asked.
type AdminDrain struct {
	// Kind is always "admin_drain"; other kinds are ignored.
	Kind    string `json:"kind"`
	Set     string `json:"set"`
	Replica string `json:"replica"`
	// Boot, when not 0, names the replica incarnation the command is for;
	// an agent of another incarnation ignores it.
	Boot  int64 `json:"boot,omitempty"`
	Drain bool  `json:"drain"`
	// By is the fleet ID of the proxy that sent it, for logs.
	By string `json:"by"`
}

// AdminDrainKind is the kind of an AdminDrain message.
const AdminDrainKind = "admin_drain"

const adminDrainKind = AdminDrainKind

// Encode returns the message bytes.
func (c AdminDrain) Encode() []byte {
	c.Kind = adminDrainKind
	b, _ := json.Marshal(c)
	return b
}

// ErrNotAdminDrain is returned for a message of another kind.
var ErrNotAdminDrain = errors.New("membership: not an admin drain command")

// DecodeAdminDrain parses a message written by Encode.
func DecodeAdminDrain(b []byte) (AdminDrain, error) {
	var c AdminDrain
	if err := json.Unmarshal(b, &c); err != nil {
		return c, err
	}
	if c.Kind != adminDrainKind {
		return c, ErrNotAdminDrain
	}
	return c, nil
}

// MessageKind returns the "kind" of a user message, or "" when it is not a
// JSON object with one.
func MessageKind(b []byte) string {
	var k struct {
		Kind string `json:"kind"`
	}
	if json.Unmarshal(b, &k) != nil {
		return ""
	}
	return k.Kind
}
