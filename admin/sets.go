package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode"

	"go.uber.org/zap"

	"keyway/balancer"
)

// The run-time changes of replica sets, fleet-wide (bearer token):
//
//	POST   /v1/replica_sets          create a set from a JSON definition
//	PATCH  /v1/replica_sets/{set}    {"replicas": N} and/or {"stop": true|false}
//	DELETE /v1/replica_sets/{set}    delete a set none of whose replicas runs
//	GET    /v1/runtime               the run-time state (no token)
//	GET    /v1/runtime/export        the sets as YAML for the file (no token)
//	DELETE /v1/runtime/{set}         hand a set back to the configuration file

// SetAdmin makes run-time changes of replica sets. Safe for concurrent
// use. Every change answers once the fleet holds it: besides the errors
// each names, a change may fail with a *ConflictError (If-Match names a
// version that is no longer current, or a concurrent write won) or an
// *UnconfirmedError (written here, not confirmed by the fleet).
type SetAdmin interface {
	// CreateSet creates a set from spec, a JSON object with the keys of a
	// replica_sets entry. Errors: *SpecError (the definition is invalid),
	// ErrSetExists.
	CreateSet(spec []byte, w Write) (SetChange, error)
	// PatchSet changes a set's declared count and/or stops or starts it.
	// Errors wrap ErrUnknownSet.
	PatchSet(set string, p SetPatch, w Write) (SetChange, error)
	// DeleteSet removes a set. Errors wrap ErrUnknownSet, or are a
	// *InUseError naming the replicas still running or draining.
	DeleteSet(set string, w Write) (SetChange, error)
	// ClearRuntime drops the run-time state of a set: the configuration
	// file decides about it again. Errors wrap ErrNoRuntimeState.
	ClearRuntime(set string, w Write) (SetChange, error)
	// Runtime returns the run-time state.
	Runtime() RuntimeStatus
	// Export returns the replica sets this proxy serves (file and
	// run-time state together) as the replica_sets key of a configuration
	// file, in YAML.
	Export() ([]byte, error)
}

// SetPatch is the body of PATCH /v1/replica_sets/{set}: at least one field.
type SetPatch struct {
	Replicas *int  `json:"replicas,omitempty"`
	Stop     *bool `json:"stop,omitempty"`
}

// Write is what a run-time change carries besides the change itself.
type Write struct {
	// Ctx ends with the request: a write stops waiting for the fleet.
	Ctx context.Context
	Who Actor
	// IfMatch, when not nil, is the version of the set's run-time record
	// the change was made from (the If-Match header; 0: none yet).
	IfMatch *uint64
}

// ConflictError refuses a change (409): If-Match names a version that is
// no longer current (nothing was written), or a concurrent write won the
// merge (Lost: this one was written and lost). Current is the record that
// holds; its version is the ETag to retry with.
type ConflictError struct {
	Message string
	Current RuntimeRecord
	Lost    bool
}

func (e *ConflictError) Error() string { return e.Message }

// UnconfirmedError answers a change the fleet has not confirmed (503):
// it is written on this proxy and goes on spreading, and may yet win or
// lose. Missing are the proxies that did not acknowledge it.
type UnconfirmedError struct {
	Message string
	Record  RuntimeRecord
	Missing []string
}

func (e *UnconfirmedError) Error() string { return e.Message }

// Actor is who issued a command: the X-Keyway-Actor header (the CLI sends
// USER@HOST) and the client's address.
type Actor struct {
	Name   string
	Remote string
}

// String is "NAME (REMOTE)", or "anonymous (REMOTE)" without a name.
func (a Actor) String() string {
	n := a.Name
	if n == "" {
		n = "anonymous"
	}
	if a.Remote == "" {
		return n
	}
	return n + " (" + a.Remote + ")"
}

// ActorHeader names the caller of a mutating call, for the audit trail.
const ActorHeader = "X-Keyway-Actor"

// Errors of SetAdmin.
var (
	ErrSetExists = errors.New("replica set already exists")
	// ErrObjectInTheWay refuses a set whose StatefulSet template names
	// Kubernetes objects that exist already (409).
	ErrObjectInTheWay = errors.New("a Kubernetes object of the set exists already")
	ErrNoRuntimeState = errors.New("no run-time state for this replica set")
)

// SpecError is a set definition that does not decode or validate: every
// problem, each naming the key.
type SpecError struct{ Problems []string }

func (e *SpecError) Error() string {
	return "the replica set definition is invalid:\n  " + strings.Join(e.Problems, "\n  ")
}

// InUseError refuses a delete: the replicas still running or draining.
type InUseError struct {
	Set      string
	Replicas []string // "NAME (STATE)"
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("replica set %q still has replicas running or draining: %s; stop the set first (keyway stop --set %s, or PATCH {\"stop\": true}) and delete it once they are stopped",
		e.Set, strings.Join(e.Replicas, ", "), e.Set)
}

func (s *Server) routeSets(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/replica_sets", s.authorized(s.createSet))
	mux.HandleFunc("PATCH /v1/replica_sets/{set}", s.authorized(s.patchSet))
	mux.HandleFunc("DELETE /v1/replica_sets/{set}", s.authorized(s.deleteSet))
	mux.HandleFunc("GET /v1/runtime", s.getRuntime)
	mux.HandleFunc("GET /v1/runtime/export", s.exportRuntime)
	mux.HandleFunc("DELETE /v1/runtime/{set}", s.authorized(s.clearRuntime))
}

// actor reads who calls: the X-Keyway-Actor header (at most 128
// printable characters; anything else is replaced) and the remote
// address.
func actor(r *http.Request) Actor {
	name := strings.TrimSpace(r.Header.Get(ActorHeader))
	if len(name) > 128 {
		name = name[:128]
	}
	name = strings.Map(func(c rune) rune {
		if unicode.IsPrint(c) {
			return c
		}
		return '?'
	}, name)
	return Actor{Name: name, Remote: r.RemoteAddr}
}

func (s *Server) createSet(w http.ResponseWriter, r *http.Request) {
	if s.opts.SetAdmin == nil {
		s.unavailable(w, "run-time replica sets")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		s.fail(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	if len(body) > 1<<20 {
		s.fail(w, http.StatusRequestEntityTooLarge, "body: a replica set definition is at most 1 MiB")
		return
	}
	who := actor(r)
	res, err := s.opts.SetAdmin.CreateSet(body, Write{Ctx: r.Context(), Who: who})
	if s.setError(w, "", err) {
		return
	}
	setETag(w, res.Version)
	s.log.Info("admin create set", zap.String("set", res.Set), zap.Uint64("version", res.Version), zap.String("by", who.String()))
	s.write(w, http.StatusCreated, res)
}

func (s *Server) patchSet(w http.ResponseWriter, r *http.Request) {
	if s.opts.SetAdmin == nil {
		s.unavailable(w, "run-time replica sets")
		return
	}
	set := r.PathValue("set")
	var p SetPatch
	const want = `send {"replicas": N} with 1 <= N <= %d, {"stop": true} or {"stop": false}, or both`
	if err := decodeBody(r, 4<<10, &p); err != nil {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf("body: "+want+": %v; nothing changed", balancer.MaxReplicas, err))
		return
	}
	if p.Replicas == nil && p.Stop == nil {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf("body: nothing to change: "+want, balancer.MaxReplicas))
		return
	}
	if p.Replicas != nil && (*p.Replicas < 1 || *p.Replicas > balancer.MaxReplicas) {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf(`replicas: %d is out of range: send {"replicas": N} with 1 <= N <= %d`, *p.Replicas, balancer.MaxReplicas))
		return
	}
	ifMatch, ok := s.ifMatch(w, r)
	if !ok {
		return
	}
	who := actor(r)
	res, err := s.opts.SetAdmin.PatchSet(set, p, Write{Ctx: r.Context(), Who: who, IfMatch: ifMatch})
	if s.setError(w, set, err) {
		return
	}
	setETag(w, res.Version)
	s.log.Info("admin change set", zap.String("set", set), zap.String("action", res.Action), zap.Uint64("version", res.Version), zap.String("by", who.String()))
	s.reply(w, res)
}

func (s *Server) deleteSet(w http.ResponseWriter, r *http.Request) {
	if s.opts.SetAdmin == nil {
		s.unavailable(w, "run-time replica sets")
		return
	}
	s.setCommand(w, r, "admin delete set", s.opts.SetAdmin.DeleteSet)
}

func (s *Server) clearRuntime(w http.ResponseWriter, r *http.Request) {
	if s.opts.SetAdmin == nil {
		s.unavailable(w, "run-time replica sets")
		return
	}
	s.setCommand(w, r, "admin clear run-time state", s.opts.SetAdmin.ClearRuntime)
}

// setCommand runs a bodyless run-time change of the path's set (delete,
// clear), logs it as msg and answers its SetChange or its error.
func (s *Server) setCommand(w http.ResponseWriter, r *http.Request, msg string, do func(string, Write) (SetChange, error)) {
	set := r.PathValue("set")
	ifMatch, ok := s.ifMatch(w, r)
	if !ok {
		return
	}
	who := actor(r)
	res, err := do(set, Write{Ctx: r.Context(), Who: who, IfMatch: ifMatch})
	if s.setError(w, set, err) {
		return
	}
	setETag(w, res.Version)
	s.log.Info(msg, zap.String("set", set), zap.Uint64("version", res.Version), zap.String("by", who.String()))
	s.reply(w, res)
}

func (s *Server) getRuntime(w http.ResponseWriter, r *http.Request) {
	if s.opts.SetAdmin == nil {
		s.unavailable(w, "run-time replica sets")
		return
	}
	st := s.opts.SetAdmin.Runtime()
	if st.Records == nil {
		st.Records = []RuntimeRecord{}
	}
	if st.Problems == nil {
		st.Problems = []RuntimeProblem{}
	}
	s.reply(w, st)
}

func (s *Server) exportRuntime(w http.ResponseWriter, r *http.Request) {
	if s.opts.SetAdmin == nil {
		s.unavailable(w, "run-time replica sets")
		return
	}
	b, err := s.opts.SetAdmin.Export()
	if err != nil {
		s.fail(w, http.StatusInternalServerError, "export: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set(AdminHeader, "1")
	_, _ = w.Write(b)
}

// WriteRefused is the answer of a run-time change that is refused (409)
// or not confirmed (503): Current is the record that holds (409), Record
// the one this proxy wrote (503, Unconfirmed), Missing the proxies that
// did not acknowledge it.
type WriteRefused struct {
	Error       string         `json:"error"`
	Lost        bool           `json:"lost,omitempty"`
	Unconfirmed bool           `json:"unconfirmed,omitempty"`
	Current     *RuntimeRecord `json:"current,omitempty"`
	Record      *RuntimeRecord `json:"record,omitempty"`
	Missing     []string       `json:"missing,omitempty"`
}

// setETag answers a set's run-time version as its ETag.
func setETag(w http.ResponseWriter, version uint64) {
	w.Header().Set("ETag", `"`+strconv.FormatUint(version, 10)+`"`)
}

// ifMatch reads the If-Match header: one version, quoted ("123", as the
// ETag) or bare; "*" and an absent header mean no precondition. Anything
// else is answered 400 here (ok false).
func (s *Server) ifMatch(w http.ResponseWriter, r *http.Request) (v *uint64, ok bool) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" || h == "*" {
		return nil, true
	}
	n, err := strconv.ParseUint(strings.Trim(strings.TrimPrefix(h, "W/"), `"`), 10, 64)
	if err != nil {
		s.fail(w, http.StatusBadRequest, fmt.Sprintf(`If-Match: %q is not a version: send the ETag of GET /v1/replica_sets/{set} as it came ("123"), or leave the header out`, h))
		return nil, false
	}
	return &n, true
}

// setError answers err of a SetAdmin call, if any, and reports whether it
// did.
func (s *Server) setError(w http.ResponseWriter, set string, err error) bool {
	var spec *SpecError
	var inUse *InUseError
	var conflict *ConflictError
	var unconfirmed *UnconfirmedError
	switch {
	case err == nil:
		return false
	case errors.As(err, &conflict):
		setETag(w, conflict.Current.Version)
		s.write(w, http.StatusConflict, WriteRefused{Error: conflict.Message, Lost: conflict.Lost, Current: &conflict.Current})
	case errors.As(err, &unconfirmed):
		w.Header().Set("Retry-After", "1")
		s.write(w, http.StatusServiceUnavailable, WriteRefused{Error: unconfirmed.Message, Unconfirmed: true, Record: &unconfirmed.Record, Missing: unconfirmed.Missing})
	case errors.As(err, &spec):
		s.write(w, http.StatusBadRequest, ReloadRefused{Error: "the replica set definition is invalid; nothing changed", Problems: spec.Problems})
	case errors.As(err, &inUse):
		s.write(w, http.StatusBadRequest, ReloadRefused{Error: inUse.Error(), Problems: inUse.Replicas})
	case errors.Is(err, ErrSetExists), errors.Is(err, ErrObjectInTheWay):
		s.fail(w, http.StatusConflict, err.Error())
	case errors.Is(err, ErrUnknownSet) && s.opts.Sets != nil:
		s.unknownSet(w, set)
	case errors.Is(err, ErrUnknownSet), errors.Is(err, ErrNoRuntimeState):
		s.fail(w, http.StatusNotFound, err.Error())
	default:
		s.fail(w, http.StatusInternalServerError, err.Error())
	}
	return true
}
