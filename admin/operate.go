package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// POST /v1/reload re-reads the configuration file (bearer token). The
// run-time changes of replica sets are in sets.go.

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

func (s *Server) routeOperate(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/reload", s.authorized(s.reload))
	mux.HandleFunc("/v1/reload", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		s.fail(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on /v1/reload: use POST with Authorization: Bearer TOKEN", r.Method))
	})
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
