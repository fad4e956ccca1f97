package health

import (
	"sync"

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
}

// PhaseTracker keeps each replica set's phase current from the routing
// tables the proxy publishes (it implements proxy.TableObserver), exports
// it as keyway_replica_set_phase{set,phase} (1 for the current phase, 0
// for the others) and reports every change. Safe for concurrent use.
type PhaseTracker struct {
	gauge    *prometheus.GaugeVec
	onChange func(PhaseChange)

	mu     sync.Mutex
	phases map[string]Phase
	seen   map[string]bool // sets that have had members
}

var allPhases = []Phase{PhaseCreated, PhaseScheduling, PhaseRunning, PhaseDegraded, PhaseFailed, PhaseStopped}

// NewPhaseTracker registers the phase gauge on reg (if non-nil). onChange,
// if non-nil, is called for every change, with the Router's lock held (see
// proxy.TableObserver): it must not block.
func NewPhaseTracker(reg prometheus.Registerer, onChange func(PhaseChange)) (*PhaseTracker, error) {
	t := &PhaseTracker{
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyway", Name: "replica_set_phase",
			Help: "Phase of each replica set: 1 for the current phase (Created, Scheduling, Running, Degraded, Failed, Stopped), 0 for the others.",
		}, []string{"set", "phase"}),
		onChange: onChange,
		phases:   map[string]Phase{},
		seen:     map[string]bool{},
	}
	if reg != nil {
		if err := reg.Register(t.gauge); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// TableChanged implements proxy.TableObserver.
func (t *PhaseTracker) TableChanged(set string, declared int, ms []balancer.Member, _ balancer.RebuildInfo) {
	p := ComputePhase(declared, ms)
	inRot := 0
	for _, m := range ms {
		if m.InRotation {
			inRot++
		}
	}
	t.mu.Lock()
	if len(ms) > 0 {
		t.seen[set] = true
	} else if t.seen[set] {
		// Every replica left for good: the set had replicas, all stopped.
		p = PhaseStopped
	}
	old, known := t.phases[set]
	if known && old == p {
		t.mu.Unlock()
		return
	}
	t.phases[set] = p
	t.mu.Unlock()
	for _, ph := range allPhases {
		v := 0.0
		if ph == p {
			v = 1
		}
		t.gauge.WithLabelValues(set, string(ph)).Set(v)
	}
	if t.onChange != nil {
		t.onChange(PhaseChange{Set: set, From: old, To: p, Declared: declared, Members: len(ms), InRotation: inRot})
	}
}

// Phase returns a set's current phase, or "" before its first table.
func (t *PhaseTracker) Phase(set string) Phase {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.phases[set]
}
