package agent

import (
	"context"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// waitDrainProbe waits, when drain.probe_path is set, until the replica
// answers 200 there (its own pending work is done) or drain.probe_timeout
// passes, polling every probe.interval. It runs in the drain sequence,
// after the proxies report the replica drained and before its process is
// stopped: a scale-in or a restart does not lose work the replica still
// holds after its last request. A set stop runs it too, and ends it early
// through ctx when the set is started again (or the agent shuts down).
func (a *Agent) waitDrainProbe(ctx context.Context) {
	path := a.cfg.Drain.ProbePath
	if path == "" {
		return
	}
	url := "http://" + a.cfg.Replica.Addr + path
	client := &http.Client{Timeout: a.cfg.Probe.Timeout}
	start := a.now()
	deadline := time.NewTimer(a.cfg.Drain.ProbeTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(a.cfg.Probe.Interval)
	defer tick.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		a.log.Warn("drain probe not possible", zap.String("url", url), zap.Error(err))
		return
	}
	last := ""
	for {
		status := "no answer"
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				a.metrics.drainProbe.WithLabelValues("done").Inc()
				a.log.Info("drain probe: the replica's own work is done", zap.String("url", url), zap.Duration("waited", a.now().Sub(start)))
				return
			}
			status = resp.Status
		} else if ctx.Err() != nil {
			return
		} else {
			status = err.Error()
		}
		if status != last {
			a.log.Info("drain probe: waiting for the replica's own work", zap.String("url", url), zap.String("answer", status))
			last = status
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		case <-deadline.C:
			a.metrics.drainProbe.WithLabelValues("timeout").Inc()
			a.log.Warn("drain probe did not answer 200 within drain.probe_timeout; stopping the replica anyway: work it still held may be lost",
				zap.String("url", url), zap.Duration("timeout", a.cfg.Drain.ProbeTimeout), zap.String("last_answer", last))
			return
		}
	}
}
