// Package eventlog is keyway's audit trail: an append-only record of what
// happened to the members, replicas and replica sets a node sees — joins,
// leaves, state changes, probe transitions, ejections and their reason,
// ring rebuilds with moved-partition counts, rotation and phase changes,
// admin actions — one JSON object per line.
//
// # Files
//
// A [Log] for node NODE with Config.Dir DIR writes
//
//	DIR/NODE/events-000001.jsonl
//	DIR/NODE/events-000002.jsonl
//	...
//
// NODE is the node name made safe for a file name ([NodeDir]). A file is
// closed when the next line would take it past Config.MaxFileBytes and the
// next number starts; beyond Config.Retain files the oldest are deleted. A
// restarted node continues after the highest number it finds. The line
// format is [Event.MarshalJSON]'s; [ReadFile] and [ReadDir] read it back.
// docs/audit.md is the operator's guide and the catalogue of kinds.
//
// # Best effort
//
// [Log.Emit] never waits for I/O: it keeps the event in memory (for
// [Log.Recent], the admin API's GET /v1/events) and hands it to a bounded
// queue. One goroutine, [Log.Run], writes the queue to the files. A full
// queue or a failing disk loses events to the file — counted in
// keyway_audit_dropped_total and keyway_audit_write_errors_total, warned
// about at most once per 10 s per kind of failure — and nothing else:
// events keep reaching memory, and the routing that emits them never
// blocks on the disk.
//
// # Concurrency
//
// Emit, Record, Recent and Flush may be called from any goroutine, at any
// time, also before Run starts (events queue until the queue is full) and
// after it returned. Run is the only goroutine that touches the files.
// Emit keeps the Fields map it is given: callers build a new map per
// event and do not modify it afterwards.
package eventlog
