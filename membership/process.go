package membership

import (
	"encoding/json"
	"errors"
)

// ProcessEvent is the user message an agent that supervises its replica's
// process (`keyway agent … -- CMD`) sends to every alive proxy when the
// process starts, exits, is about to be restarted, is given up on, or is
// repaired, so that each proxy writes it to its audit trail. It is best
// effort: one UDP packet per proxy, never retried; a lost message is a
// missing audit line and nothing else.
type ProcessEvent struct {
	// Kind is always "replica_process"; other kinds are ignored.
	Kind    string `json:"kind"`
	Set     string `json:"set"`
	Replica string `json:"replica"`
	// Boot identifies the agent's incarnation (Meta.Boot).
	Boot int64 `json:"boot"`
	// Seq numbers the agent's events from 1, per boot. Messages may
	// arrive out of order (memberlist hands queued packets over newest
	// first); Seq restores it.
	Seq uint64 `json:"seq"`
	// Event is start, exit, restart, give_up or repair.
	Event string `json:"event"`
	// Pid is the process ID (start, exit).
	Pid int `json:"pid,omitempty"`
	// Reason says how an exit came about: exit_code, signal, stop (the
	// agent stopped it) or start_error (it could not be started).
	Reason string `json:"reason,omitempty"`
	// Code is the exit code of an exit without a signal.
	Code int `json:"code,omitempty"`
	// Signal names the signal that ended the process ("SIGKILL").
	Signal string `json:"signal,omitempty"`
	// Error is why the command could not be started (start_error),
	// truncated to 200 bytes.
	Error string `json:"error,omitempty"`
	// Restarts counts the restarts within supervise.window: made so far
	// (exit, give_up), or including the one scheduled (restart).
	Restarts int `json:"restarts,omitempty"`
	// BackoffMS is the delay before a scheduled restart, in milliseconds.
	BackoffMS int64 `json:"backoff_ms,omitempty"`
}

// ProcessEventKind is the "kind" of a ProcessEvent message, and the audit
// trail kind proxies record it under.
const ProcessEventKind = "replica_process"

// maxProcessError bounds ProcessEvent.Error so that a message fits in one
// gossip packet.
const maxProcessError = 200

// Encode returns the message bytes.
func (e ProcessEvent) Encode() []byte {
	e.Kind = ProcessEventKind
	if len(e.Error) > maxProcessError {
		e.Error = e.Error[:maxProcessError]
	}
	b, _ := json.Marshal(e)
	return b
}

// ErrNotProcessEvent is returned for a message of another kind.
var ErrNotProcessEvent = errors.New("membership: not a replica process event")

// DecodeProcessEvent parses a message written by Encode.
func DecodeProcessEvent(b []byte) (ProcessEvent, error) {
	var e ProcessEvent
	if err := json.Unmarshal(b, &e); err != nil {
		return e, err
	}
	if e.Kind != ProcessEventKind {
		return e, ErrNotProcessEvent
	}
	return e, nil
}
