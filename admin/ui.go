package admin

import (
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
)

// The dashboard: one page embedded in the binary, plain
// HTML, CSS and JavaScript with no build step and no external assets. It
// polls the read API under /v1/ every 2 s; see docs/dashboard.md.

//go:embed ui/index.html ui/app.js ui/style.css
var uiFiles embed.FS

// uiAssets is the ui/ directory itself, served under /ui/.
var uiAssets = func() fs.FS {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}()

// routeUI registers GET /ui (the page) and GET /ui/ (its assets; /ui/
// itself is the page too).
func (s *Server) routeUI(mux *http.ServeMux) {
	page := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		http.ServeFileFS(w, r, uiAssets, "index.html")
	}
	assets := http.StripPrefix("/ui/", http.FileServerFS(uiAssets))
	mux.HandleFunc("GET /ui", page)
	mux.HandleFunc("GET /ui/{$}", page)
	mux.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A missing asset is a JSON 404 like every other unknown path of
		// the admin listener (the file server's own is plain text).
		if st, err := fs.Stat(uiAssets, strings.TrimPrefix(r.URL.Path, "/ui/")); err != nil || st.IsDir() {
			s.fail(w, http.StatusNotFound, fmt.Sprintf("no dashboard file %s: the dashboard is /ui", r.URL.Path))
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		assets.ServeHTTP(w, r)
	}))
}
