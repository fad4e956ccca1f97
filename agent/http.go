package agent

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"keyway/balancer"
)

// newHTTPServer builds the agent's own HTTP server:
//
//	GET /healthz  200 "ok" while the process runs (liveness)
//	GET /readyz   200 "ready" when the advertised state is ready, else 503
//	              naming the state ("not ready: draining")
//	GET /metrics  Prometheus text from g
func (a *Agent) newHTTPServer(g prometheus.Gatherer) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		s := a.State()
		if s == balancer.StateReady {
			_, _ = w.Write([]byte("ready\n"))
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: " + s.String() + "\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      zap.NewStdLog(a.log),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          zap.NewStdLog(a.log),
	}
}
