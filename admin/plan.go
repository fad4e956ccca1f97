package admin

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"keyway/balancer"
)

// GET /v1/replica_sets/{set}/plan?add=NAME&remove=NAME: what a change of a
// set's ring members would do, before anyone makes it. Read-only: no
// token.

// Planner plans a change of a replica set's ring members. Safe for
// concurrent use.
type Planner interface {
	// Plan computes what adding and removing ring members would do and
	// changes nothing. Its error wraps [ErrUnknownSet] for a set this
	// proxy does not serve (404), or balancer.ErrBadPlan for a change that
	// cannot be planned (400): a *balancer.PlanError names the parameter
	// and the value.
	Plan(set string, add, remove []string) (ReplicaSetPlan, error)
}

const planPath = "/v1/replica_sets/{set}/plan"

// PlanRefused is the 400 answer of a plan refused for one query
// parameter: besides the error, Param ("add" or "remove") and Value name
// what was given and Problem what is wrong with it, so that a client can
// name its own flag for it (keyway plan --add).
type PlanRefused struct {
	Error   string `json:"error"`
	Param   string `json:"param"`
	Value   string `json:"value"`
	Problem string `json:"problem"`
}

func (s *Server) routePlan(mux *http.ServeMux) {
	mux.HandleFunc("GET "+planPath, s.plan)
	mux.HandleFunc(planPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use GET (a plan changes nothing)", r.Method, r.URL.Path))
	})
}

func (s *Server) plan(w http.ResponseWriter, r *http.Request) {
	if s.opts.Planner == nil {
		s.unavailable(w, "plans")
		return
	}
	set := r.PathValue("set")
	q := r.URL.Query()
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if k != "add" && k != "remove" {
			s.fail(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %s: use add=NAME and remove=NAME, each repeatable", k))
			return
		}
	}
	add, remove := q["add"], q["remove"]
	if len(add) == 0 && len(remove) == 0 {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf("missing query parameter add or remove: use /v1/replica_sets/%s/plan?add=NAME&remove=NAME, each repeatable", set))
		return
	}
	p, err := s.opts.Planner.Plan(set, add, remove)
	var pe *balancer.PlanError
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case errors.As(err, &pe):
		s.write(w, http.StatusBadRequest, PlanRefused{Error: "bad query parameter " + pe.Error(), Param: pe.Param, Value: pe.Value, Problem: pe.Problem})
	case errors.Is(err, balancer.ErrBadPlan):
		s.fail(w, http.StatusBadRequest, err.Error())
	case err != nil:
		s.fail(w, http.StatusInternalServerError, "plan: "+err.Error())
	default:
		p.Add, p.Remove, p.Replicas, p.Notes = nonNil(p.Add), nonNil(p.Remove), nonNil(p.Replicas), nonNil(p.Notes)
		s.reply(w, p)
	}
}
