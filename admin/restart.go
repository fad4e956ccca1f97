package admin

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// Restarter runs rolling restarts of replica sets (POST and GET
// /v1/replica_sets/{set}/restart). Safe for concurrent use.
type Restarter interface {
	// StartRestart begins a rolling restart of a set and returns its
	// status. Errors wrap ErrUnknownSet, ErrRestartRunning (one runs
	// already) or ErrUnreachable (no gossip, no agents).
	StartRestart(set string, stepTimeout time.Duration, who Actor) (RestartStatus, error)
	// RestartStatus returns the set's last rolling restart, whichever
	// proxy of the fleet runs or ran it; ok is false when there was none.
	RestartStatus(set string) (RestartStatus, bool)
}

// ErrRestartRunning is returned (wrapped) when a rolling restart of the
// set runs already; the API answers 409.
var ErrRestartRunning = errors.New("a rolling restart of this set is running")

func (s *Server) routeRestart(mux *http.ServeMux) {
	const path = "/v1/replica_sets/{set}/restart"
	mux.HandleFunc("POST "+path, s.authorized(s.startRestart))
	mux.HandleFunc("GET "+path, s.restartStatus)
	mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD, POST")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: GET its status, or POST with Authorization: Bearer TOKEN to start one", r.Method, r.URL.Path))
	})
}

func (s *Server) startRestart(w http.ResponseWriter, r *http.Request) {
	if s.opts.Restarter == nil {
		s.unavailable(w, "rolling restart")
		return
	}
	set := r.PathValue("set")
	step := 2 * time.Minute
	if v := r.URL.Query().Get("step_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			s.fail(w, http.StatusBadRequest, fmt.Sprintf("step_timeout: %q is not a duration of at least 1s, e.g. 2m", v))
			return
		}
		step = d
	}
	st, err := s.opts.Restarter.StartRestart(set, step, actor(r))
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case errors.Is(err, ErrRestartRunning), errors.Is(err, ErrUnreachable):
		s.fail(w, http.StatusConflict, fmt.Sprintf("restart %s: %v", set, err))
	case err != nil:
		s.fail(w, http.StatusInternalServerError, fmt.Sprintf("restart %s: %v", set, err))
	default:
		s.log.Info("admin rolling restart", zap.String("set", set), zap.Strings("replicas", st.Replicas), zap.String("remote", r.RemoteAddr))
		s.write(w, http.StatusAccepted, st)
	}
}

func (s *Server) restartStatus(w http.ResponseWriter, r *http.Request) {
	if s.opts.Restarter == nil {
		s.unavailable(w, "rolling restart")
		return
	}
	set := r.PathValue("set")
	st, ok := s.opts.Restarter.RestartStatus(set)
	if !ok {
		s.fail(w, http.StatusNotFound, fmt.Sprintf("no rolling restart of %q has run on this proxy; start one with POST and the bearer token", set))
		return
	}
	s.reply(w, st)
}
