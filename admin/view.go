package admin

import (
	"errors"
	"time"
)

// This file holds what the read API needs from the rest of keyway: small
// interfaces the admin package defines as their consumer, so that each is
// easy to serve and to fake in a test, and nothing here depends on how the
// components are built. The answers' types are in types.go. server adapts
// the proxy, the health checker, gossip and the audit trail to these
// interfaces.

// SetView answers for the replica sets this proxy routes. Implementations
// must be safe for concurrent use: every admin request calls them from its
// own goroutine.
type SetView interface {
	// Sets returns every configured replica set, in configuration order,
	// each with its replicas. The caller owns the returned slices.
	Sets() []SetStatus
	// Set returns one replica set with its replicas, or ok false when no
	// set has that name.
	Set(name string) (SetStatus, bool)
	// Route explains where a key (as an X-Key header value would carry it)
	// goes now. It returns an error wrapping [ErrUnknownSet] when no set has
	// that name.
	Route(set, key string) (RouteExplain, error)
}

// MemberLister lists the gossip cluster's members as this node sees them,
// itself included. It returns an empty slice, not an error, when gossip is
// off. Safe for concurrent use.
type MemberLister interface {
	Members() []MemberInfo
}

// EventQuery selects audit events (GET /v1/events): the zero value
// (with Partition -1) selects every event.
type EventQuery struct {
	// Since and Until bound the times (zero: no bound; Until exclusive).
	Since, Until time.Time
	// Kinds keeps these kinds (empty: all).
	Kinds []string
	// Sets keeps these sets ("" the events of none; empty: all).
	Sets []string
	// Replica keeps the events of a replica, and the ring and rotation
	// changes that moved it.
	Replica string
	// Partition (≥ 0) or Key keep what concerns one partition of the one
	// set of Sets: the changes that moved it, the events of the replicas
	// that owned or took it, the set's own events.
	Partition int
	Key       string
	// Limit keeps the newest Limit (0: all).
	Limit int
}

// EventSource returns recent audit events, oldest first, that q selects.
// Each element must encode as one JSON object. A query it cannot answer
// (a partition without its set) is an error naming the parameter. Safe
// for concurrent use.
type EventSource interface {
	Events(q EventQuery) ([]any, error)
}

// FleetSource reports how this proxy's routing compares with the other
// proxies' (GET /v1/fleet). Safe for concurrent use.
type FleetSource interface {
	Fleet() FleetStatus
}

// ConfigSource returns the effective configuration with secrets redacted,
// as a value that encodes to JSON. Safe for concurrent use.
type ConfigSource interface {
	Config() any
}

// ErrUnknownSet is returned (wrapped) by [SetView.Route] for a set name that
// is not configured; the API answers it with 404.
var ErrUnknownSet = errors.New("unknown replica set")
