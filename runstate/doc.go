// Package runstate holds the fleet's run-time state: what operators change
// through a proxy's admin API while keyway runs (a replica set created,
// deleted, stopped, started, its declared count changed; a rolling
// restart's progress), replicated to every proxy of the gossip cluster so
// that the fleet serves one catalog. Package membership carries its
// messages (signed with the proxy key and verified before they reach the
// handlers registered by Attach); membership does not import runstate.
//
// It is a last-writer-wins map of records, one per set and one per set's
// rolling restart (Key). A write takes the next version of a hybrid
// logical clock (see MaxAhead), and of two records of one key the higher
// (version, origin, time) wins on every proxy, whatever order they arrive
// in. Proxies compare a digest of their records every interval (one small
// UDP message to each other proxy); on a difference they send each other
// their records (TCP when large) and merge. So a proxy that restarts, or
// joins later, learns the state from any other within about one interval,
// and a write reaches every proxy alive then at once. Deleted sets stay as
// tombstones, so that a peer that missed the delete cannot bring the set
// back. With a state directory the records are also written to disk on
// every change (runtime.json, replaced atomically) and read at start: the
// state then survives a restart of every proxy.
//
// The wire forms and the state file are those of the previous version
// (a restart record keyed "restart:" + set, file format 1), so that a
// fleet can be upgraded one proxy at a time and downgraded again.
package runstate
