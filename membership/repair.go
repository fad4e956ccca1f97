package membership

import (
	"encoding/json"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"keyway/balancer"
)

// Repair is the user message that revives a replica set: every agent of
// the set whose supervised replica gave up (advertises failed) resets its
// restart budget and starts it again, and every proxy lifts its own
// supervision holds on the set's replicas, so that a repaired replica
// comes back into rotation. Any proxy's admin API sends it, to the set's
// agents and to the other proxies.
type Repair struct {
	// Kind is always "repair".
	Kind string `json:"kind"`
	Set  string `json:"set"`
	// By is the fleet ID of the proxy that sent it.
	By string `json:"by"`
}

// RepairKind is the kind of a Repair message.
const RepairKind = "repair"

// Encode returns the message bytes.
func (r Repair) Encode() []byte {
	r.Kind = RepairKind
	b, _ := json.Marshal(r)
	return b
}

// DecodeRepair parses a message written by Encode.
func DecodeRepair(b []byte) (Repair, error) {
	var r Repair
	if err := json.Unmarshal(b, &r); err != nil {
		return r, err
	}
	if r.Kind != RepairKind || r.Set == "" {
		return r, errors.New("membership: not a repair command")
	}
	return r, nil
}

// RepairResult says whom a repair reached.
type RepairResult struct {
	// Agents are the gossip nodes of the set's replicas told (the newest
	// alive incarnation of each); Failed those among them advertising
	// failed.
	Agents, Failed []string
	// Proxies counts the other proxies told.
	Proxies int
}

// Repair sends a Repair of set to the newest alive incarnation of each of
// the set's replicas and to every other alive proxy (best effort; a lost
// message is repaired by asking again). It errors wrapping ErrNotAttached
// before a Node is attached and ErrNotAdvertised when no alive member
// advertises a replica of the set. The caller lifts this proxy's own holds.
func (d *Discovery) Repair(set string) (RepairResult, error) {
	d.mu.Lock()
	send, self := d.send, d.self
	var targets []Member
	for k, in := range d.index {
		if k[0] == set && in.hasAlive {
			targets = append(targets, in.newest)
		}
	}
	d.mu.Unlock()
	if send == nil {
		return RepairResult{}, ErrNotAttached
	}
	if len(targets) == 0 {
		return RepairResult{}, fmt.Errorf("%w: no replica of %s", ErrNotAdvertised, set)
	}
	msg := Repair{Set: set, By: self}.Encode()
	var res RepairResult
	for _, m := range targets {
		if err := send(m.Node, msg); err != nil {
			d.log.Debug("repair not sent to an agent", zap.String("node", m.Node), zap.Error(err))
			continue
		}
		res.Agents = append(res.Agents, m.Node)
		if m.Meta.State == balancer.StateFailed {
			res.Failed = append(res.Failed, m.Node)
		}
	}
	res.Proxies = d.tellProxies(send, msg)
	return res, nil
}
