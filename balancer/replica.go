package balancer

import "fmt"

// State is a replica's lifecycle state, as its agent advertises it (or
// [StateReady] for a static replica). Only ready replicas are in rotation,
// and a replica joins the ring the first time it is ready.
type State uint8

// Lifecycle states. The zero value is StateUnknown, which is never routable.
const (
	StateUnknown    State = iota
	StateStarting         // process up, not yet ready: out of rotation, not yet in the ring
	StateReady            // serving: in rotation unless a health check excludes it
	StateDraining         // finishing in-flight work: no new requests
	StateRecovering       // readiness lost (e.g. replaying a checkpoint): out of rotation, keeps its partitions
	StateStopped          // stopped for good or for a restart: out of rotation
	StateFailed           // gave up (too many restarts): out of rotation
)

var stateNames = [...]string{"unknown", "starting", "ready", "draining", "recovering", "stopped", "failed"}

// String returns the state's lower-case name, as used in config, metadata and metrics.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseState parses a state name as returned by [State.String].
func ParseState(s string) (State, error) {
	for i, n := range stateNames {
		if n == s {
			return State(i), nil
		}
	}
	return StateUnknown, fmt.Errorf("unknown replica state %q (want one of starting, ready, draining, recovering, stopped, failed)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	v, err := ParseState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Replica is one member of a replica set as the routing core sees it. It is
// a plain value: copy it freely.
type Replica struct {
	// Name is the replica's stable identity on the ring (e.g. "orders-0"). A
	// replica restarted under the same name gets its partitions back.
	Name string `json:"name"`
	// Addr is the host:port that proxies forward to.
	Addr string `json:"addr"`
	// State is the lifecycle state; see [State].
	State State `json:"state"`
	// Weight is advisory (reported, not yet used for placement). 0 means 1.
	Weight int `json:"weight,omitempty"`
	// Zone is an optional failure-domain label, reported only.
	Zone string `json:"zone,omitempty"`
	// Source says where the replica came from ("static", "gossip", ...).
	Source string `json:"source,omitempty"`
	// Down says gossip found the replica unreachable (dead, not yet
	// forgotten): it stays on the ring, keeping its partitions for a
	// restart, but is out of rotation.
	Down bool `json:"down,omitempty"`
	// Boot identifies the replica's incarnation: when its agent started
	// (Unix nanoseconds, from gossip metadata); a restart is a new, larger
	// Boot under the same Name. 0 when unknown (static replicas). A change
	// of Boot alone moves no partition and keeps the replica's place on
	// the ring; the proxy only drops its connections to the old process.
	Boot int64 `json:"boot,omitempty"`
}

// routable reports whether the replica's own view allows traffic: ready
// and not down. Proxy-local exclusions come on top.
func (r *Replica) routable() bool { return r.State == StateReady && !r.Down }

// Reason is a bit set of proxy-local causes that hold a ring member out of
// rotation, in addition to its lifecycle state.
type Reason uint16

// Rotation exclusion reasons. They combine: a replica is back in rotation
// only when every reason has been cleared.
const (
	ReasonProbe   Reason = 1 << iota // failing active health checks
	ReasonEjected                    // ejected by passive checks (failed requests)
	ReasonRefused                    // a connection was refused: ejected at once, before gossip agrees
	ReasonFailed                     // held out after too many ejections within a window
	ReasonAdmin                      // drained by an operator on this proxy
	ReasonFleet                      // another proxy's evidence, adopted by the fleet (FleetVerdict)
)

var reasonNames = []struct {
	r    Reason
	name string
}{{ReasonProbe, "probe"}, {ReasonEjected, "ejected"}, {ReasonRefused, "refused"}, {ReasonFailed, "failed"}, {ReasonAdmin, "admin"}, {ReasonFleet, "fleet"}}

// String lists the reasons separated by '+', or "none". Bits without a
// name are shown in hex ("refused+0x400").
func (r Reason) String() string {
	if r == 0 {
		return "none"
	}
	s := ""
	add := func(n string) {
		if s != "" {
			s += "+"
		}
		s += n
	}
	for _, n := range reasonNames {
		if r&n.r != 0 {
			add(n.name)
			r &^= n.r
		}
	}
	if r != 0 {
		add(fmt.Sprintf("%#x", uint16(r)))
	}
	return s
}
