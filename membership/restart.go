package membership

import (
	"encoding/json"
	"errors"
	"fmt"
)

// RestartReplica is the user message a proxy's rolling restart sends to a
// replica's agent: stop the supervised process (SIGTERM, SIGKILL after
// supervise.stop_grace) and start it again, keeping the agent, its state
// and any operator drain it holds. Agents that supervise no process
// ignore it.
type RestartReplica struct {
	// Kind is always "restart_replica".
	Kind    string `json:"kind"`
	Set     string `json:"set"`
	Replica string `json:"replica"`
	// Boot names the agent incarnation it is for; another one ignores it.
	Boot int64  `json:"boot,omitempty"`
	By   string `json:"by"`
}

// RestartReplicaKind is the kind of a RestartReplica message.
const RestartReplicaKind = "restart_replica"

// Encode returns the message bytes.
func (r RestartReplica) Encode() []byte {
	r.Kind = RestartReplicaKind
	b, _ := json.Marshal(r)
	return b
}

// DecodeRestartReplica parses a message written by Encode.
func DecodeRestartReplica(b []byte) (RestartReplica, error) {
	var r RestartReplica
	if err := json.Unmarshal(b, &r); err != nil {
		return r, err
	}
	if r.Kind != RestartReplicaKind || r.Set == "" || r.Replica == "" {
		return r, errors.New("membership: not a restart_replica command")
	}
	return r, nil
}

// RestartReplica tells the newest alive incarnation of a replica's agent
// to restart its process. Errors wrap ErrNotAttached or ErrNotAdvertised.
func (d *Discovery) RestartReplica(set, replica string) error {
	d.mu.Lock()
	send, self := d.send, d.self
	target, ok := d.index.newestAlive(set, replica)
	d.mu.Unlock()
	if send == nil {
		return ErrNotAttached
	}
	if !ok {
		return fmt.Errorf("%w: %s/%s", ErrNotAdvertised, set, replica)
	}
	return send(target.Node, RestartReplica{Set: set, Replica: replica, Boot: target.Meta.Boot, By: self}.Encode())
}
