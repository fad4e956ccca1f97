// Package balancer is keyway's routing core: the shared vocabulary
// ([Replica], [State]), key extraction and hashing, the consistent-hash
// ring, the immutable routing [Table] and the [Router] that publishes it.
//
// It imports nothing else of keyway's, no memberlist and no fasthttp, so the
// hot path and its benchmarks carry no control-plane goroutines.
//
// # Model
//
// A replica set's keys are hashed with xxhash into a fixed number of
// partitions (hash % partitions). Partitions, not keys, are assigned to the
// replicas of the ring with consistent hashing and bounded loads
// (github.com/buraksezer/consistent v1.1.0). For every partition the table
// also keeps the order in which the other replicas follow the owner along the
// virtual-node ring; a key whose owner is out of rotation goes to the first
// in-rotation replica of that order, so every proxy computes the same
// stand-in and no other key moves.
//
// The ring changes only when replicas join (first time ready) or leave for
// good. Rotation — the part of the ring that may take traffic right now —
// changes with lifecycle states and health, and never rebuilds the ring.
//
// See DESIGN.md in this folder for the table layout and the snapshot
// lifecycle.
package balancer
