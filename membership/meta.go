package membership

import (
	"encoding/binary"
	"errors"
	"fmt"

	"keyway/balancer"
)

// Role says what a gossip member is.
type Role uint8

const (
	RoleUnknown Role = iota
	RoleProxy        // a keyway proxy
	RoleReplica      // an agent advertising one replica
)

func (r Role) String() string {
	switch r {
	case RoleProxy:
		return "proxy"
	case RoleReplica:
		return "replica"
	}
	return "unknown"
}

// MarshalText implements encoding.TextMarshaler.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Meta is what a member advertises in its gossip node metadata. Encoded
// with [Meta.Encode] it must fit in 512 bytes (memberlist.MetaMaxSize).
type Meta struct {
	Role Role `json:"role"`
	// Set is the replica set (replicas only).
	Set string `json:"set,omitempty"`
	// Replica is the ring identity (replicas only), stable across restarts.
	Replica string `json:"replica,omitempty"`
	// Addr is the HTTP address: the replica's for proxies to forward to, or
	// the proxy's admin address.
	Addr string `json:"addr,omitempty"`
	// State is the replica's lifecycle state (replicas only).
	State balancer.State `json:"state"`
	// Weight is advisory; 0 means 1.
	Weight uint16 `json:"weight,omitempty"`
	// Zone is an optional failure-domain label.
	Zone string `json:"zone,omitempty"`
	// Boot is when the process started (Unix nanoseconds): of two members
	// claiming one replica name the newest boot wins.
	Boot int64 `json:"boot"`
	// Fingerprint is the ring fingerprint a proxy routes with, one per set
	// as "set=fingerprint" joined by ','; agents leave it empty.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Remove is set by a replica leaving for good (scale-in): proxies drop
	// it from the ring at once instead of waiting for forget_after.
	Remove bool `json:"remove,omitempty"`
	// Held is set by an agent holding an operator drain (admin API). Proxies
	// remember it per replica name, so that a new incarnation of the
	// replica (an agent restart) is drained again until an undrain.
	Held bool `json:"held,omitempty"`
	// SetStopped is set by an agent holding a set stop (SetStop): the
	// operator stopped the replica's set, so the agent drained the
	// replica, stopped its process (when it supervises one) and
	// advertises stopped while it stays in the cluster. Proxies compare it
	// with the set's run-time state and tell agents that differ.
	SetStopped bool `json:"set_stopped,omitempty"`
	// Supervised is set by an agent that runs its replica's process
	// (started with `-- CMD`): a rolling restart or a repair can restart
	// it. SupervisionKnown is set by every agent that advertises
	// Supervised at all: without it (an agent of an older version) a
	// false Supervised says nothing, and proxies treat the replica as one
	// that may be supervised.
	Supervised       bool `json:"supervised,omitempty"`
	SupervisionKnown bool `json:"supervision_known,omitempty"`
	// ID is a proxy's stable identity (fleet.id, proxies only): the other
	// proxies key its views, votes, run-time records and rolling restarts
	// by it, not by the per-boot node name, so that the old and the new
	// process of one proxy (a binary upgrade) count as one proxy. Empty
	// from an older proxy: Member.ID falls back to the node name.
	ID string `json:"id,omitempty"`
}

// MetaMaxSize is memberlist's limit on node metadata.
const MetaMaxSize = 512

// metaVersion is the first byte of every encoded Meta. A decoder accepts
// its own version and rejects others, so that an incompatible layout is
// ignored (and counted) instead of misread.
const metaVersion = 1

const (
	flagRemove = 1 << iota
	flagHeld
	flagSetStopped
	flagSupervised
	flagSupervisionKnown
)

// Errors returned by DecodeMeta.
var (
	ErrMetaVersion = errors.New("membership: unsupported metadata version")
	ErrMetaFormat  = errors.New("membership: malformed metadata")
	ErrMetaSize    = errors.New("membership: metadata larger than 512 bytes")
)

// Encode returns the compact binary form: version, role, state, flags
// (a bit each: remove, held, set stopped, supervised, supervision known),
// weight, boot, then length-prefixed strings set, replica, addr, zone,
// fingerprint, then the id when there is one (appended to version 1
// later: older decoders ignore it, and a member without one encodes as
// before). It fails when the result exceeds MetaMaxSize.
func (m Meta) Encode() ([]byte, error) { return m.encode(false) }

// encode is Encode; withID writes the id field even when it is empty
// (signed metadata: the signature follows it).
func (m Meta) encode(withID bool) ([]byte, error) {
	b := make([]byte, 0, 64+len(m.Set)+len(m.Replica)+len(m.Addr)+len(m.Zone)+len(m.Fingerprint)+len(m.ID))
	var flags byte
	if m.Remove {
		flags |= flagRemove
	}
	if m.Held {
		flags |= flagHeld
	}
	if m.SetStopped {
		flags |= flagSetStopped
	}
	if m.Supervised {
		flags |= flagSupervised
	}
	if m.SupervisionKnown {
		flags |= flagSupervisionKnown
	}
	b = append(b, metaVersion, byte(m.Role), byte(m.State), flags)
	b = binary.BigEndian.AppendUint16(b, m.Weight)
	b = binary.AppendVarint(b, m.Boot)
	fields := []string{m.Set, m.Replica, m.Addr, m.Zone, m.Fingerprint, m.ID}
	if m.ID == "" && !withID {
		fields = fields[:5]
	}
	for _, s := range fields {
		if len(s) > 255 {
			return nil, fmt.Errorf("%w: field %q is longer than 255 bytes", ErrMetaSize, s[:32]+"…")
		}
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	if len(b) > MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes; shorten the fingerprint, names, address or id", ErrMetaSize, len(b))
	}
	return b, nil
}

// DecodeMeta parses metadata written by Encode. It never panics on
// arbitrary input, rejects another version, and ignores bytes after the
// fields it knows (fields a later revision of version 1 may append). The
// id may be absent (an older member's metadata ends at the fingerprint):
// ID is then empty.
func DecodeMeta(b []byte) (Meta, error) {
	m, _, err := decodeMeta(b)
	return m, err
}

// metaEnd returns the offset of the end of the fields DecodeMeta knows
// (where a signature starts).
func metaEnd(b []byte) (int, error) {
	_, end, err := decodeMeta(b)
	return end, err
}

func decodeMeta(b []byte) (Meta, int, error) {
	m, rest, err := decodeMetaFields(b)
	return m, len(b) - len(rest), err
}

func decodeMetaFields(b []byte) (Meta, []byte, error) {
	var m Meta
	if len(b) > MetaMaxSize {
		return m, nil, ErrMetaSize
	}
	if len(b) < 6 {
		return m, nil, ErrMetaFormat
	}
	if b[0] != metaVersion {
		return m, nil, fmt.Errorf("%w %d", ErrMetaVersion, b[0])
	}
	m.Role, m.State = Role(b[1]), balancer.State(b[2])
	if m.Role != RoleProxy && m.Role != RoleReplica {
		return Meta{}, nil, fmt.Errorf("%w: role %d", ErrMetaFormat, b[1])
	}
	if m.State > balancer.StateFailed {
		return Meta{}, nil, fmt.Errorf("%w: state %d", ErrMetaFormat, b[2])
	}
	m.Remove = b[3]&flagRemove != 0
	m.Held = b[3]&flagHeld != 0
	m.SetStopped = b[3]&flagSetStopped != 0
	m.Supervised = b[3]&flagSupervised != 0
	m.SupervisionKnown = b[3]&flagSupervisionKnown != 0
	// Other bits of the flags byte are flags of a later revision: ignored,
	// as older decoders ignore the supervision bits.
	m.Weight = binary.BigEndian.Uint16(b[4:6])
	rest := b[6:]
	boot, n := binary.Varint(rest)
	if n <= 0 {
		return Meta{}, nil, ErrMetaFormat
	}
	m.Boot, rest = boot, rest[n:]
	for _, dst := range []*string{&m.Set, &m.Replica, &m.Addr, &m.Zone, &m.Fingerprint} {
		if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
			return Meta{}, nil, ErrMetaFormat
		}
		*dst = string(rest[1 : 1+int(rest[0])])
		rest = rest[1+int(rest[0]):]
	}
	if len(rest) > 0 {
		if len(rest) < 1+int(rest[0]) {
			return Meta{}, nil, ErrMetaFormat
		}
		m.ID = string(rest[1 : 1+int(rest[0])])
		rest = rest[1+int(rest[0]):]
	}
	// Bytes after the known fields are fields appended by a later minor
	// revision of version 1 (a signature, see signMeta): ignored here.
	return m, rest, nil
}
