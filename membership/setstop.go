package membership

import (
	"encoding/json"
	"errors"
)

// SetStop is the user message that stops (Stop true) or starts a replica
// set's replicas, sent by proxies to the set's agents. An agent that gets
// Stop true drains its replica (as at shutdown: draining, then every
// proxy's report that nothing is in flight, drain.quiet, the drain probe),
// stops its supervised process, advertises stopped with Meta.SetStopped,
// and keeps running; Stop false starts the process again (or, without
// one, lets the probes decide) and clears SetStopped. Proxies send it
// again, every report interval, to every agent whose SetStopped differs
// from the set's run-time state, so that a lost message, an agent
// restarted meanwhile or one that joins later ends up as the set wants.
type SetStop struct {
	// Kind is always "set_stop".
	Kind string `json:"kind"`
	Set  string `json:"set"`
	Stop bool   `json:"stop"`
	// Version is the version of the set's run-time state the command
	// comes from. An agent ignores a command older than the newest it has
	// applied (a proxy that has not learnt a newer state yet).
	Version uint64 `json:"version"`
	// By is the gossip node name of the proxy that sent it.
	By string `json:"by"`
}

// SetStopKind is the kind of a SetStop message.
const SetStopKind = "set_stop"

// Encode returns the message bytes.
func (c SetStop) Encode() []byte {
	c.Kind = SetStopKind
	b, _ := json.Marshal(c)
	return b
}

// DecodeSetStop parses a message written by Encode.
func DecodeSetStop(b []byte) (SetStop, error) {
	var c SetStop
	if err := json.Unmarshal(b, &c); err != nil {
		return c, err
	}
	if c.Kind != SetStopKind || c.Set == "" {
		return c, errors.New("membership: not a set stop command")
	}
	return c, nil
}
