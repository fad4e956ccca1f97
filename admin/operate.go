package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"keyway/balancer"

	"go.uber.org/zap"
)

// The run-time configuration endpoints: POST /v1/reload re-reads the
// configuration file, PATCH /v1/replica_sets/{set} changes a set's
// declared replica count. Both need the bearer token.

// Reloader re-reads and applies the configuration file. Safe for
// concurrent use (reloads are serialized by the implementation).
type Reloader interface {
	// Reload applies the file and says what changed; source names the
	// trigger ("api", "SIGHUP") for logs and the audit trail. When the
	// file cannot be applied it returns a *ReloadError and the running
	// configuration stays.
	Reload(source string) (ReloadResult, error)
}

// ReloadError is a refused reload: every problem found. The API answers
// 422 with {error, problems}.
type ReloadError struct {
	File     string
	Problems []string
}

func (e *ReloadError) Error() string {
	return fmt.Sprintf("configuration %s not applied (%d problem%s); the running configuration stays:\n  %s",
		e.File, len(e.Problems), map[bool]string{true: "", false: "s"}[len(e.Problems) == 1], strings.Join(e.Problems, "\n  "))
}

// Scaler changes a replica set's declared replica count at run time.
type Scaler interface {
	// SetDeclared returns the previous count. Errors wrap ErrUnknownSet
	// for a set this proxy does not serve.
	SetDeclared(set string, replicas int) (prev int, err error)
}

// scaleRequest is the PATCH body.
type scaleRequest struct {
	Replicas *int `json:"replicas"`
}

func (s *Server) routeOperate(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/reload", s.authorized(s.reload))
	mux.HandleFunc("/v1/reload", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on /v1/reload: use POST with Authorization: Bearer TOKEN", r.Method))
	})
	mux.HandleFunc("PATCH /v1/replica_sets/{set}", s.authorized(s.scale))
}

func (s *Server) reload(w http.ResponseWriter, r *http.Request) {
	if s.opts.Reloader == nil {
		s.unavailable(w, "reload (this process has no configuration file)")
		return
	}
	res, err := s.opts.Reloader.Reload("api")
	var re *ReloadError
	switch {
	case errors.As(err, &re):
		s.write(w, http.StatusUnprocessableEntity, ReloadRefused{
			Error:    fmt.Sprintf("configuration %s not applied; the running configuration stays", re.File),
			Problems: re.Problems,
		})
	case err != nil:
		s.fail(w, http.StatusInternalServerError, "reload: "+err.Error())
	default:
		s.reply(w, res)
	}
}

func (s *Server) scale(w http.ResponseWriter, r *http.Request) {
	if s.opts.Scaler == nil {
		s.unavailable(w, "scaling")
		return
	}
	set := r.PathValue("set")
	dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
	dec.DisallowUnknownFields()
	var req scaleRequest
	if err := dec.Decode(&req); err != nil {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf(`body: want JSON {"replicas": N} with 1 <= N <= %d: %v`, balancer.MaxReplicas, err))
		return
	}
	if req.Replicas == nil {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf(`body: "replicas" is missing: send {"replicas": N} with 1 <= N <= %d`, balancer.MaxReplicas))
		return
	}
	if n := *req.Replicas; n < 1 || n > balancer.MaxReplicas {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf(`replicas: %d is out of range: send {"replicas": N} with 1 <= N <= %d`, n, balancer.MaxReplicas))
		return
	}
	prev, err := s.opts.Scaler.SetDeclared(set, *req.Replicas)
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case err != nil:
		s.fail(w, http.StatusBadRequest, err.Error())
	default:
		s.log.Info("admin scale", zap.String("set", set), zap.Int("replicas", *req.Replicas), zap.Int("previous", prev), zap.String("remote", r.RemoteAddr))
		s.reply(w, ScaleResult{Set: set, Replicas: *req.Replicas, Previous: prev, Scope: ScopeThisProxy})
	}
}
