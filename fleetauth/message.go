package fleetauth

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strconv"
)

// Signed gossip messages. A keyway user message is one JSON object; a
// signed one carries its signature as one more member, last:
//
//	{"kind":"set_stop",…,"auth":"<key id>.<stamp>.<signature>"}
//
// so that a member of a version without signatures reads it as before
// (an unknown member is ignored) during a rolling upgrade. The signature
// covers the sender's and the receiver's gossip node names, the stamp
// (the sender's clock, Unix microseconds, unique per sender) and the
// object without the auth member: a message cannot be passed off as
// another sender's, sent on to another member, or replayed once its stamp
// is out of the receiver's window (Window).

// Domains: what a signature is over, part of the signed bytes, so that a
// signature of one kind of thing never verifies as another.
const (
	DomainMessage = "keyway/message/v1"
	DomainMeta    = "keyway/meta/v1"
)

var authMember = []byte(`"auth":"`)

// SignMessage returns body (a JSON object) with the auth member appended,
// signed for a message from the node from to the node to, stamped stamp.
// ok is false (and body is returned as is) when the keyring signs nothing
// or body is not a JSON object.
func (k *Keyring) SignMessage(from, to string, stamp int64, body []byte) ([]byte, bool) {
	if !k.CanSign() || len(body) < 2 || body[0] != '{' || body[len(body)-1] != '}' {
		return body, false
	}
	st := strconv.AppendInt(nil, stamp, 10)
	id, sig, _ := k.Sign(DomainMessage, []byte(from), []byte(to), st, body)
	out := make([]byte, 0, len(body)+len(authMember)+len(id)+len(st)+base64.RawURLEncoding.EncodedLen(len(sig))+6)
	out = append(out, body[:len(body)-1]...)
	if len(body) > 2 {
		out = append(out, ',')
	}
	out = append(out, authMember...)
	out = append(out, id...)
	out = append(out, '.')
	out = append(out, st...)
	out = append(out, '.')
	out = base64.RawURLEncoding.AppendEncode(out, sig)
	return append(out, '"', '}'), true
}

// Auth is a message's signature, split off by SplitMessage.
type Auth struct {
	KeyID string
	Stamp int64
	Sig   []byte
}

// ErrMalformedAuth is returned for an auth member that is not one
// SignMessage writes.
var ErrMalformedAuth = errors.New("malformed signature")

// SplitMessage splits a message into the object that was signed and its
// signature. signed is false for a message without an auth member (body
// is then msg).
func SplitMessage(msg []byte) (body []byte, a Auth, signed bool, err error) {
	if len(msg) < 2 || msg[len(msg)-1] != '}' || msg[len(msg)-2] != '"' {
		return msg, Auth{}, false, nil
	}
	i := bytes.LastIndex(msg, authMember)
	if i < 1 {
		return msg, Auth{}, false, nil
	}
	val := msg[i+len(authMember) : len(msg)-2]
	// The value is base64url and digits and dots only: anything else means
	// the last "auth": of the message is not the member SignMessage added.
	for _, c := range val {
		if !(c == '.' || c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return msg, Auth{}, false, nil
		}
	}
	switch msg[i-1] {
	case ',':
		body = append(bytes.Clone(msg[:i-1]), '}')
	case '{':
		body = append(bytes.Clone(msg[:i]), '}')
	default:
		return msg, Auth{}, false, nil
	}
	parts := bytes.Split(val, []byte{'.'})
	if len(parts) != 3 || len(parts[0]) != 2*KeyIDLen {
		return msg, Auth{}, true, ErrMalformedAuth
	}
	stamp, perr := strconv.ParseInt(string(parts[1]), 10, 64)
	sig, derr := base64.RawURLEncoding.DecodeString(string(parts[2]))
	if perr != nil || derr != nil {
		return msg, Auth{}, true, ErrMalformedAuth
	}
	return body, Auth{KeyID: string(parts[0]), Stamp: stamp, Sig: sig}, true, nil
}

// VerifyMessage verifies a message's signature (split by SplitMessage),
// sent by from to to, and says whose key signed it.
func (k *Keyring) VerifyMessage(from, to string, body []byte, a Auth) (Signer, error) {
	return k.Verify(a.KeyID, a.Sig, DomainMessage, []byte(from), []byte(to), strconv.AppendInt(nil, a.Stamp, 10), body)
}
