// Package fleetauth holds the fleet's signing keys and the signatures that
// make gossip trustworthy inside the fleet: the gossip key only keeps
// strangers out, and every member holds it, so what changes state across
// the fleet is signed for its role.
//
//   - The proxy key: its private half is on proxies only; agents and
//     proxies hold the public half. It signs run-time records, commands to
//     agents, fleet views and evidence, and a proxy's gossip metadata.
//   - An agent key per replica set: its private half is on that set's
//     agents only. It signs a replica's claim to its name (its gossip
//     metadata) and the agent's reports.
//
// Keys come in lists so that rotation needs no downtime: every listed key
// verifies, the first private key signs. Ed25519 (crypto/ed25519): small
// keys and signatures (32 and 64 bytes), deterministic, fast to verify.
package fleetauth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Role is what a key lets its holder sign for.
type Role uint8

const (
	RoleNone  Role = iota // unsigned, or signed by no known key
	RoleProxy             // the proxy key
	RoleAgent             // a set's agent key
)

func (r Role) String() string {
	switch r {
	case RoleProxy:
		return "proxy"
	case RoleAgent:
		return "agent"
	}
	return "none"
}

// Signer is who a verified signature comes from: a proxy, or the agents
// of one set.
type Signer struct {
	Role Role
	// Set is the replica set of an agent key ("" for the proxy key).
	Set string
	// KeyID names the key that signed.
	KeyID string
}

func (s Signer) String() string {
	switch s.Role {
	case RoleProxy:
		return "proxy key " + s.KeyID
	case RoleAgent:
		return "agent key " + s.KeyID + " of set " + s.Set
	}
	return "unsigned"
}

// KeyIDLen is the length of a key ID in bytes (hex-encoded, twice that).
const KeyIDLen = 8

// KeyID returns a public key's ID: the first 8 bytes of its SHA-256, in
// hex. Signatures carry it so that a verifier finds the key at once.
func KeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:KeyIDLen])
}

// Key prefixes in the credentials file and in Kubernetes Secrets.
const (
	publicPrefix  = "ed25519-pub:"
	privatePrefix = "ed25519-seed:"
)

// FormatPublic and FormatPrivate write keys as the credentials file holds
// them: a prefix naming the kind, then base64 (standard, padded).
func FormatPublic(pub ed25519.PublicKey) string {
	return publicPrefix + base64.StdEncoding.EncodeToString(pub)
}

func FormatPrivate(priv ed25519.PrivateKey) string {
	return privatePrefix + base64.StdEncoding.EncodeToString(priv.Seed())
}

// ParsePublic parses a key written by FormatPublic.
func ParsePublic(s string) (ed25519.PublicKey, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, publicPrefix)
	if !ok {
		if strings.HasPrefix(s, privatePrefix) {
			return nil, errors.New("is a private key where a public one belongs (public keys start with " + publicPrefix + ")")
		}
		return nil, fmt.Errorf("does not start with %q (make keys with: keyway keys)", publicPrefix)
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("is not %d bytes of base64 after %q (make keys with: keyway keys)", ed25519.PublicKeySize, publicPrefix)
	}
	return ed25519.PublicKey(b), nil
}

// ParsePrivate parses a key written by FormatPrivate.
func ParsePrivate(s string) (ed25519.PrivateKey, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, privatePrefix)
	if !ok {
		if strings.HasPrefix(s, publicPrefix) {
			return nil, errors.New("is a public key where a private one belongs (private keys start with " + privatePrefix + ")")
		}
		return nil, fmt.Errorf("does not start with %q (make keys with: keyway keys)", privatePrefix)
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(b) != ed25519.SeedSize {
		return nil, fmt.Errorf("is not %d bytes of base64 after %q (make keys with: keyway keys)", ed25519.SeedSize, privatePrefix)
	}
	return ed25519.NewKeyFromSeed(b), nil
}

// NewKey returns a new random key pair.
func NewKey() (ed25519.PublicKey, ed25519.PrivateKey) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		// crypto/rand.Reader does not fail on the systems Go supports.
		panic("fleetauth: " + err.Error())
	}
	return pub, priv
}

// Keyring is what one node holds: every public key it verifies with, and
// the private keys of its own role. Build it with Credentials.Keyring. It
// is immutable and safe for concurrent use.
type Keyring struct {
	verify map[string]verifyKey // by key ID
	sign   ed25519.PrivateKey   // nil: this node signs nothing
	signID string
	signer Signer
	// sets are the sets with agent keys, sorted.
	sets []string
}

type verifyKey struct {
	pub    ed25519.PublicKey
	signer Signer
}

// CanSign reports whether the keyring holds a private key.
func (k *Keyring) CanSign() bool { return k != nil && k.sign != nil }

// Self is who this keyring signs as (Role RoleNone when it signs nothing).
func (k *Keyring) Self() Signer {
	if k == nil {
		return Signer{}
	}
	return k.signer
}

// Sets returns the sets whose agent keys the keyring verifies, sorted.
func (k *Keyring) Sets() []string {
	if k == nil {
		return nil
	}
	return slices.Clone(k.sets)
}

// HasSet reports whether the keyring verifies the set's agent keys.
func (k *Keyring) HasSet(set string) bool {
	if k == nil {
		return false
	}
	_, ok := slices.BinarySearch(k.sets, set)
	return ok
}

// Errors of Verify; a verifier counts rejections by them.
var (
	ErrUnknownKey   = errors.New("signed by a key this node does not know")
	ErrBadSignature = errors.New("signature does not verify")
)

// message builds the bytes a signature covers: a domain naming what is
// signed, then each part length-prefixed, so that no two sequences of
// parts give the same bytes.
func message(domain string, parts ...[]byte) []byte {
	n := len(domain) + 1
	for _, p := range parts {
		n += binary.MaxVarintLen64 + len(p)
	}
	b := make([]byte, 0, n)
	b = append(b, domain...)
	b = append(b, 0)
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

// Sign signs parts under domain with the first private key. It returns
// the key ID and the signature; ok is false when the keyring holds no
// private key.
func (k *Keyring) Sign(domain string, parts ...[]byte) (keyID string, sig []byte, ok bool) {
	if !k.CanSign() {
		return "", nil, false
	}
	return k.signID, ed25519.Sign(k.sign, message(domain, parts...)), true
}

// Verify checks a signature by the key keyID over parts under domain,
// and says whose key it is.
func (k *Keyring) Verify(keyID string, sig []byte, domain string, parts ...[]byte) (Signer, error) {
	if k == nil {
		return Signer{}, ErrUnknownKey
	}
	vk, ok := k.verify[keyID]
	if !ok {
		return Signer{}, ErrUnknownKey
	}
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(vk.pub, message(domain, parts...), sig) {
		return Signer{}, ErrBadSignature
	}
	return vk.signer, nil
}

// Credentials are keys as the credentials file lists them.
type Credentials struct {
	// Proxy is the proxy key list. Proxies hold the private halves.
	Proxy KeyList
	// Agents are the agent key lists by set. A set's agents hold its
	// private halves.
	Agents map[string]KeyList
}

// KeyList is one key list: every public key verifies, the first private
// key signs.
type KeyList struct {
	Public  []ed25519.PublicKey
	Private []ed25519.PrivateKey
}

// As says which role a node signs as.
type As struct {
	Role Role
	Set  string // for RoleAgent
}

// Keyring builds the keyring of a node that signs as as. It is an error
// when the credentials do not hold what that role needs: the proxy's
// public keys (always), and the private key of the role.
func (c Credentials) Keyring(as As) (*Keyring, error) {
	k := &Keyring{verify: map[string]verifyKey{}}
	if len(c.Proxy.Public) == 0 {
		return nil, errors.New("proxy.public: no proxy public key: every node verifies proxies' signatures (make credentials with: keyway keys)")
	}
	add := func(pub ed25519.PublicKey, s Signer) error {
		id := KeyID(pub)
		if prev, ok := k.verify[id]; ok && (prev.signer.Role != s.Role || prev.signer.Set != s.Set) {
			return fmt.Errorf("key %s is listed both as %s and as %s: give every role its own keys", id, prev.signer, s)
		}
		s.KeyID = id
		k.verify[id] = verifyKey{pub: pub, signer: s}
		return nil
	}
	for _, pub := range c.Proxy.Public {
		if err := add(pub, Signer{Role: RoleProxy}); err != nil {
			return nil, err
		}
	}
	for _, set := range slices.Sorted(maps.Keys(c.Agents)) {
		for _, pub := range c.Agents[set].Public {
			if err := add(pub, Signer{Role: RoleAgent, Set: set}); err != nil {
				return nil, err
			}
		}
		k.sets = append(k.sets, set)
	}
	var list KeyList
	var field string
	switch as.Role {
	case RoleProxy:
		list, field = c.Proxy, "proxy"
	case RoleAgent:
		list, field = c.Agents[as.Set], "agents."+as.Set
		if _, ok := c.Agents[as.Set]; !ok {
			return nil, fmt.Errorf("agents: no keys for set %q: an agent of set %s signs with its set's key (make them with: keyway keys --sets %s)", as.Set, as.Set, as.Set)
		}
	default:
		return k, nil
	}
	if len(list.Private) == 0 {
		return nil, fmt.Errorf("%s.private: no private key: %s signs with one (use the credentials keyway keys wrote for it)", field, map[Role]string{RoleProxy: "a proxy", RoleAgent: "an agent of set " + as.Set}[as.Role])
	}
	priv := list.Private[0]
	pub := priv.Public().(ed25519.PublicKey)
	if !slices.ContainsFunc(list.Public, func(p ed25519.PublicKey) bool { return p.Equal(pub) }) {
		return nil, fmt.Errorf("%s.private: the first private key (%s) has no public half in %s.public: list it there too, so that it verifies", field, KeyID(pub), field)
	}
	k.sign, k.signID = priv, KeyID(pub)
	k.signer = Signer{Role: as.Role, Set: as.Set, KeyID: k.signID}
	if as.Role == RoleProxy {
		k.signer.Set = ""
	}
	return k, nil
}
