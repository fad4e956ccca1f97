package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// Restarter runs rolling restarts of replica sets (POST and GET
// /v1/replica_sets/{set}/restart, POST …/restart/ack). Safe for
// concurrent use.
type Restarter interface {
	// StartRestart begins a rolling restart of a set and returns its
	// status. Errors wrap ErrUnknownSet, ErrRestartRunning (one runs
	// already) or ErrUnreachable (no gossip, no agents), or are a
	// *RefusedError (a replica it could not restart).
	StartRestart(set string, opts RestartOptions, who Actor) (RestartStatus, error)
	// RestartStatus returns the set's last rolling restart, whichever
	// proxy of the fleet runs or ran it; ok is false when there was none.
	RestartStatus(set string) (RestartStatus, bool)
	// AckRestart acknowledges the set's failed or interrupted last
	// restart: its mark is no longer shown, its record stays. Errors wrap
	// ErrUnknownSet, ErrNoRestart (none, or nothing to acknowledge) or
	// ErrRestartRunning.
	AckRestart(set string, who Actor) (RestartStatus, error)
}

// ErrRestartRunning is returned (wrapped) when a rolling restart of the
// set runs already; the API answers 409.
var ErrRestartRunning = errors.New("a rolling restart of this set is running")

// ErrNoRestart is returned (wrapped) by AckRestart when the set has no
// restart to acknowledge; the API answers 404 (none ran) or 409 (the last
// one succeeded).
var ErrNoRestart = errors.New("no rolling restart to acknowledge")

// RefusedError is a restart or repair refused at once, before it changed
// anything, because it could not do what it is asked (an agent that
// supervises no process cannot restart its replica). The API answers 409
// with a RefusedBody.
type RefusedError struct {
	// Action is "restart" or "repair".
	Action string
	Set    string
	// Replicas are the replicas concerned, sorted (may be empty).
	Replicas []string
	// Reason says what stops it, naming the replicas; Fix what to do.
	Reason, Fix string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s %s refused: %s; %s", e.Action, e.Set, e.Reason, e.Fix)
}

func (s *Server) routeRestart(mux *http.ServeMux) {
	const path = "/v1/replica_sets/{set}/restart"
	mux.HandleFunc("POST "+path, s.authorized(s.startRestart))
	mux.HandleFunc("GET "+path, s.restartStatus)
	mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD, POST")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: GET its status, or POST with Authorization: Bearer TOKEN to start one", r.Method, r.URL.Path))
	})
	mux.HandleFunc("POST "+path+"/ack", s.authorized(s.ackRestart))
	mux.HandleFunc(path+"/ack", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use POST with Authorization: Bearer TOKEN", r.Method, r.URL.Path))
	})
}

// refused answers a *RefusedError with 409 and its parts.
func (s *Server) refused(w http.ResponseWriter, e *RefusedError) {
	s.write(w, http.StatusConflict, RefusedBody{Error: e.Error(), Set: e.Set, Replicas: nonNil(e.Replicas), Reason: e.Reason, Fix: e.Fix})
}

func (s *Server) startRestart(w http.ResponseWriter, r *http.Request) {
	if s.opts.Restarter == nil {
		s.unavailable(w, "rolling restart")
		return
	}
	set := r.PathValue("set")
	opts := RestartOptions{StepTimeout: 2 * time.Minute}
	q := r.URL.Query()
	if v := q.Get("step_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			s.fail(w, http.StatusBadRequest, fmt.Sprintf("step_timeout: %q is not a duration of at least 1s, e.g. 2m", v))
			return
		}
		opts.StepTimeout = d
	}
	var body RestartRequest
	present, err := decodeOptionalBody(r, 1<<10, &body, true)
	if err != nil {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf(`body: send {"force": true}, {"force": false} or no body: %v; nothing started`, err))
		return
	}
	opts.Force = body.Force
	if v := q.Get("force"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			s.fail(w, http.StatusBadRequest, fmt.Sprintf("force: %q is not a boolean: use force=true or force=false; nothing started", v))
			return
		}
		if present && f != body.Force {
			s.fail(w, http.StatusBadRequest, fmt.Sprintf("force: the query says %v and the body %v: send one of them; nothing started", f, body.Force))
			return
		}
		opts.Force = f
	}
	st, err := s.opts.Restarter.StartRestart(set, opts, actor(r))
	var refused *RefusedError
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case errors.As(err, &refused):
		s.log.Info("admin rolling restart refused", zap.String("set", set), zap.Strings("replicas", refused.Replicas), zap.String("reason", refused.Reason), zap.String("remote", r.RemoteAddr))
		s.refused(w, refused)
	case errors.Is(err, ErrRestartRunning), errors.Is(err, ErrUnreachable):
		s.fail(w, http.StatusConflict, fmt.Sprintf("restart %s: %v", set, err))
	case err != nil:
		s.fail(w, http.StatusInternalServerError, fmt.Sprintf("restart %s: %v", set, err))
	default:
		s.log.Info("admin rolling restart", zap.String("set", set), zap.Strings("replicas", st.Replicas), zap.Bool("force", st.Force), zap.String("remote", r.RemoteAddr))
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

func (s *Server) ackRestart(w http.ResponseWriter, r *http.Request) {
	if s.opts.Restarter == nil {
		s.unavailable(w, "rolling restart")
		return
	}
	set := r.PathValue("set")
	st, err := s.opts.Restarter.AckRestart(set, actor(r))
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case errors.Is(err, ErrNoRestart) && !st.Started.IsZero():
		s.fail(w, http.StatusConflict, fmt.Sprintf("acknowledge %s: %v", set, err))
	case errors.Is(err, ErrNoRestart):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("acknowledge %s: %v", set, err))
	case errors.Is(err, ErrRestartRunning):
		s.fail(w, http.StatusConflict, fmt.Sprintf("acknowledge %s: %v: it has no result to acknowledge yet; follow it with GET …/restart", set, err))
	case err != nil:
		s.fail(w, http.StatusInternalServerError, fmt.Sprintf("acknowledge %s: %v", set, err))
	default:
		s.log.Info("admin rolling restart acknowledged", zap.String("set", set), zap.String("remote", r.RemoteAddr))
		s.reply(w, st)
	}
}
