package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// throughputRun is one closed-loop run at maximum rate.
type throughputRun struct {
	Tool        string  `json:"tool"` // wrk or vegeta
	Seconds     float64 `json:"seconds"`
	Requests    int64   `json:"requests"`
	RPS         float64 `json:"rps"`
	Errors      int64   `json:"errors"` // non-2xx/3xx answers and socket errors
	ErrorDetail string  `json:"error_detail,omitempty"`
	// Proxy side, from /proc (zero for direct).
	CPUSeconds  float64 `json:"proxy_cpu_seconds,omitempty"`
	CPUUtil     float64 `json:"proxy_cpu_util,omitempty"` // CPU seconds / wall seconds (1 = one core busy)
	CPUPerReqUS float64 `json:"proxy_cpu_us_per_request,omitempty"`
	// SysPerReqUS is the part of CPUPerReqUS spent in the kernel (stime):
	// system calls, and the TCP work they do on loopback.
	SysPerReqUS float64 `json:"proxy_sys_us_per_request,omitempty"`
	// RPSPerCore is requests per CPU-second of the proxy: what one fully
	// busy core would serve, whether or not the load side kept it busy.
	RPSPerCore   float64 `json:"rps_per_proxy_core,omitempty"`
	PeakRSSBytes int64   `json:"proxy_peak_rss_bytes,omitempty"`
	Routing      routing `json:"routing"`
}

// loadSpec is how the load generator talks to the target.
type loadSpec struct {
	// tls: HTTPS with the run's certificate (nil: plain HTTP).
	tls *tlsFiles
	// newConn: every request on a new connection (Connection: close), so
	// that with tls every request costs a full handshake; always the
	// harness's own client (runNewConns).
	newConn bool
}

func (s loadSpec) url(addr string) string {
	if s.tls != nil {
		return "https://" + addr + "/ingest"
	}
	return "http://" + addr + "/ingest"
}

// setCPU records the proxy's CPU time over the run and what follows from it.
func (t *throughputRun) setCPU(seconds float64) {
	t.CPUSeconds = seconds
	if t.Seconds > 0 {
		t.CPUUtil = seconds / t.Seconds
	}
	if t.Requests > 0 {
		t.CPUPerReqUS = seconds / float64(t.Requests) * 1e6
	}
	if seconds > 0 {
		t.RPSPerCore = float64(t.Requests) / seconds
	}
}

// wrkScript sends POST /ingest with a body of bodySize bytes and an X-Key
// drawn uniformly from keyCount keys; the requests are prebuilt in init so
// that request() costs one table lookup. done() prints one JSON line.
const wrkScript = `
local keys = %d
local reqs = {}
init = function(args)
  math.randomseed(%d)
  local body = string.rep("x", %d)
  for i = 0, keys - 1 do
    reqs[i + 1] = wrk.format("POST", "/ingest", {["X-Key"] = string.format("key-%%05d", i)}, body)
  end
end
request = function()
  return reqs[math.random(keys)]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%%d,"duration_us":%%d,"connect":%%d,"read":%%d,"write":%%d,"status":%%d,"timeout":%%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout))
end
`

type wrkSummary struct {
	Requests   int64 `json:"requests"`
	DurationUS int64 `json:"duration_us"`
	Connect    int64 `json:"connect"`
	Read       int64 `json:"read"`
	Write      int64 `json:"write"`
	Status     int64 `json:"status"` // answers with status > 399
	Timeout    int64 `json:"timeout"`
}

func parseWrk(out []byte) (wrkSummary, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "WRKJSON "); ok {
			var s wrkSummary
			err := json.Unmarshal([]byte(rest), &s)
			return s, err
		}
	}
	return wrkSummary{}, fmt.Errorf("no WRKJSON line in wrk output: %q", tailString(string(out), 400))
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// runWrk runs wrk (pinned to cpu when cpu >= 0) against addr. wrk does
// not verify the certificate; OpenSSL still checks the server's signature
// in every full handshake.
func runWrk(ctx context.Context, dir string, cpu int, addr string, cfg *Config, spec loadSpec, d time.Duration, seed int) (throughputRun, error) {
	script := filepath.Join(dir, "post.lua")
	if err := os.WriteFile(script, fmt.Appendf(nil, wrkScript, cfg.Keys, seed, cfg.Body), 0o644); err != nil {
		return throughputRun{}, err
	}
	secs := max(1, int(math.Round(d.Seconds())))
	argv := []string{"wrk", "-t1", "-c" + strconv.Itoa(cfg.Connections), "-d" + strconv.Itoa(secs) + "s",
		"--timeout", "5s", "-s", script, spec.url(addr)}
	if cpu >= 0 {
		argv = append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return throughputRun{}, fmt.Errorf("wrk: %w: %s", err, tailString(string(out), 400))
	}
	s, err := parseWrk(out)
	if err != nil {
		return throughputRun{}, err
	}
	r := throughputRun{Tool: "wrk", Seconds: float64(s.DurationUS) / 1e6, Requests: s.Requests}
	if r.Seconds > 0 {
		r.RPS = float64(r.Requests) / r.Seconds
	}
	r.Errors = s.Connect + s.Read + s.Write + s.Status + s.Timeout
	if r.Errors > 0 {
		r.ErrorDetail = fmt.Sprintf("connect %d, read %d, write %d, status>399 %d, timeout %d", s.Connect, s.Read, s.Write, s.Status, s.Timeout)
	}
	return r, nil
}

// keyTargeter returns a vegeta Targeter sending POST /ingest with a body of
// bodySize bytes and X-Key drawn uniformly (seeded, so runs are
// repeatable) from keyCount keys. It is safe for concurrent use.
func keyTargeter(url string, keyCount, bodySize int, seed uint64) vegeta.Targeter {
	rng := rand.New(rand.NewPCG(seed, 0x6b6579776179))
	const n = 1 << 16
	order := make([]int, n)
	for i := range order {
		order[i] = rng.IntN(keyCount)
	}
	hdrs := make([]http.Header, keyCount)
	for i := range hdrs {
		hdrs[i] = http.Header{"X-Key": {keyName(i)}}
	}
	body := bytes.Repeat([]byte("x"), bodySize)
	var next atomic.Uint64
	return func(t *vegeta.Target) error {
		i := order[next.Add(1)%n]
		*t = vegeta.Target{Method: http.MethodPost, URL: url, Body: body, Header: hdrs[i]}
		return nil
	}
}

// newHTTPClient is the client vegeta attacks through: keep-alive, loopback
// only, no compression, connections shared between the warm-up and the
// measured attack. With TLS it speaks HTTP/1.1 (a custom TLS config turns
// off net/http's HTTP/2).
func newHTTPClient(conns int, spec loadSpec) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns * 2,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	if spec.tls != nil {
		tr.TLSClientConfig = spec.tls.clientConfig()
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

// attackResult is what one vegeta attack produced.
type attackResult struct {
	requests  int64
	errors    int64
	answered  int64 // requests that got an HTTP answer, whatever its status
	firstErr  string
	latencies []time.Duration // of successful (2xx) requests, sorted
	sendLags  []time.Duration // with keep at a fixed rate: how late each request was sent, sorted
	seconds   float64
}

// attack runs vegeta against addr: at rate requests per second (open loop)
// or, with rate 0, as fast as workers allow (closed loop).
func attack(ctx context.Context, client *http.Client, tr vegeta.Targeter, rate, workers int, d time.Duration, keep bool) attackResult {
	opts := []func(*vegeta.Attacker){vegeta.Client(client), vegeta.Workers(uint64(workers)), vegeta.KeepAlive(true), vegeta.Redirects(vegeta.NoFollow)}
	pacer := vegeta.Rate{Freq: rate, Per: time.Second}
	if rate <= 0 {
		opts = append(opts, vegeta.MaxWorkers(uint64(workers)))
		pacer = vegeta.Rate{Freq: 0}
	} else {
		opts = append(opts, vegeta.MaxWorkers(uint64(max(workers, 1000))))
	}
	a := vegeta.NewAttacker(opts...)
	var out attackResult
	var interval time.Duration
	if keep && rate > 0 {
		n := int(float64(rate)*d.Seconds()*1.05) + 16
		out.latencies = make([]time.Duration, 0, n)
		out.sendLags = make([]time.Duration, 0, n)
		// vegeta's constant pacer sends request seq (from 0) at
		// (seq+1) intervals after the attack began.
		interval = time.Second / time.Duration(rate)
	}
	start := time.Now()
	stop := context.AfterFunc(ctx, func() { a.Stop() })
	defer stop()
	for res := range a.Attack(tr, pacer, d, "") {
		out.requests++
		if res.Code != 0 {
			out.answered++
		}
		if interval > 0 {
			due := start.Add(time.Duration(res.Seq+1) * interval)
			out.sendLags = append(out.sendLags, max(res.Timestamp.Sub(due), 0))
		}
		if res.Error != "" || res.Code < 200 || res.Code > 299 {
			out.errors++
			if out.firstErr == "" {
				out.firstErr = strings.TrimSpace(res.Error + " " + strconv.Itoa(int(res.Code)))
			}
			continue
		}
		if keep {
			out.latencies = append(out.latencies, res.Latency)
		}
	}
	out.seconds = time.Since(start).Seconds()
	slices.Sort(out.latencies)
	slices.Sort(out.sendLags)
	return out
}

// runVegetaMax is the fallback closed-loop throughput run when wrk is not
// installed: conns workers, each with its own keep-alive connection.
func runVegetaMax(ctx context.Context, addr string, cfg *Config, spec loadSpec, d time.Duration, seed uint64) (throughputRun, error) {
	client := newHTTPClient(cfg.Connections, spec)
	defer client.CloseIdleConnections()
	res := attack(ctx, client, keyTargeter(spec.url(addr), cfg.Keys, cfg.Body, seed), 0, cfg.Connections, d, false)
	if err := ctx.Err(); err != nil {
		return throughputRun{}, err
	}
	r := throughputRun{Tool: "vegeta", Seconds: res.seconds, Requests: res.requests - res.errors, Errors: res.errors}
	if r.Seconds > 0 {
		r.RPS = float64(r.Requests) / r.Seconds
	}
	if res.errors > 0 {
		r.ErrorDetail = "first: " + res.firstErr
	}
	return r, nil
}

// latencyRun is one open-loop run at a fixed rate.
type latencyRun struct {
	Rate     int     `json:"rate"`
	Requests int64   `json:"requests"` // sent
	Errors   int64   `json:"errors"`   // transport errors and non-2xx answers
	FirstErr string  `json:"first_error,omitempty"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p99_9_ms"`
	Max      float64 `json:"max_ms"`
	// Over direct in the same round (nil without a direct run).
	AddedP50 *float64 `json:"added_p50_ms,omitempty"`
	AddedP99 *float64 `json:"added_p99_ms,omitempty"`
	// Answered counts the requests that got an HTTP answer, whatever its
	// status (Requests minus transport errors): every one of them cost
	// the proxy a full request, so it is what CPU per request divides by.
	Answered int64 `json:"answered"`
	// AchievedRate is the requests vegeta sent ÷ the run's duration.
	// UnderRate is set when it is below heldShare of Rate: the load side
	// could not hold the rate, so the run's figures are from a lower rate
	// than its label.
	AchievedRate float64 `json:"achieved_rate"`
	UnderRate    bool    `json:"under_rate,omitempty"`
	// SendLagP99 is the p99 of how late vegeta sent each request against
	// its schedule, ms. vegeta catches up after a stall by sending the
	// backlog at once, so the achieved rate can hold while the load came
	// in bursts; a lag of many ms shows that.
	SendLagP99 float64 `json:"send_lag_p99_ms"`
	// Proxy side, from /proc over the measured part only (not the
	// warm-up); nil for direct, which has no proxy process.
	CPUSeconds *float64 `json:"proxy_cpu_seconds,omitempty"`
	// SysPerReqUS is the kernel's part (stime) of CPUPerReqUS.
	SysPerReqUS *float64 `json:"proxy_sys_us_per_request,omitempty"`
	CPUUtil     *float64 `json:"proxy_cpu_util,omitempty"` // CPU seconds ÷ wall seconds of the attack (1 = one core busy)
	CPUPerReqUS *float64 `json:"proxy_cpu_us_per_request,omitempty"`

	samples []time.Duration // sorted; pooled across rounds for the plot
}

// heldShare is the share of the requested rate the load side must send
// for a latency run to count as at that rate.
const heldShare = 0.97

// underRate reports whether the load side sent less than heldShare of
// the requested rate. A run without an achieved rate (from a report
// written before it was recorded) is not flagged.
func (l *latencyRun) underRate() bool {
	return l.AchievedRate > 0 && l.AchievedRate < heldShare*float64(l.Rate)
}

// setCPU records the proxy's CPU time over the measured attack of wall
// seconds, and what follows from it.
func (l *latencyRun) setCPU(seconds, wall float64) {
	l.CPUSeconds = &seconds
	if wall > 0 {
		u := seconds / wall
		l.CPUUtil = &u
	}
	if l.Answered > 0 {
		us := seconds / float64(l.Answered) * 1e6
		l.CPUPerReqUS = &us
	}
}

// runLatency warms the connections up for warm at the rate, then measures
// d of open-loop load. pid is the proxy's process (0 for direct): its
// tree's CPU time is read before and after the measured attack.
func runLatency(ctx context.Context, addr string, cfg *Config, rate int, warm, d time.Duration, seed uint64, pid int) (latencyRun, error) {
	client := newHTTPClient(64, loadSpec{})
	defer client.CloseIdleConnections()
	tr := keyTargeter(loadSpec{}.url(addr), cfg.Keys, cfg.Body, seed)
	if warm > 0 {
		attack(ctx, client, tr, rate, 16, warm, false)
	}
	var cpu0, sys0 float64
	if pid > 0 {
		var err error
		if cpu0, sys0, err = treeCPUSys(pid); err != nil {
			return latencyRun{}, fmt.Errorf("proxy stats: %w", err)
		}
	}
	res := attack(ctx, client, tr, rate, 16, d, true)
	var cpu1, sys1 float64
	if pid > 0 {
		var err error
		if cpu1, sys1, err = treeCPUSys(pid); err != nil {
			return latencyRun{}, fmt.Errorf("proxy stats: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return latencyRun{}, err
	}
	lr, err := newLatencyRun(res, rate, d)
	if err != nil {
		return latencyRun{}, err
	}
	if pid > 0 {
		lr.setCPUSys(cpu1-cpu0, sys1-sys0, res.seconds)
	}
	return lr, nil
}

// newLatencyRun summarises an open-loop attack of d at rate.
func newLatencyRun(res attackResult, rate int, d time.Duration) (latencyRun, error) {
	if len(res.latencies) == 0 {
		return latencyRun{}, errors.New("no successful request: " + res.firstErr)
	}
	lr := latencyRun{Rate: rate, Requests: res.requests, Errors: res.errors, FirstErr: res.firstErr, Answered: res.answered, samples: res.latencies}
	lr.P50 = ms(percentile(res.latencies, 50))
	lr.P99 = ms(percentile(res.latencies, 99))
	lr.P999 = ms(percentile(res.latencies, 99.9))
	lr.Max = ms(res.latencies[len(res.latencies)-1])
	lr.AchievedRate = float64(res.requests) / d.Seconds()
	lr.UnderRate = lr.underRate()
	lr.SendLagP99 = ms(percentile(res.sendLags, 99))
	return lr, nil
}

// setCPUSys is setCPU plus the kernel's part (sys) of the CPU seconds.
func (l *latencyRun) setCPUSys(seconds, sys, wall float64) {
	l.setCPU(seconds, wall)
	if l.Answered > 0 {
		us := sys / float64(l.Answered) * 1e6
		l.SysPerReqUS = &us
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// percentile returns the nearest-rank p-th percentile of sorted samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps 99.9% of 1000 at rank 999 despite float rounding.
	i := int(math.Ceil(p/100*float64(len(sorted))-1e-9)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
