package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// The read half of the admin API: JSON over net/http
// ServeMux patterns. Every answer, errors included, is a JSON document;
// errors are {"error": "..."} with 400 for a bad or missing query
// parameter, 404 for an unknown set or path, 405 for a wrong method and
// 501 for a source this process does not have.

// defaultEventLimit bounds /v1/events when the request gives no limit.
const defaultEventLimit = 100

// apiRoutes are the read endpoints' paths; each also gets a method-less
// pattern that answers 405 in JSON (ServeMux's own 405 is plain text).
var apiRoutes = []string{
	"/v1/{$}",
	"/v1/replica_sets",
	"/v1/replica_sets/{set}",
	"/v1/replica_sets/{set}/replicas",
	"/v1/members",
	"/v1/fleet",
	"/v1/route",
	"/v1/events",
	"/v1/config",
}

func (s *Server) routeAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/{$}", s.apiInfo)
	mux.HandleFunc("GET /v1/replica_sets", s.listSets)
	mux.HandleFunc("GET /v1/replica_sets/{set}", s.getSet)
	mux.HandleFunc("GET /v1/replica_sets/{set}/replicas", s.getReplicas)
	mux.HandleFunc("GET /v1/members", s.listMembers)
	mux.HandleFunc("GET /v1/fleet", s.getFleet)
	mux.HandleFunc("GET /v1/route", s.route)
	mux.HandleFunc("GET /v1/events", s.listEvents)
	mux.HandleFunc("GET /v1/config", s.debugOnly(s.getConfig))
	for _, p := range apiRoutes {
		allow, use := "GET, HEAD", "use GET"
		switch p {
		case "/v1/replica_sets/{set}":
			allow, use = "GET, HEAD, PATCH, DELETE", `use GET; PATCH with {"replicas": N} or {"stop": true|false}, or DELETE, with the bearer token`
		case "/v1/replica_sets":
			allow, use = "GET, HEAD, POST", "use GET, or POST a set definition with the bearer token"
		}
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: %s", r.Method, r.URL.Path, use))
		})
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s; see docs/admin.md", r.URL.Path))
	})
}

func (s *Server) listSets(w http.ResponseWriter, r *http.Request) {
	if s.opts.Sets == nil {
		s.unavailable(w, "replica sets")
		return
	}
	sets := s.opts.Sets.Sets()
	for i := range sets {
		sets[i].Replicas = nil
	}
	s.reply(w, SetList{ReplicaSets: nonNil(sets)})
}

func (s *Server) getSet(w http.ResponseWriter, r *http.Request) {
	if st, ok := s.lookupSet(w, r.PathValue("set")); ok {
		setETag(w, st.Version)
		// "replicas": [] for a set without any: the field's omitempty is
		// for the list endpoint, which leaves it out.
		s.reply(w, struct {
			SetStatus
			Replicas []ReplicaStatus `json:"replicas"`
		}{st, nonNil(st.Replicas)})
	}
}

func (s *Server) getReplicas(w http.ResponseWriter, r *http.Request) {
	if st, ok := s.lookupSet(w, r.PathValue("set")); ok {
		s.reply(w, ReplicaList{Set: st.Name, Replicas: nonNil(st.Replicas)})
	}
}

// lookupSet finds a set or answers 404 (or 501) itself.
func (s *Server) lookupSet(w http.ResponseWriter, name string) (SetStatus, bool) {
	if s.opts.Sets == nil {
		s.unavailable(w, "replica sets")
		return SetStatus{}, false
	}
	st, ok := s.opts.Sets.Set(name)
	if !ok {
		s.unknownSet(w, name)
	}
	return st, ok
}

func (s *Server) unknownSet(w http.ResponseWriter, name string) {
	var known []string
	for _, st := range s.opts.Sets.Sets() {
		known = append(known, st.Name)
	}
	s.fail(w, http.StatusNotFound, fmt.Sprintf("unknown replica set %q; known sets: %s", name, strings.Join(known, ", ")))
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if s.opts.Sets == nil {
		s.unavailable(w, "replica sets")
		return
	}
	q := r.URL.Query()
	set, key := q.Get("set"), q.Get("key")
	switch {
	case set == "":
		s.fail(w, http.StatusBadRequest, "missing query parameter set: use /v1/route?set=SET&key=KEY")
		return
	case key == "":
		s.fail(w, http.StatusBadRequest, "missing query parameter key: use /v1/route?set=SET&key=KEY")
		return
	}
	ex, err := s.opts.Sets.Route(set, key)
	switch {
	case errors.Is(err, ErrUnknownSet):
		s.unknownSet(w, set)
	case err != nil:
		s.fail(w, http.StatusInternalServerError, err.Error())
	default:
		ex.Candidates = nonNil(ex.Candidates)
		s.reply(w, ex)
	}
}

func (s *Server) listMembers(w http.ResponseWriter, r *http.Request) {
	if s.opts.Members == nil {
		s.unavailable(w, "gossip members")
		return
	}
	s.reply(w, MemberList{Members: nonNil(s.opts.Members.Members())})
}

func (s *Server) getFleet(w http.ResponseWriter, r *http.Request) {
	if s.opts.Fleet == nil {
		s.unavailable(w, "the fleet view")
		return
	}
	f := s.opts.Fleet.Fleet()
	f.Sets, f.Proxies = nonNil(f.Sets), nonNil(f.Proxies)
	s.reply(w, f)
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	if s.opts.Events == nil {
		s.unavailable(w, "audit events")
		return
	}
	q := r.URL.Query()
	eq := EventQuery{Partition: -1, Limit: defaultEventLimit, Replica: q.Get("replica"), Key: q.Get("key")}
	for name, dst := range map[string]*time.Time{"since": &eq.Since, "until": &eq.Until} {
		if v := q.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				s.fail(w, http.StatusBadRequest, fmt.Sprintf("bad query parameter %s: %q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", name, v))
				return
			}
			*dst = t
		}
	}
	eq.Kinds = splitParam(q.Get("kind"))
	for _, set := range splitParam(q.Get("set")) {
		if set == "-" {
			set = "" // the events of no set
		}
		eq.Sets = append(eq.Sets, set)
	}
	if v := q.Get("partition"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			s.fail(w, http.StatusBadRequest, fmt.Sprintf("bad query parameter partition: %q is not a partition (0 or more)", v))
			return
		}
		eq.Partition = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.fail(w, http.StatusBadRequest, fmt.Sprintf("bad query parameter limit: %q is not a positive integer", v))
			return
		}
		eq.Limit = n
	}
	evs, err := s.opts.Events.Events(eq)
	if err != nil {
		s.fail(w, http.StatusBadRequest, "bad query: "+strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	s.reply(w, EventList{Events: nonNil(evs)})
}

// splitParam splits a comma-separated query parameter, dropping blanks.
func splitParam(v string) []string {
	var out []string
	for _, k := range strings.Split(v, ",") {
		if k = strings.TrimSpace(k); k != "" {
			out = append(out, k)
		}
	}
	return out
}

func (s *Server) getConfig(w http.ResponseWriter, r *http.Request) {
	if s.opts.Config == nil {
		s.unavailable(w, "configuration")
		return
	}
	s.reply(w, s.opts.Config.Config())
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (s *Server) reply(w http.ResponseWriter, v any) {
	s.write(w, http.StatusOK, v)
}

func (s *Server) unavailable(w http.ResponseWriter, what string) {
	s.fail(w, http.StatusNotImplemented, what+" not available on this process")
}

func (s *Server) fail(w http.ResponseWriter, status int, msg string) {
	s.write(w, status, ErrorBody{Error: msg})
}

func (s *Server) write(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep "&" readable in messages and keys
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		s.log.Error("admin: encoding a response", zap.Error(err))
		status = http.StatusInternalServerError
		buf.Reset()
		_ = json.NewEncoder(&buf).Encode(map[string]string{"error": "encoding the response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set(AdminHeader, "1")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}
