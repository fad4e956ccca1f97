package admin

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestUIPage(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0"}, Options{Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		s.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://localhost"+path, nil))
		b, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, rec.Header().Get("Content-Type"), string(b)
	}

	for _, path := range []string{"/ui", "/ui/"} {
		code, ctype, body := get(path)
		if code != http.StatusOK || !strings.HasPrefix(ctype, "text/html") {
			t.Fatalf("GET %s: %d %q, want 200 text/html", path, code, ctype)
		}
		for _, want := range []string{`id="sets"`, `id="route-form"`, `name="key"`, `id="route-result"`, `id="events"`, `id="error"`, `src="/ui/app.js"`, `href="/ui/style.css"`} {
			if !strings.Contains(body, want) {
				t.Errorf("GET %s: page lacks %s", path, want)
			}
		}
	}
	// The script builds the cards and rows with the classes and data
	// attributes the browser test and operators' scripts rely on.
	code, ctype, js := get("/ui/app.js")
	if code != http.StatusOK || !strings.Contains(ctype, "javascript") {
		t.Fatalf("GET /ui/app.js: %d %q", code, ctype)
	}
	for _, want := range []string{`"set-card`, `"data-set"`, `"phase"`, `"replica-row"`, `"data-replica"`, "/v1/replica_sets", "/v1/route?", "/v1/events", "no replicas yet — start agents or add static replicas", "setInterval(refresh, REFRESH_MS)", "REFRESH_MS = 2000",
		`"num rate"`, `"num errors"`, `"set-rate`, "requests_per_second", "errors_per_second", "requests_total", "errors_total", "rate: measuring",
		`"num latency"`, "mean_latency_seconds", "p99_latency_seconds", `"num share"`, "(stand-ins serve it)", `"data-out"`,
		"state_seconds", "rotation_seconds", `"state-since"`, `"rotation-since"`, `"data-seconds"`,
		// A failed restart's mark: shown while the API marks it, with its
		// time and error, and a button that acknowledges it.
		"if (!r.mark) return null", "restart-mark", "fmtDateTime(r.finished)", "r.error", `"restart-ack"`, `"/restart/ack"`, "Bearer "} {
		if !strings.Contains(js, want) {
			t.Errorf("app.js lacks %s", want)
		}
	}
	code, ctype, css := get("/ui/style.css")
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/css") {
		t.Errorf("GET /ui/style.css: %d %q", code, ctype)
	}
	if !strings.Contains(css, ".bar.out") || !strings.Contains(css, "repeating-linear-gradient") {
		t.Errorf("style.css has no hatched .bar.out for a replica out of rotation")
	}
	if code, ctype, _ := get("/ui/nope.js"); code != http.StatusNotFound || ctype != "application/json" {
		t.Errorf("GET /ui/nope.js: %d %q, want a JSON 404", code, ctype)
	}

	// No external assets: nothing the page loads names another origin.
	err = fs.WalkDir(uiAssets, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(uiAssets, path)
		if err != nil {
			return err
		}
		// The SVG namespace (sparklines) is a name, not a fetch.
		text := strings.ReplaceAll(string(b), `"http://www.w3.org/2000/svg"`, "")
		for _, bad := range []string{"http://", "https://", "//fonts.", "@import"} {
			if strings.Contains(text, bad) {
				t.Errorf("ui/%s contains %q: the dashboard must not load external assets", path, bad)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
