package health

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"keyway/balancer"
)

// PhaseChange is one change of a replica set's phase.
type PhaseChange struct {
	Set        string
	From, To   Phase // From is "" for the set's first phase
	Declared   int
	Members    int
	InRotation int
	// Stopped says an operator stopped the set.
	Stopped bool
}

// PhaseTracker keeps each replica set's phase current from the routing
// tables the proxy publishes (it implements proxy.TableObserver) and
// reports every change. It exports, per set and per replica the tables
// list:
//
//	keyway_replica_set_phase{set,phase}         1 for the current phase, 0 for the others
//	keyway_replica_in_rotation{set,replica}     1 in rotation on this proxy, 0 held out
//	keyway_replica_state{set,replica,state}     1 for the advertised lifecycle state, 0 for the others
//
// A replica's series are deleted when a table no longer lists it (it was
// forgotten or removed), a set's when [PhaseTracker.RemoveSet] forgets the
// set. Safe for concurrent use.
type PhaseTracker struct {
	gauge    *prometheus.GaugeVec // set, phase
	inRot    *prometheus.GaugeVec // set, replica
	state    *prometheus.GaugeVec // set, replica, state
	onChange func(PhaseChange)
	now      func() time.Time // time.Now; tests replace it

	mu   sync.Mutex
	sets map[string]*trackedSet
}

// trackedSet is what the tracker remembers of one set.
type trackedSet struct {
	phase    Phase     // "" before the first table
	since    time.Time // when phase was entered
	seen     bool      // the set has had members
	stopped  bool      // an operator stopped the set (SetStopped)
	run      bool      // keyway runs its replicas (SetRun)
	replicas map[string]*trackedReplica
	// The last table's declared count and members, for SetStopped.
	declared int
	members  []balancer.Member
}

// trackedReplica holds a replica's pre-bound series and since when it is
// in its state and in (or out of) rotation.
type trackedReplica struct {
	inRot  prometheus.Gauge
	states [len(replicaStates)]prometheus.Gauge
	since  ReplicaSince
}

// ReplicaSince says since when a replica has had its lifecycle state and
// its place in or out of rotation, as this proxy's tables showed them:
// the first table that listed it so, or that listed it at all (a replica
// that left the tables and came back starts again). A plain value.
type ReplicaSince struct {
	State         balancer.State
	StateSince    time.Time
	InRotation    bool
	RotationSince time.Time
}

var allPhases = []Phase{PhaseCreated, PhaseScheduling, PhaseRunning, PhaseDegraded, PhaseFailed, PhaseStopped}

// replicaStates are the lifecycle states keyway_replica_state has a series
// for: every state but unknown (a replica in an unknown state, which a
// table never lists, would show 0 for all of them).
var replicaStates = [...]balancer.State{
	balancer.StateStarting, balancer.StateReady, balancer.StateDraining,
	balancer.StateRecovering, balancer.StateStopped, balancer.StateFailed,
}

// NewPhaseTracker registers the tracker's gauges on reg (if non-nil).
// onChange, if non-nil, is called for every phase change, with the
// Router's lock held (see proxy.TableObserver): it must not block.
func NewPhaseTracker(reg prometheus.Registerer, onChange func(PhaseChange)) (*PhaseTracker, error) {
	t := &PhaseTracker{
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "replica_set_phase",
			Help: "Phase of each replica set: 1 for the current phase (Created, Scheduling, Running, Degraded, Failed, Stopped), 0 for the others.",
		}, []string{"set", "phase"}),
		inRot: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "replica_in_rotation",
			Help: "Whether a replica may receive new requests from this proxy now: 1 in rotation, 0 held out (not ready, dead in gossip, failing probes, ejected, drained or held as failed).",
		}, []string{"set", "replica"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "replica_state",
			Help: "Lifecycle state a replica advertises (static replicas are ready): 1 for the current state (starting, ready, draining, recovering, stopped, failed), 0 for the others.",
		}, []string{"set", "replica", "state"}),
		onChange: onChange,
		now:      time.Now,
		sets:     map[string]*trackedSet{},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{t.gauge, t.inRot, t.state} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

// TableChanged implements proxy.TableObserver.
func (t *PhaseTracker) TableChanged(set string, declared int, ms []balancer.Member, _ balancer.RebuildInfo) {
	t.mu.Lock()
	s := t.sets[set]
	if s == nil {
		s = &trackedSet{replicas: map[string]*trackedReplica{}}
		t.sets[set] = s
	}
	s.declared, s.members = declared, ms
	t.replicasChanged(set, s, ms)
	t.updateLocked(set, s) // unlocks
}

// SetStopped says whether an operator stopped the set (its stopped key, or
// a run-time stop): a stopped set's phase is Stopped whatever its replicas
// do, from the moment of the stop, and follows its tables again once it
// is started.
func (t *PhaseTracker) SetStopped(set string, stopped bool) {
	t.mu.Lock()
	s := t.sets[set]
	if s == nil {
		s = &trackedSet{replicas: map[string]*trackedReplica{}}
		t.sets[set] = s
	}
	if s.stopped == stopped || (s.phase == "" && !stopped) {
		s.stopped = stopped
		t.mu.Unlock()
		return // nothing changes, or the first table decides
	}
	s.stopped = stopped
	t.updateLocked(set, s)
}

// SetRun names the sets whose replicas keyway runs (a run section): their
// phase counts jobs asked for and not yet running as Scheduling
// (ComputeRunPhase). Sets not named compute it from their tables alone.
func (t *PhaseTracker) SetRun(sets map[string]bool) {
	t.mu.Lock()
	var changed []string
	for name, s := range t.sets {
		if s.run != sets[name] {
			s.run = sets[name]
			changed = append(changed, name)
		}
	}
	for name := range sets {
		if t.sets[name] == nil {
			t.sets[name] = &trackedSet{replicas: map[string]*trackedReplica{}, run: true}
		}
	}
	t.mu.Unlock()
	for _, name := range changed {
		t.mu.Lock()
		if s := t.sets[name]; s != nil && s.phase != "" {
			t.updateLocked(name, s) // unlocks
			continue
		}
		t.mu.Unlock()
	}
}

// updateLocked recomputes the set's phase from its last table and stop,
// and reports a change. It is called with t.mu held and releases it.
func (t *PhaseTracker) updateLocked(set string, s *trackedSet) {
	ms, declared := s.members, s.declared
	p := ComputePhase(declared, ms)
	if s.run {
		p = ComputeRunPhase(declared, ms)
	}
	inRot := 0
	for _, m := range ms {
		if m.InRotation {
			inRot++
		}
	}
	if len(ms) > 0 {
		s.seen = true
	} else if s.seen {
		// Every replica left for good: the set had replicas, all stopped.
		p = PhaseStopped
	}
	if s.stopped {
		p = PhaseStopped
	}
	old := s.phase
	if old == p {
		t.mu.Unlock()
		return
	}
	s.phase, s.since = p, t.now()
	for _, ph := range allPhases {
		v := 0.0
		if ph == p {
			v = 1
		}
		t.gauge.WithLabelValues(set, string(ph)).Set(v)
	}
	t.mu.Unlock()
	if t.onChange != nil {
		t.onChange(PhaseChange{Set: set, From: old, To: p, Declared: declared, Members: len(ms), InRotation: inRot, Stopped: s.stopped})
	}
}

// replicasChanged brings the per-replica series of set in line with ms:
// new replicas get series, listed ones are updated, and those no longer
// listed lose theirs. t.mu is held.
func (t *PhaseTracker) replicasChanged(set string, s *trackedSet, ms []balancer.Member) {
	listed := make(map[string]bool, len(ms))
	now := t.now()
	for _, m := range ms {
		listed[m.Name] = true
		r := s.replicas[m.Name]
		if r == nil {
			r = &trackedReplica{inRot: t.inRot.WithLabelValues(set, m.Name)}
			for i, st := range replicaStates {
				r.states[i] = t.state.WithLabelValues(set, m.Name, st.String())
			}
			r.since = ReplicaSince{State: m.State, StateSince: now, InRotation: m.InRotation, RotationSince: now}
			s.replicas[m.Name] = r
		}
		if r.since.State != m.State {
			r.since.State, r.since.StateSince = m.State, now
		}
		if r.since.InRotation != m.InRotation {
			r.since.InRotation, r.since.RotationSince = m.InRotation, now
		}
		if m.InRotation {
			r.inRot.Set(1)
		} else {
			r.inRot.Set(0)
		}
		for i, st := range replicaStates {
			if st == m.State {
				r.states[i].Set(1)
			} else {
				r.states[i].Set(0)
			}
		}
	}
	for name := range s.replicas {
		if listed[name] {
			continue
		}
		delete(s.replicas, name)
		l := prometheus.Labels{"set": set, "replica": name}
		t.inRot.Delete(l)
		t.state.DeletePartialMatch(l)
	}
}

// RemoveSet forgets a replica set that is no longer configured: its phase
// and every series of it (phase and per replica) are deleted. Call it once
// the set's Router has stopped publishing tables; a later table for the
// same name starts the set afresh (phase Created, no replicas seen).
func (t *PhaseTracker) RemoveSet(set string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sets, set)
	l := prometheus.Labels{"set": set}
	t.gauge.DeletePartialMatch(l)
	t.inRot.DeletePartialMatch(l)
	t.state.DeletePartialMatch(l)
}

// Phase returns a set's current phase, or "" before its first table (or
// after RemoveSet).
func (t *PhaseTracker) Phase(set string) Phase {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.sets[set]; s != nil {
		return s.phase
	}
	return ""
}

// PhaseSince returns the set's phase and when this tracker saw it enter
// it ("" and the zero time for an unknown set).
func (t *PhaseTracker) PhaseSince(set string) (Phase, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.sets[set]; s != nil {
		return s.phase, s.since
	}
	return "", time.Time{}
}

// Since returns, for each replica of a set's last table, since when it has
// had its state and its place in or out of rotation; nil for an unknown
// set.
func (t *PhaseTracker) Since(set string) map[string]ReplicaSince {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sets[set]
	if s == nil {
		return nil
	}
	out := make(map[string]ReplicaSince, len(s.replicas))
	for name, r := range s.replicas {
		out[name] = r.since
	}
	return out
}
