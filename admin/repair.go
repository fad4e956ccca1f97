package admin

import (
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"
)

// Repairer revives a replica set (POST /v1/replica_sets/{set}/repair).
// Safe for concurrent use.
type Repairer interface {
	// Repair tells the set's agents to restart replicas that gave up and
	// lifts every proxy's supervision holds on the set. Errors wrap
	// ErrUnknownSet, or are a *RefusedError: nothing to repair (no
	// replica failed, no hold to lift), or no failed replica it could
	// restart (their agents supervise no process).
	Repair(set string) (RepairResult, error)
}

func (s *Server) routeRepair(mux *http.ServeMux) {
	const path = "/v1/replica_sets/{set}/repair"
	mux.HandleFunc("POST "+path, s.authorized(s.repair))
	mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use POST with Authorization: Bearer TOKEN", r.Method, r.URL.Path))
	})
}

func (s *Server) repair(w http.ResponseWriter, r *http.Request) {
	if s.opts.Repairer == nil {
		s.unavailable(w, "repair")
		return
	}
	set := r.PathValue("set")
	res, err := s.opts.Repairer.Repair(set)
	var refused *RefusedError
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case errors.As(err, &refused):
		s.log.Info("admin repair refused", zap.String("set", set), zap.Strings("replicas", refused.Replicas), zap.String("reason", refused.Reason), zap.String("remote", r.RemoteAddr))
		s.refused(w, refused)
	case err != nil:
		s.fail(w, http.StatusInternalServerError, fmt.Sprintf("repair %s: %v", set, err))
	default:
		s.log.Info("admin repair", zap.String("set", set), zap.Strings("agents", res.Agents), zap.Strings("failed", res.Failed), zap.String("remote", r.RemoteAddr))
		res.Agents, res.Failed, res.Reset = nonNil(res.Agents), nonNil(res.Failed), nonNil(res.Reset)
		s.write(w, http.StatusAccepted, res)
	}
}
