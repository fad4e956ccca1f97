package admin

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Jobber lists the jobs of a set whose replicas keyway runs (GET
// /v1/replica_sets/{set}/jobs). Safe for concurrent use.
type Jobber interface {
	// Jobs returns the set's jobs as this proxy sees them. Errors wrap
	// ErrUnknownSet.
	Jobs(set string) (JobsStatus, error)
}

// JobsStatus is the answer of GET /v1/replica_sets/{set}/jobs.
type JobsStatus struct {
	Set string `json:"set"`
	// Runs is true when the set has a run section: keyway runs its
	// replicas. Here is true when this proxy process runs them (it holds
	// the state directory's lock); otherwise Holder names the process
	// that does, on this host, or Error says why none can.
	Runs     bool   `json:"runs"`
	Here     bool   `json:"here"`
	StateDir string `json:"state_dir,omitempty"`
	Holder   string `json:"holder,omitempty"`
	Error    string `json:"error,omitempty"`
	// Wanted is the number of jobs asked for: the set's replicas.
	Wanted int   `json:"wanted"`
	Jobs   []Job `json:"jobs"`
	// Kubernetes is set for a set on a StatefulSet: its jobs are the pods.
	Kubernetes *KubeStatus `json:"kubernetes,omitempty"`
}

// KubeStatus is a set's StatefulSet, as keyway's Kubernetes backend sees
// it.
type KubeStatus struct {
	StatefulSet string `json:"statefulset"` // namespace/name
	Found       bool   `json:"found"`
	// Replicas is spec.replicas; Target the count a keyway scale-in in
	// progress goes down to (Replicas when none is); Ready is
	// status.readyReplicas.
	Replicas        int    `json:"replicas"`
	Target          int    `json:"target"`
	Ready           int    `json:"ready"`
	ResourceVersion string `json:"resource_version,omitempty"`
	// ManagedByKeyway is true when keyway created it (delete removes it).
	ManagedByKeyway bool `json:"managed_by_keyway"`
	// Acting names the proxy (fleet ID) that holds the Lease and drives
	// scale-ins; ActingHere is true when it is this one.
	Acting     string `json:"acting"`
	ActingHere bool   `json:"acting_here"`
}

// Job is one replica's job: its agent, as the runner sees it, and its
// replica's process, as the agent reported it.
type Job struct {
	Replica string `json:"replica"`
	Ordinal int    `json:"ordinal"`
	// State is the agent's: running, stopping (scaled in: draining, then
	// leaving for good), starting, backoff (it exited and is started again
	// at retry_at) or failed (it cannot be started: error says why).
	State string `json:"state"`
	// ReplicaState is the replica's lifecycle state in this proxy's
	// routing table (ready, starting, draining, failed, ...); "" before
	// its agent has announced it.
	ReplicaState string    `json:"replica_state"`
	Addr         string    `json:"addr,omitempty"`
	AgentPid     int       `json:"agent_pid,omitempty"`
	Since        time.Time `json:"since,omitzero"`
	Age          string    `json:"age,omitempty"`
	// Adopted is true for an agent an earlier proxy process started.
	Adopted bool `json:"adopted,omitempty"`
	// Pid is the replica process's, Restarts its restarts by its agent
	// within the agent's window, and LastExit how it last ended, as the
	// agent reported them (replica_process events seen by this proxy).
	Pid        int       `json:"pid,omitempty"`
	Restarts   int       `json:"restarts"`
	LastExit   string    `json:"last_exit,omitempty"`
	LastExitAt time.Time `json:"last_exit_at,omitzero"`
	// AgentRestarts counts the agent's own restarts by the runner, and
	// AgentLastExit says how it last ended.
	AgentRestarts int       `json:"agent_restarts"`
	AgentLastExit string    `json:"agent_last_exit,omitempty"`
	RetryAt       time.Time `json:"retry_at,omitzero"`
	Error         string    `json:"error,omitempty"`
	StateDir      string    `json:"state_dir"`
	Log           string    `json:"log"`
	// A pod's (sets on a StatefulSet): its phase, readiness, container
	// restarts, node, and why a container waits or failed
	// (CrashLoopBackOff, Error, …).
	Pod         string    `json:"pod,omitempty"`
	PodPhase    string    `json:"pod_phase,omitempty"`
	PodReady    bool      `json:"pod_ready,omitempty"`
	PodRestarts int       `json:"pod_restarts,omitempty"`
	Node        string    `json:"node,omitempty"`
	PodReason   string    `json:"pod_reason,omitempty"`
	PodCreated  time.Time `json:"pod_created,omitzero"`
	PodDeleting bool      `json:"pod_deleting,omitempty"`
	Retiring    bool      `json:"retiring,omitempty"`
}

func (s *Server) routeJobs(mux *http.ServeMux) {
	const path = "/v1/replica_sets/{set}/jobs"
	mux.HandleFunc("GET "+path, s.jobs)
	mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use GET", r.Method, r.URL.Path))
	})
}

func (s *Server) jobs(w http.ResponseWriter, r *http.Request) {
	if s.opts.Jobs == nil {
		s.unavailable(w, "jobs")
		return
	}
	set := r.PathValue("set")
	st, err := s.opts.Jobs.Jobs(set)
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case err != nil:
		s.fail(w, http.StatusInternalServerError, fmt.Sprintf("jobs of %s: %v", set, err))
	default:
		s.reply(w, st)
	}
}
