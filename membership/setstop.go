package membership

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"
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
	// Version is the version of the set's run-time record the command
	// comes from (package runstate: a hybrid logical clock, which never
	// starts again from 0), 0 when the set has none (the configuration
	// file alone). An agent ignores a command older than the newest it
	// has applied (a proxy that has not learnt a newer state yet).
	Version uint64 `json:"version"`
	// By is the fleet ID of the proxy that sent it.
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

// SetWant is what a proxy wants of a set's agents: stopped or not, from
// the set's run-time state of that version (0: the configuration file's
// stopped key alone).
type SetWant struct {
	Stop    bool
	Version uint64
}

// setStopResend is how often one agent is told again while it does not
// advertise what its set wants.
const setStopResend = time.Second

// SetWants replaces what this proxy wants of each set's agents (every set
// it serves; sets left out are left alone: a deleted set's agents stay as
// they are). Report then tells every alive agent whose Meta.SetStopped
// differs, at most every second per agent, until it advertises the
// wanted state.
func (d *Discovery) SetWants(wants map[string]SetWant) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !maps.Equal(d.wants, wants) {
		clear(d.stopSent) // a new want goes out at the next report
	}
	d.wants = maps.Clone(wants)
}

// tellSetStops sends SetStop to the agents that do not advertise what
// their set wants; called by report.
func (d *Discovery) tellSetStops() {
	now := d.now()
	type cmd struct {
		node string
		msg  SetStop
	}
	var cmds []cmd
	d.mu.Lock()
	send := d.send
	for _, m := range d.members {
		if m.Meta.Role != RoleReplica || m.Status != StatusAlive {
			continue
		}
		w, ok := d.wants[m.Meta.Set]
		if !ok || m.Meta.SetStopped == w.Stop {
			continue
		}
		if last, sent := d.stopSent[m.Node]; sent && now.Sub(last) < setStopResend {
			continue
		}
		d.stopSent[m.Node] = now
		cmds = append(cmds, cmd{m.Node, SetStop{Set: m.Meta.Set, Stop: w.Stop, Version: w.Version, By: d.self}})
	}
	for node := range d.stopSent {
		if !slices.ContainsFunc(d.members, func(m Member) bool { return m.Node == node && m.Status == StatusAlive }) {
			delete(d.stopSent, node)
		}
	}
	d.mu.Unlock()
	if send == nil {
		return
	}
	for _, c := range cmds {
		if err := send(c.node, c.msg.Encode()); err != nil {
			d.log.Debug("set stop command not sent", zap.String("node", c.node), zap.Error(err))
			continue
		}
		d.log.Debug("set stop command sent", zap.String("node", c.node), zap.String("set", c.msg.Set), zap.Bool("stop", c.msg.Stop), zap.Uint64("version", c.msg.Version))
	}
}
