package admin

import (
	"fmt"
	"net/http"
)

// debugOnly guards the endpoints that show more than the routing state:
// /debug/pprof/ (goroutine stacks, heap contents, the command line) and
// /v1/config (the configuration, redacted, still a map of the deployment).
// admin.debug decides, once: the listener's address does not change while
// the process runs.
func (s *Server) debugOnly(h http.HandlerFunc) http.HandlerFunc {
	switch mode := s.cfg.debugMode(); mode {
	case DebugOpen:
		return h
	case DebugOff:
		return func(w http.ResponseWriter, r *http.Request) {
			s.fail(w, http.StatusNotFound, fmt.Sprintf("%s is not served: admin.debug is off", r.URL.Path))
		}
	default:
		why := "admin.debug is token"
		if s.cfg.Debug != DebugToken {
			why = fmt.Sprintf("admin.listen %q is not a loopback address and admin.debug is auto", s.cfg.Listen)
		}
		return func(w http.ResponseWriter, r *http.Request) {
			if !s.bearerOK(r) {
				s.unauthorized(w, fmt.Sprintf("%s needs the admin token here (%s): %s", r.URL.Path, why, sendToken))
				return
			}
			h(w, r)
		}
	}
}

// routeRest makes the rest of the admin listener answer in JSON like the
// API: a wrong method on /metrics, /healthz, /readyz, /ui and
// /debug/pprof/ is 405 with Allow, and a path nothing serves is 404.
// ServeMux's own answers to both are plain text.
func (s *Server) routeRest(mux *http.ServeMux) {
	for _, p := range []string{"/metrics", "/healthz", "/readyz", "/ui", "/ui/", "/debug/pprof/"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", "GET, HEAD")
			s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use GET", r.Method, r.URL.Path))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s: the admin listener serves /v1/ (docs/admin.md), /ui, /metrics, /healthz, /readyz and /debug/pprof/", r.URL.Path))
	})
}
