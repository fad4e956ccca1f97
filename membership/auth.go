package membership

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"keyway/fleetauth"
)

// Trust inside the fleet. The gossip key keeps strangers out; every
// member holds it. What a member says that changes state elsewhere is
// signed (package fleetauth) and checked here, once, for every user:
//
//   - A member's metadata is its claim to a role: a proxy's is signed
//     with the proxy key, a replica's with its set's agent key (and names
//     the gossip node, so that it cannot be advertised by another). A
//     claim that does not verify is not believed: the member stays listed
//     (it is alive) with role unknown, so that nothing routes to it,
//     counts it as a proxy or obeys it, and Member.Refused says why.
//   - User messages go through one decoder (dispatch): it reads the kind
//     once, verifies the signature against the role the kind's handler
//     accepts, refuses a stamp outside the window or seen before (a
//     replay), and hands the message to the handler registered for the
//     kind.
//
// Refusals are counted in keyway_gossip_rejected_total{reason}, logged,
// and reported (Options.OnReject) at most once per sender and reason per
// minute.

// Reasons of refusals, the values of keyway_gossip_rejected_total's
// reason label (besides the transport's decrypt, label and other).
const (
	RejectUnsigned      = "unsigned"       // no signature where one is required
	RejectBadSignature  = "bad_signature"  // a signature that does not verify
	RejectUnknownKey    = "unknown_key"    // signed by a key this node does not know
	RejectWrongKey      = "wrong_key"      // a valid signature by a key of another role or set
	RejectStale         = "stale"          // a stamp older than the window
	RejectFuture        = "future"         // a stamp ahead of the window
	RejectReplay        = "replay"         // a message seen before
	RejectNotProxy      = "not_proxy"      // unsigned, from a member that is not a proxy (signatures optional)
	RejectUnknownKind   = "unknown_kind"   // no handler for the kind on this node
	RejectClaimConflict = "claim_conflict" // a second live claim to a replica name
)

// authRejectReasons are the reasons counted from the start (at 0).
var authRejectReasons = []string{RejectUnsigned, RejectBadSignature, RejectUnknownKey, RejectWrongKey, RejectStale,
	RejectFuture, RejectReplay, RejectNotProxy, RejectUnknownKind, RejectClaimConflict}

// Window bounds a signed message's stamp against the receiver's clock,
// both ways: a message is fresh for Window after it is stamped, and one
// stamped more than Window ahead is refused. Members' clocks must agree
// within it (NTP keeps them within milliseconds); the receiver remembers
// every message it accepted for as long, so a replay is refused.
const Window = time.Minute

// Rejection is one refused message or claim, for the audit trail.
type Rejection struct {
	// Node is the sender's gossip node name (as the message or member
	// names itself), Addr its gossip address when known.
	Node string
	Addr string
	// What was refused: a message kind, or "claim" (gossip metadata).
	What   string
	Reason string
	// Detail says more, for people.
	Detail string
	// Count is how many refusals of this sender and reason there were
	// since the last report (1 or more).
	Count int
}

// Message is a user message that passed the decoder.
type Message struct {
	// From is the sender's gossip node name.
	From string
	Kind string
	// Body is the message without its signature.
	Body []byte
	// Signer is whose key signed it; Role none when signatures are
	// optional and it came unsigned from a member of an older version,
	// or this node holds no credentials (loopback).
	Signer fleetauth.Signer
}

// Handler takes the messages of one kind. It is called from the node's
// message worker, serialized, never from memberlist's packet loop.
type Handler func(Message)

type handlerEntry struct {
	from Role // RoleProxy: the proxy key; RoleReplica: an agent key
	h    Handler
}

// Handle registers the handler of a message kind, accepting it from
// members of role from only: RoleProxy (signed with the proxy key) or
// RoleReplica (signed with an agent key; the handler checks the set
// against Message.Signer.Set). Register every kind before Run; a message
// of a kind without a handler is refused.
func (n *Node) Handle(kind string, from Role, h Handler) {
	n.hmu.Lock()
	defer n.hmu.Unlock()
	n.handlers[kind] = handlerEntry{from: from, h: h}
}

// Verifies reports whether this node checks signatures (it holds
// credentials), and Requires whether it refuses unsigned messages and
// claims.
func (n *Node) Verifies() bool { return n.keyring() != nil }
func (n *Node) Requires() bool { a := n.auth.Load(); return a.k != nil && a.required }

// authState is what the node signs and checks with; Reauthenticate
// replaces it whole.
type authState struct {
	k        *fleetauth.Keyring // nil: signs and checks nothing
	required bool               // unsigned messages and claims are refused
}

func (n *Node) keyring() *fleetauth.Keyring { return n.auth.Load().k }

// PrepareAuth reads cfg's credentials (CredentialsFile, Signatures) for
// this node's role and returns the function that installs them, or why
// they cannot be: a configuration reload checks every change first and
// installs once nothing can refuse it. Installing re-checks every
// member's claim with the new keys and advertises this node's metadata
// signed with the new first key (rotation).
func (n *Node) PrepareAuth(cfg Config) (install func(), err error) {
	self := n.Meta()
	k, err := cfg.keyring(self.Role, self.Set, nil)
	if err != nil {
		return nil, err
	}
	return func() {
		next := &authState{k: k, required: cfg.Signatures != SignaturesOptional}
		n.auth.Store(next)
		n.log.Info("gossip credentials read", zap.String("signs_with", next.k.Self().String()),
			zap.Bool("signatures_required", next.k != nil && next.required), zap.Strings("agent_key_sets", next.k.Sets()))
		n.recheckClaims()
		if err := n.UpdateMeta(func(*Meta) {}, time.Second); err != nil {
			n.log.Warn("gossip metadata not advertised with the new credentials yet", zap.Error(err))
		}
	}, nil
}

// recheckClaims checks every known member's claim again (new keys).
func (n *Node) recheckClaims() {
	type refusedClaim struct{ node, reason, detail string }
	var refused []refusedClaim
	n.mu.Lock()
	for name, v := range n.claims {
		v.reason, v.detail = n.claimCheck(name, v.raw, v.meta)
		v.legacy = v.reason == "" && n.Verifies() && !metaSigned(v.raw)
		n.claims[name] = v
		if m, ok := n.members[name]; ok {
			if m.Status == StatusAlive {
				m.Meta = v.meta
			}
			m.Meta.Role, m.Refused, m.Legacy = v.meta.Role, v.reason, v.legacy
			if v.reason != "" {
				m.Meta.Role = RoleUnknown
				refused = append(refused, refusedClaim{name, v.reason, v.detail})
			}
		}
	}
	n.mu.Unlock()
	for _, r := range refused {
		n.refuse(r.node, "claim", r.reason, r.detail)
	}
	n.signal()
}

// keyring builds the node's keyring: from creds when given, else from
// CredentialsFile; nil (sign and check nothing) with neither, which only
// gossip on loopback or an insecure network may do.
func (c Config) keyring(role Role, set string, creds *fleetauth.Credentials) (*fleetauth.Keyring, error) {
	if creds == nil && c.CredentialsFile != "" {
		cr, err := fleetauth.Load(c.CredentialsFile)
		if err != nil {
			return nil, fmt.Errorf("credentials_file: %w", err)
		}
		creds = &cr
	}
	if creds == nil {
		if c.Insecure {
			return nil, nil
		}
		if field, addr, off := c.offLoopback(); off {
			return nil, fmt.Errorf("credentials_file: gossip on %s %q, off loopback, needs the fleet's credentials: "+
				"every member holds the gossip key, so without them any member could stop sets, command agents and claim replicas; "+
				"make them with: keyway keys --sets <set,…> --out DIR, and set gossip.credentials_file to the file for this %s", field, addr, role)
		}
		return nil, nil
	}
	as := fleetauth.As{Role: fleetauth.RoleProxy}
	if role == RoleReplica {
		as = fleetauth.As{Role: fleetauth.RoleAgent, Set: set}
	}
	k, err := creds.Keyring(as)
	if err != nil {
		if c.CredentialsFile != "" {
			return nil, fmt.Errorf("credentials_file: %s: %w", c.CredentialsFile, err)
		}
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return k, nil
}

// CheckCredentials applies New's credential rules to c for a node of
// role (and set, for a replica's agent) without building one, for
// configuration loading: the file must hold this role's private key, and
// gossip off loopback needs one unless Insecure is set. Each error starts
// with "credentials_file: ".
func (c Config) CheckCredentials(role Role, set string) error {
	_, err := c.keyring(role, set, nil)
	return err
}

// The signed metadata: the encoding with the id field always present,
// then metaSigMark, the key ID (8 bytes) and the signature (64 bytes),
// over the node name and everything before the mark. A version-1 decoder
// without signatures ignores it (bytes after the fields it knows).
const (
	metaSigMark = 0x01
	metaSigLen  = 1 + fleetauth.KeyIDLen + 64
)

// signMeta returns m's encoding signed for the gossip node name, or the
// plain encoding when the node signs nothing. When it does not fit in
// MetaMaxSize, a proxy's fingerprints (one per set it serves; the fleet
// exchange carries each set's digest too, signed) give way to a digest
// of them all: proxies then compare their routing through the fleet
// exchange only.
func (n *Node) signMeta(name string, m Meta) ([]byte, error) {
	k := n.keyring()
	signs, extra := k.CanSign(), 0
	if signs {
		extra = metaSigLen
	}
	b, err := m.encode(signs)
	if (err != nil || len(b)+extra > MetaMaxSize) && m.Fingerprint != "" {
		m.Fingerprint = fingerprintDigest(m.Fingerprint)
		b, err = m.encode(signs)
	}
	if err != nil {
		return nil, err
	}
	if !signs {
		return b, nil
	}
	if len(b)+extra > MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes with the signature; shorten the names, address or id", ErrMetaSize, len(b)+extra)
	}
	id, sig, _ := k.Sign(fleetauth.DomainMeta, []byte(name), b)
	raw, _ := hex.DecodeString(id)
	b = append(b, metaSigMark)
	b = append(b, raw...)
	return append(b, sig...), nil
}

// claimCheck says whether a member's metadata is believed: "" when it is,
// else the reason (a Reject constant) and a detail.
func (n *Node) claimCheck(name string, raw []byte, m Meta) (reason, detail string) {
	k := n.keyring()
	if k == nil {
		return "", ""
	}
	end, err := metaEnd(raw)
	if err != nil {
		return RejectBadSignature, err.Error()
	}
	rest := raw[end:]
	if len(rest) < metaSigLen || rest[0] != metaSigMark {
		if !n.Requires() {
			return "", ""
		}
		return RejectUnsigned, fmt.Sprintf("%s claims role %s without a signature", name, m.Role)
	}
	signer, err := k.Verify(hex.EncodeToString(rest[1:1+fleetauth.KeyIDLen]), rest[1+fleetauth.KeyIDLen:metaSigLen],
		fleetauth.DomainMeta, []byte(name), raw[:end])
	switch {
	case errors.Is(err, fleetauth.ErrUnknownKey):
		return RejectUnknownKey, fmt.Sprintf("%s claims role %s with a key this node does not know", name, m.Role)
	case err != nil:
		return RejectBadSignature, fmt.Sprintf("%s claims role %s with a signature that does not verify", name, m.Role)
	}
	switch {
	case m.Role == RoleProxy && signer.Role == fleetauth.RoleProxy:
		return "", ""
	case m.Role == RoleReplica && signer.Role == fleetauth.RoleAgent && signer.Set == m.Set:
		return "", ""
	}
	return RejectWrongKey, fmt.Sprintf("%s claims role %s (set %q) signed with the %s", name, m.Role, m.Set, signer)
}

// metaSigned reports whether encoded metadata carries a signature.
func metaSigned(raw []byte) bool {
	end, err := metaEnd(raw)
	return err == nil && len(raw)-end >= metaSigLen && raw[end] == metaSigMark
}

// stamp returns a message stamp: the clock in microseconds, unique for
// this node (never the same twice, even within one microsecond).
func (n *Node) stamp() int64 {
	now := n.now().UnixMicro()
	for {
		last := n.lastStamp.Load()
		next := max(now, last+1)
		if n.lastStamp.CompareAndSwap(last, next) {
			return next
		}
	}
}

// seal signs a message to the node to; unsigned when this node signs
// nothing.
func (n *Node) seal(to string, msg []byte) []byte {
	out, _ := n.keyring().SignMessage(n.Name(), to, n.stamp(), msg)
	return out
}

// replays remembers the messages accepted within the window, by sender
// and stamp (unique per sender), to refuse a second delivery.
type replays struct {
	mu   sync.Mutex
	seen map[replayKey]time.Time
	next time.Time // when to drop expired entries next
}

type replayKey struct {
	from  string
	stamp int64
}

// first records (from, stamp) and reports whether it is new.
func (r *replays) first(from string, stamp int64, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[replayKey]time.Time{}
	}
	if now.After(r.next) {
		for k, t := range r.seen {
			if now.Sub(t) > 2*Window {
				delete(r.seen, k)
			}
		}
		r.next = now.Add(Window / 4)
	}
	k := replayKey{from, stamp}
	if _, ok := r.seen[k]; ok {
		return false
	}
	r.seen[k] = now
	return true
}

// dispatch is the one decoder of user messages (see the top of the file).
func (n *Node) dispatch(from string, msg []byte) {
	body, a, signed, err := fleetauth.SplitMessage(msg)
	kind := MessageKind(body)
	if err != nil {
		n.refuse(from, kind, RejectBadSignature, err.Error())
		return
	}
	n.hmu.Lock()
	e, ok := n.handlers[kind]
	n.hmu.Unlock()
	if !ok {
		n.metrics.rejected.WithLabelValues(RejectUnknownKind).Inc()
		n.log.Debug("gossip message of a kind this node does not take", zap.String("from", from), zap.String("kind", kind))
		return
	}
	m := Message{From: from, Kind: kind, Body: body}
	switch {
	case signed && n.keyring() != nil:
		signer, reason, detail := n.verifyMessage(from, body, a)
		if reason != "" {
			n.refuse(from, kind, reason, detail)
			return
		}
		want := fleetauth.RoleProxy
		if e.from == RoleReplica {
			want = fleetauth.RoleAgent
		}
		if signer.Role != want {
			n.refuse(from, kind, RejectWrongKey, fmt.Sprintf("a %s message takes the %s key, signed with the %s", kind, want, signer))
			return
		}
		m.Signer = signer
	case n.Requires():
		n.refuse(from, kind, RejectUnsigned, "a "+kind+" message without a signature")
		return
	default:
		// Signatures optional, or no credentials here: believe the sender's
		// metadata, as a version without signatures did.
		if reason := n.legacySender(from, e.from); reason != "" {
			n.refuse(from, kind, reason, fmt.Sprintf("an unsigned %s message from a member that is not an alive %s", kind, e.from))
			return
		}
	}
	e.h(m)
}

// verifyMessage checks a signed message's signature and stamp.
func (n *Node) verifyMessage(from string, body []byte, a fleetauth.Auth) (fleetauth.Signer, string, string) {
	k := n.keyring()
	signer, err := k.VerifyMessage(from, n.Name(), body, a)
	if errors.Is(err, fleetauth.ErrBadSignature) {
		// Sent to this process's member before it moved (MoveTo)?
		n.mu.Lock()
		former := make([]string, 0, len(n.former))
		for f := range n.former {
			former = append(former, f)
		}
		n.mu.Unlock()
		for _, f := range former {
			if s, ferr := k.VerifyMessage(from, f, body, a); ferr == nil {
				signer, err = s, nil
				break
			}
		}
	}
	switch {
	case errors.Is(err, fleetauth.ErrUnknownKey):
		return signer, RejectUnknownKey, "signed with key " + a.KeyID + ", which this node does not know"
	case err != nil:
		return signer, RejectBadSignature, "a signature that does not verify (forged, altered, or sent to another member)"
	}
	now := n.now()
	at := time.UnixMicro(a.Stamp)
	switch {
	case at.After(now.Add(Window)):
		return signer, RejectFuture, fmt.Sprintf("stamped %s ahead of this node's clock: the sender's clock is ahead, or the message is forged", at.Sub(now).Round(time.Millisecond))
	case now.Sub(at) > Window:
		return signer, RejectStale, fmt.Sprintf("stamped %s ago: a replay, or the sender's clock is behind", now.Sub(at).Round(time.Millisecond))
	}
	if !n.replays.first(from, a.Stamp, now) {
		return signer, RejectReplay, "a message this node has already taken"
	}
	return signer, "", ""
}

// legacySender is the check of a version without signatures: an alive
// member of that name whose metadata says the role.
func (n *Node) legacySender(from string, role Role) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.members[from]
	if !ok || m.Status != StatusAlive {
		return RejectUnknownKey
	}
	if m.Meta.Role != role {
		return RejectNotProxy
	}
	return ""
}

// refuse counts, logs and reports a refused message or claim: the count
// always, the log line and the report once per sender, reason and minute.
func (n *Node) refuse(from, what, reason, detail string) {
	n.metrics.rejected.WithLabelValues(reason).Inc()
	now := n.now()
	k := rejectKey{reason: reason, host: from}
	n.rmu.Lock()
	l := n.rlimits[k]
	if l == nil {
		if len(n.rlimits) >= maxRefusals {
			for k, v := range n.rlimits {
				if now.Sub(v.last) > time.Minute {
					delete(n.rlimits, k)
				}
			}
		}
		l = &refusal{}
		n.rlimits[k] = l
	}
	l.skipped++
	report := l.last.IsZero() || now.Sub(l.last) >= time.Minute
	count := l.skipped
	if report {
		l.last, l.skipped = now, 0
	}
	n.rmu.Unlock()
	if !report {
		return
	}
	addr := ""
	n.mu.Lock()
	if m, ok := n.members[from]; ok {
		addr = m.Gossip
	}
	n.mu.Unlock()
	n.log.Warn("gossip: refused a message or claim that is not authenticated for its role",
		zap.String("from", from), zap.String("addr", addr), zap.String("what", what), zap.String("reason", reason),
		zap.String("detail", detail), zap.Int("count", count))
	if n.opts.OnReject != nil {
		n.opts.OnReject(Rejection{Node: from, Addr: addr, What: what, Reason: reason, Detail: detail, Count: count})
	}
}

// fingerprintDigest stands for a fingerprint list too long for signed
// metadata: "#" and 16 hex digits, which names no set.
func fingerprintDigest(fp string) string {
	return "#" + hex.EncodeToString(sum8([]byte(fp)))
}

func sum8(b []byte) []byte {
	h := sha256.Sum256(b)
	return h[:8]
}

// refusal is one (sender, reason)'s report limit.
type refusal struct {
	last    time.Time // the last report
	skipped int       // refusals since, not reported
}

// maxRefusals bounds the (reason, sender) pairs remembered for limiting.
const maxRefusals = 1024

// alarmConflicts reports every claim that became a refused second claim
// to a live replica name since the last snapshot; emit calls it.
func (n *Node) alarmConflicts(ms []Member) {
	byNode := map[string]Member{}
	for _, m := range ms {
		byNode[m.Node] = m
	}
	now := map[string]bool{}
	for _, m := range ms {
		if m.Refused != RejectClaimConflict {
			continue
		}
		now[m.Node] = true
		if n.conflicted[m.Node] {
			continue
		}
		holder := ""
		for _, h := range ms {
			if h.Meta.Role == RoleReplica && h.Status == StatusAlive && h.Meta.Replica == m.Meta.Replica && h.Meta.Set == m.Meta.Set {
				holder = h.Node + " at " + h.Meta.Addr
			}
		}
		n.refuse(m.Node, "claim", RejectClaimConflict, fmt.Sprintf("%s claims replica %s of set %s at %s while %s holds it: refused until that one is gone",
			m.Node, m.Meta.Replica, m.Meta.Set, m.Meta.Addr, holder))
	}
	n.conflicted = now
}
