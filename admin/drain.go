package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.uber.org/zap"
)

// The mutating half of the admin API: drain and undrain
// a replica. Both require "Authorization: Bearer TOKEN" (admin.token_file
// or KEYWAY_ADMIN_TOKEN) and POST; they answer 202 with
// {set, replica, action, scope}.

// Drainer drains and undrains replicas for the operator. Safe for
// concurrent use.
type Drainer interface {
	// Drain drains (drain true) or undrains a replica and returns the
	// scope of the change: ScopeGossip when the replica's agent was told
	// (every proxy follows its advertised state), ScopeThisProxy for a
	// static replica held out on this proxy only. Errors wrap
	// ErrUnknownSet, ErrUnknownReplica or ErrUnreachable.
	Drain(set, replica string, drain bool) (scope string, err error)
}

var (
	// ErrUnknownReplica is returned (wrapped) for a replica the set does
	// not have; the API answers 404.
	ErrUnknownReplica = errors.New("unknown replica")
	// ErrUnreachable is returned (wrapped) when the replica is neither
	// static nor reachable by gossip; the API answers 409.
	ErrUnreachable = errors.New("replica not reachable by gossip")
)

var mutatingRoutes = []string{
	"/v1/replica_sets/{set}/replicas/{replica}/drain",
	"/v1/replica_sets/{set}/replicas/{replica}/undrain",
}

func (s *Server) routeMutating(mux *http.ServeMux) {
	mux.HandleFunc("POST "+mutatingRoutes[0], s.authorized(func(w http.ResponseWriter, r *http.Request) { s.drain(w, r, true) }))
	mux.HandleFunc("POST "+mutatingRoutes[1], s.authorized(func(w http.ResponseWriter, r *http.Request) { s.drain(w, r, false) }))
	for _, p := range mutatingRoutes {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", "POST")
			s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use POST with Authorization: Bearer TOKEN", r.Method, r.URL.Path))
		})
	}
}

// authorized answers 401 unless the request carries the admin token.
func (s *Server) authorized(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if *s.token.Load() == "" {
			s.unauthorized(w, "no admin token configured on this proxy: set admin.token_file or "+TokenEnv+" to enable mutating endpoints")
			return
		}
		if !s.bearerOK(r) {
			s.unauthorized(w, "missing or wrong bearer token: "+sendToken)
			return
		}
		h(w, r)
	}
}

// sendToken says how to send the admin token, over HTTP and with the
// keyway CLI.
const sendToken = "send Authorization: Bearer TOKEN with the token of admin.token_file or " + TokenEnv +
	"; with the keyway CLI, pass --token-file FILE or set " + TokenEnv

// unauthorized answers 401 with msg.
func (s *Server) unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="keyway admin"`)
	s.fail(w, http.StatusUnauthorized, msg)
}

// bearerOK reports whether the request carries the admin token; never
// when no token is configured. The scheme is matched in any case
// ("bearer", RFC 9110 section 11.1). The comparison takes the same time
// whatever the token sent.
func (s *Server) bearerOK(r *http.Request) bool {
	token := *s.token.Load()
	if token == "" {
		return false
	}
	scheme, got, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	ok = ok && strings.EqualFold(scheme, "Bearer")
	want := sha256.Sum256([]byte(token))
	have := sha256.Sum256([]byte(strings.TrimSpace(got)))
	return ok && subtle.ConstantTimeCompare(want[:], have[:]) == 1
}

func (s *Server) drain(w http.ResponseWriter, r *http.Request, drain bool) {
	if s.opts.Drainer == nil {
		s.unavailable(w, "drain")
		return
	}
	set, replica := r.PathValue("set"), r.PathValue("replica")
	action := "undrain"
	if drain {
		action = "drain"
	}
	scope, err := s.opts.Drainer.Drain(set, replica, drain)
	switch {
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q", set))
	case errors.Is(err, ErrUnknownReplica):
		s.fail(w, http.StatusNotFound, fmt.Sprintf("replica set %q has no replica %q; see GET /v1/replica_sets/%s/replicas", set, replica, set))
	case errors.Is(err, ErrUnreachable):
		s.fail(w, http.StatusConflict, fmt.Sprintf("cannot %s %s/%s: %v", action, set, replica, err))
	case err != nil:
		s.fail(w, http.StatusInternalServerError, fmt.Sprintf("%s %s/%s: %v", action, set, replica, err))
	default:
		s.log.Info("admin "+action, zap.String("set", set), zap.String("replica", replica), zap.String("scope", scope), zap.String("remote", r.RemoteAddr))
		s.write(w, http.StatusAccepted, DrainResult{Set: set, Replica: replica, Action: action, Scope: scope})
	}
}
