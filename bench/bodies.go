package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/proxy"
)

// The body-throughput mode (-bodies 1MiB,64MiB): how fast each proxy
// moves large request bodies through one core, and what memory that
// takes. One replica reads each body from its stream and holds none of
// it (startBodyReplica); the harness's own client (runBodyLoad) keeps
// -body-conns keep-alive connections busy with POSTs of one size for
// -duration, closed loop, each body written from one fixed buffer. Each
// target and size gets a fresh process per round, so that its peak RSS
// (VmHWM) is that size's alone. Figures per target and size: MB/s of
// body (10^6 bytes) through the proxy, the proxy's CPU seconds per GB
// (10^9 bytes) and MB/s per busy proxy core, and its peak RSS: a proxy
// that buffers whole bodies shows there.
//
// Each proxy is set up to stream (bodyTargetConfig): keyway's set takes
// bodies up to the largest size; nginx buffers neither the request nor
// the reply and caps no body; HAProxy and Caddy stream by default;
// gofloor streams with fasthttp's StreamRequestBody. Every timeout that
// could cut a long body is 10 minutes.

// maxBodySize is the largest body the mode sends: keyway's
// max_body_bytes cap.
const maxBodySize = 1 << 30

// bodyTimeout is every target's timeout that could cut a streamed body
// (reading it, sending it on, the whole exchange with the replica).
const bodyTimeout = 10 * time.Minute

// parseBodies reads -bodies: comma-separated sizes with an optional unit
// (1MiB, 64MiB, 500KB, 4096), each 1B..1GiB, no size twice.
func parseBodies(s string) ([]proxy.ByteSize, error) {
	var out []proxy.ByteSize
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := proxy.ParseByteSize(f)
		if err != nil {
			return nil, fmt.Errorf("-bodies: %w", err)
		}
		if n < 1 || n > maxBodySize {
			return nil, fmt.Errorf("-bodies: %s: want 1B..1GiB (keyway's max_body_bytes cap)", f)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("-bodies: %s given twice", n)
		}
		out = append(out, n)
	}
	return out, nil
}

// bodyTargetConfig is what the proxies' streaming settings are derived
// from.
type bodyTargetConfig struct {
	maxBody int64 // the largest body of the run, bytes
}

// bodyTargetEnv is the targets' body settings for sizes: nil without
// sizes (the other modes).
func bodyTargetEnv(sizes []proxy.ByteSize) *bodyTargetConfig {
	if len(sizes) == 0 {
		return nil
	}
	return &bodyTargetConfig{maxBody: int64(slices.Max(sizes))}
}

// startBodyReplica starts the mode's one replica: a fasthttp server
// with StreamRequestBody that reads each body from the connection into a
// pooled buffer, keeping none of it, counts its bytes and answers 200
// "ok\n" (400 if the body ended early).
func startBodyReplica(name string) (*replica, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("replica %s: %w", name, err)
	}
	r := &replica{name: name, ln: ln, done: make(chan error, 1)}
	bufs := sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}
	handle := func(ctx *fasthttp.RequestCtx) {
		r.reqs.Add(1)
		var n int64
		if s := ctx.RequestBodyStream(); s != nil {
			// Not io.Copy to io.Discard: its ReadFrom reads 8 KiB at a
			// time, four times the system calls of the proxy's side
			// on the harness's core.
			bp := bufs.Get().(*[]byte)
			defer bufs.Put(bp)
			for {
				m, err := s.Read(*bp)
				n += int64(m)
				if err == io.EOF {
					break
				}
				if err != nil {
					r.bodyBytes.Add(n)
					ctx.Error("body: "+err.Error(), fasthttp.StatusBadRequest)
					return
				}
			}
		} else {
			n = int64(len(ctx.Request.Body()))
		}
		r.bodyBytes.Add(n)
		ctx.SetBody(okBody)
	}
	r.srv = &fasthttp.Server{
		Handler:               handle,
		StreamRequestBody:     true,
		ReadTimeout:           bodyTimeout,
		WriteTimeout:          bodyTimeout,
		IdleTimeout:           30 * time.Minute,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
	}
	go func() { r.done <- r.srv.Serve(ln) }()
	return r, nil
}

// bodyReader reads left bytes of buf, over and over: a request body of
// any size from one buffer. WriteTo hands buf's slices straight to the
// connection, so io.Copy copies nothing in user space.
type bodyReader struct {
	buf  []byte
	left int64
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(int64(len(p)), r.left)], r.buf)
	r.left -= int64(n)
	return n, nil
}

func (r *bodyReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for r.left > 0 {
		n, err := w.Write(r.buf[:min(int64(len(r.buf)), r.left)])
		total += int64(n)
		r.left -= int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// bodyLoad is what one closed-loop body run did.
type bodyLoad struct {
	seconds  float64 // from the start to the last answer
	requests int64   // answered 200
	bytes    int64   // body bytes of those requests
	errors   int64   // transport errors and answers other than 200
	firstErr string
}

// runBodyLoad sends POST /ingest with a body of size bytes over conns
// keep-alive connections to addr, one request after the other on each,
// until d has passed; a request under way then is finished and counted,
// and the run lasts until the last answer. Every answer must be 200. A
// connection that fails is dialled again; one that cannot be dialled
// stops. body is shared and only read.
func runBodyLoad(ctx context.Context, addr string, size int64, conns int, d time.Duration, body []byte) bodyLoad {
	start := time.Now()
	end := start.Add(d)
	// Long enough for a body at 10 MB/s, never under 30 s.
	timeout := max(30*time.Second, time.Duration(size/10e6)*time.Second)
	var (
		mu  sync.Mutex
		out bodyLoad
		wg  sync.WaitGroup
	)
	last := start
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			head := fmt.Appendf(nil, "POST /ingest HTTP/1.1\r\nHost: %s\r\nX-Key: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", addr, keyName(i), size)
			var (
				c                  net.Conn
				br                 *bufio.Reader
				resp               fasthttp.Response
				reqs, errs, nbytes int64
				firstErr           string
				done               time.Time
			)
			rd := &bodyReader{buf: body}
			// A cancelled run closes the connection, so that a request
			// under way ends at once.
			unhook := func() bool { return false }
			closeConn := func() {
				if c != nil {
					unhook()
					c.Close()
					c = nil
				}
			}
			defer closeConn()
			fail := func(err error) {
				errs++
				if firstErr == "" {
					firstErr = err.Error()
				}
				closeConn()
			}
			for ctx.Err() == nil && time.Now().Before(end) {
				if c == nil {
					var err error
					if c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr); err != nil {
						fail(err)
						break
					}
					conn := c
					unhook = context.AfterFunc(ctx, func() { conn.Close() })
					br = bufio.NewReaderSize(c, 4<<10)
				}
				_ = c.SetDeadline(time.Now().Add(timeout))
				rd.left = size
				_, err := c.Write(head)
				if err == nil {
					_, err = io.Copy(c, rd)
				}
				if err == nil {
					err = resp.ReadLimitBody(br, 1<<20)
				}
				if err == nil && resp.StatusCode() != fasthttp.StatusOK {
					err = fmt.Errorf("status %d: %q", resp.StatusCode(), tailString(string(resp.Body()), 200))
				}
				if err != nil {
					fail(err)
					continue
				}
				reqs++
				nbytes += size
				done = time.Now()
				if resp.ConnectionClose() {
					closeConn()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			out.requests += reqs
			out.bytes += nbytes
			out.errors += errs
			if out.firstErr == "" {
				out.firstErr = firstErr
			}
			if done.After(last) {
				last = done
			}
		}()
	}
	wg.Wait()
	out.seconds = last.Sub(start).Seconds()
	return out
}

// BodyRun is one target at one body size in one round, on a fresh
// process.
type BodyRun struct {
	Round   int            `json:"round"`
	Target  string         `json:"target"`
	Size    proxy.ByteSize `json:"body_bytes"`
	LoadAvg string         `json:"loadavg"`
	Seconds float64        `json:"seconds"`
	// Requests answered 200, and their body bytes.
	Requests int64 `json:"requests"`
	Bytes    int64 `json:"bytes"`
	// MBps is body bytes through the proxy per second, 10^6 bytes.
	MBps float64 `json:"mb_per_second"`
	// ReplicaBytes is what the replica read over the measured run; it
	// equals Bytes unless a body was cut.
	ReplicaBytes int64  `json:"replica_bytes"`
	Errors       int64  `json:"errors"` // transport errors and answers other than 200
	FirstError   string `json:"first_error,omitempty"`
	// The proxy's side (zero for direct): CPU seconds over the measured
	// run (user + system; SysSeconds the system part), cores busy, CPU
	// seconds per GB (10^9 bytes) of body and MB/s per busy core.
	CPUSeconds  float64 `json:"proxy_cpu_seconds,omitempty"`
	SysSeconds  float64 `json:"proxy_sys_seconds,omitempty"`
	CPUUtil     float64 `json:"proxy_cpu_util,omitempty"`
	CPUPerGB    float64 `json:"proxy_cpu_seconds_per_gb,omitempty"`
	SysPerGB    float64 `json:"proxy_sys_seconds_per_gb,omitempty"`
	MBpsPerCore float64 `json:"mb_per_second_per_proxy_core,omitempty"`
	// RSSStartBytes is the proxy's RSS once it answered, before any
	// body; PeakRSSBytes its VmHWM after the run (warm-up included).
	RSSStartBytes int64 `json:"proxy_rss_start_bytes,omitempty"`
	PeakRSSBytes  int64 `json:"proxy_peak_rss_bytes,omitempty"`
	// SyscallsPerMiB is the proxy's system calls per MiB of body by name
	// ("all": every call), from perf stat during an extra run after the
	// measured one in the last round (-syscalls).
	SyscallsPerMiB map[string]float64 `json:"syscalls_per_mib,omitempty"`
	Failure        string             `json:"failure,omitempty"`
}

// setCPU records the proxy's CPU over the run and what follows from it.
func (b *BodyRun) setCPU(cpu, sys float64) {
	b.CPUSeconds, b.SysSeconds = cpu, sys
	if b.Seconds > 0 {
		b.CPUUtil = cpu / b.Seconds
	}
	if b.Bytes > 0 {
		b.CPUPerGB = cpu / (float64(b.Bytes) / 1e9)
		b.SysPerGB = sys / (float64(b.Bytes) / 1e9)
	}
	if cpu > 0 {
		b.MBpsPerCore = float64(b.Bytes) / 1e6 / cpu
	}
}

// measureBodies runs every round of the body mode: in each, every target
// in an order that rotates by round, each size on a fresh process.
func (h *Harness) measureBodies(ctx context.Context) []BodyRun {
	largest := slices.Max(h.cfg.Bodies)
	// One buffer for every body: 256 KiB, or the largest body if smaller.
	body := []byte(strings.Repeat("x", int(min(largest, 256<<10))))
	var out []BodyRun
	for round := range h.cfg.Rounds {
		for i := range h.targets {
			t := h.targets[(i+round)%len(h.targets)]
			for _, size := range h.cfg.Bodies {
				if ctx.Err() != nil {
					return out
				}
				br := h.bodyRun(ctx, t, round, size, body)
				switch {
				case br.Failure != "":
					h.logf("%s round %d, %s bodies: failed: %s", t.name, round+1, size, br.Failure)
				case br.CPUSeconds == 0:
					h.logf("%s round %d, %s bodies: %.0f MB/s (%d requests, errors %d)", t.name, round+1, size, br.MBps, br.Requests, br.Errors)
				default:
					h.logf("%s round %d, %s bodies: %.0f MB/s (%d requests, errors %d), proxy CPU %.2f cores, %.2f s/GB (kernel %.2f), %.0f MB/s per core, peak RSS %.1f MiB",
						t.name, round+1, size, br.MBps, br.Requests, br.Errors, br.CPUUtil, br.CPUPerGB, br.SysPerGB, br.MBpsPerCore, float64(br.PeakRSSBytes)/(1<<20))
				}
				out = append(out, br)
			}
		}
	}
	return out
}

// bodyRun starts t afresh, warms it up with the same load for -warmup,
// then measures one closed-loop run of -duration.
func (h *Harness) bodyRun(ctx context.Context, t *target, round int, size proxy.ByteSize, body []byte) (br BodyRun) {
	br = BodyRun{Round: round + 1, Target: t.name, Size: size, LoadAvg: loadAvg()}
	rt, err := h.start(ctx, t, 2048, nil)
	if err != nil {
		br.Failure = "start: " + err.Error()
		return br
	}
	defer rt.stop()
	if rt.p != nil {
		if m, err := treeMem(rt.p.pid()); err == nil {
			br.RSSStartBytes = m.rss
		}
	}
	conns := h.cfg.BodyConns
	if h.cfg.Warmup > 0 {
		if w := runBodyLoad(ctx, rt.addr, int64(size), conns, h.cfg.Warmup, body); w.errors > 0 {
			br.Failure = fmt.Sprintf("warm-up: %d errors, the first: %s", w.errors, w.firstErr)
			return br
		}
	}
	rep := h.replicas[0]
	rep.bodyBytes.Store(0)
	var cpu0, sys0 float64
	if rt.p != nil {
		if cpu0, sys0, err = treeCPUSys(rt.p.pid()); err != nil {
			br.Failure = "proxy stats: " + err.Error()
			return br
		}
	}
	l := runBodyLoad(ctx, rt.addr, int64(size), conns, h.cfg.Duration, body)
	br.Seconds, br.Requests, br.Bytes, br.Errors, br.FirstError = l.seconds, l.requests, l.bytes, l.errors, l.firstErr
	br.ReplicaBytes = rep.bodyBytes.Load()
	if br.Seconds > 0 {
		br.MBps = float64(br.Bytes) / 1e6 / br.Seconds
	}
	if rt.p != nil {
		cpu1, sys1, err := treeCPUSys(rt.p.pid())
		if err != nil {
			br.Failure = "proxy stats: " + err.Error()
			return br
		}
		br.setCPU(cpu1-cpu0, sys1-sys0)
		if m, err := treeMem(rt.p.pid()); err == nil {
			br.PeakRSSBytes = m.hwm
		}
		if !rt.p.alive() {
			br.Failure = fmt.Sprintf("%s exited during the run: %v\n%s", t.name, rt.p.err, rt.p.tail(1500))
		}
	}
	if rt.p != nil && h.cfg.Syscalls && round == h.cfg.Rounds-1 && br.Failure == "" {
		// An extra, unrecorded run, so that perf costs no measured
		// throughput.
		per, err := h.countDuring(rt, func() (int64, error) {
			l := runBodyLoad(ctx, rt.addr, int64(size), conns, min(h.cfg.Duration, 5*time.Second), body)
			if l.errors > 0 {
				return l.requests, fmt.Errorf("%d errors, the first: %s", l.errors, l.firstErr)
			}
			return l.requests, nil
		})
		if err != nil {
			h.logf("%s round %d, %s bodies: syscall count failed: %v", t.name, round+1, size, err)
		} else {
			mib := float64(size) / (1 << 20)
			br.SyscallsPerMiB = map[string]float64{}
			for k, v := range per {
				br.SyscallsPerMiB[k] = v / mib
			}
		}
	}
	if err := ctx.Err(); err != nil && br.Failure == "" {
		br.Failure = err.Error()
	}
	if br.Requests == 0 && br.Failure == "" {
		br.Failure = "no request answered 200: " + l.firstErr
	}
	return br
}

// BodySummary is one target at one body size over every round.
type BodySummary struct {
	Target      string         `json:"target"`
	Size        proxy.ByteSize `json:"body_bytes"`
	MBps        *Stat          `json:"mb_per_second,omitempty"`
	CPUUtil     *Stat          `json:"proxy_cpu_util,omitempty"`
	CPUPerGB    *Stat          `json:"proxy_cpu_seconds_per_gb,omitempty"`
	SysPerGB    *Stat          `json:"proxy_sys_seconds_per_gb,omitempty"`
	MBpsPerCore *Stat          `json:"mb_per_second_per_proxy_core,omitempty"`
	RSSStartMiB *Stat          `json:"proxy_rss_start_mib,omitempty"`
	PeakRSSMiB  *Stat          `json:"proxy_peak_rss_mib,omitempty"`
	Requests    int64          `json:"requests"` // over every round
	Errors      int64          `json:"errors"`
	// ShortBytes is body bytes the client had answered 200 for but the
	// replica did not read, over every round (0 unless bodies were cut).
	ShortBytes int64 `json:"short_bytes,omitempty"`
	// SyscallsPerMiB: the last round's (-syscalls).
	SyscallsPerMiB map[string]float64 `json:"syscalls_per_mib,omitempty"`
	Rounds         int                `json:"rounds"`
	Failures       []string           `json:"failures,omitempty"`
}

// summariseBodies groups runs by target (in targetNames order) and size
// (in sizes order). A failed run counts in Failures, not in the figures.
func summariseBodies(runs []BodyRun, sizes []proxy.ByteSize) []BodySummary {
	var out []BodySummary
	for _, name := range targetNames {
		for _, size := range sizes {
			s := BodySummary{Target: name, Size: size}
			var mbps, util, perGB, sysGB, perCore, start, peak []float64
			seen := false
			for _, r := range runs {
				if r.Target != name || r.Size != size {
					continue
				}
				seen = true
				s.Requests += r.Requests
				s.Errors += r.Errors
				if r.Failure != "" {
					s.Failures = append(s.Failures, fmt.Sprintf("round %d: %s", r.Round, r.Failure))
					continue
				}
				s.Rounds++
				s.ShortBytes += max(r.Bytes-r.ReplicaBytes, 0)
				if r.SyscallsPerMiB != nil {
					s.SyscallsPerMiB = r.SyscallsPerMiB
				}
				mbps = append(mbps, r.MBps)
				if r.CPUSeconds > 0 {
					util, perGB, sysGB, perCore = append(util, r.CPUUtil), append(perGB, r.CPUPerGB), append(sysGB, r.SysPerGB), append(perCore, r.MBpsPerCore)
				}
				if r.PeakRSSBytes > 0 {
					start, peak = append(start, float64(r.RSSStartBytes)/(1<<20)), append(peak, float64(r.PeakRSSBytes)/(1<<20))
				}
			}
			if !seen {
				continue
			}
			s.MBps, s.CPUUtil, s.CPUPerGB, s.SysPerGB, s.MBpsPerCore = newStat(mbps), newStat(util), newStat(perGB), newStat(sysGB), newStat(perCore)
			s.RSSStartMiB, s.PeakRSSMiB = newStat(start), newStat(peak)
			out = append(out, s)
		}
	}
	return out
}

// bodiesMarkdown renders the body mode's table and its failures.
func (r *Report) bodiesMarkdown(b *strings.Builder) {
	c := r.Config
	fmt.Fprintf(b, "### Body throughput: %d connections, closed loop, %v per run after a %v warm-up, a fresh process per target and size\n\n", c.BodyConns, c.Duration, c.Warmup)
	b.WriteString("| target | body | MB/s | proxy CPU (cores) | proxy CPU s per GB | of which in the kernel | MB/s per proxy core | RSS at start MiB | peak RSS MiB | requests | errors |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.BodySummary {
		errs := fmt.Sprint(s.Errors)
		if s.Errors > 0 {
			errs = "**" + errs + " (flagged)**"
		}
		if s.ShortBytes > 0 {
			errs += fmt.Sprintf(" **%d bytes short at the replica**", s.ShortBytes)
		}
		if len(s.Failures) > 0 {
			errs += fmt.Sprintf(" **%d round(s) failed**", len(s.Failures))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", s.Target, s.Size,
			fs(s.MBps, "%.0f"), fs(s.CPUUtil, "%.2f"), fs(s.CPUPerGB, "%.2f"), fs(s.SysPerGB, "%.2f"), fs(s.MBpsPerCore, "%.0f"),
			fs(s.RSSStartMiB, "%.1f"), fs(s.PeakRSSMiB, "%.1f"), s.Requests, errs)
	}
	b.WriteString("\nMB = 10^6 bytes, GB = 10^9 bytes of request body. Proxy CPU is utime + stime of the proxy's processes over the measured run; peak RSS is VmHWM after it (warm-up included).\n")
	r.bodySyscallTable(b)
	var fails []string
	for _, s := range r.BodySummary {
		for _, f := range s.Failures {
			fails = append(fails, fmt.Sprintf("%s %s %s", s.Target, s.Size, f))
		}
	}
	if len(fails) > 0 {
		b.WriteString("\nFailures:\n")
		for _, f := range fails {
			fmt.Fprintf(b, "- %s\n", strings.ReplaceAll(f, "\n", " "))
		}
	}
}

// joinSizes lists sizes as "1MiB, 64MiB".
func joinSizes(sizes []proxy.ByteSize) string {
	s := make([]string, len(sizes))
	for i, n := range sizes {
		s[i] = n.String()
	}
	return strings.Join(s, ", ")
}

// bodySyscallTable renders system calls per MiB of body, one column per
// call that some row makes at least once per MiB, if any were counted.
func (r *Report) bodySyscallTable(b *strings.Builder) {
	var cols []string
	for _, s := range r.BodySummary {
		for k, v := range s.SyscallsPerMiB {
			if k != "all" && k != "context-switches" && v >= 1 && !slices.Contains(cols, k) {
				cols = append(cols, k)
			}
		}
	}
	if len(cols) == 0 {
		return
	}
	slices.Sort(cols)
	cols = append([]string{"all"}, append(cols, "context-switches")...)
	b.WriteString("\n#### System calls per MiB of body (perf stat, extra run in the last round)\n\n| target | body |")
	for _, c := range cols {
		fmt.Fprintf(b, " %s |", c)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, s := range r.BodySummary {
		if s.SyscallsPerMiB == nil {
			continue
		}
		fmt.Fprintf(b, "| %s | %s |", s.Target, s.Size)
		for _, c := range cols {
			fmt.Fprintf(b, " %.1f |", s.SyscallsPerMiB[c])
		}
		b.WriteString("\n")
	}
}
