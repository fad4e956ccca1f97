package runner

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"keyway/internal/atomicfile"
	"keyway/internal/flock"
)

// job is one replica's agent. Its fields are guarded by Runner.mu, except
// exited, which the reaper closes.
type job struct {
	set, replica, dir string
	ordinal           int
	spec              Spec
	pid               int
	addr              string
	since             time.Time
	lockPath          string
	adopted           bool          // found running, started by an earlier process
	child             bool          // started by this runner
	exited            chan struct{} // closed once a child is reaped
	retiring          bool          // told to stop for good
	retired           time.Time
	restarts          int
	lastExit          string
	retryAt           time.Time
	err               string
}

// alive reports whether the job's agent runs: a child until it is
// reaped; an adopted agent while it holds its lock.
func (j *job) alive() bool {
	switch {
	case j.child:
		select {
		case <-j.exited:
			return false
		default:
			return true
		}
	case j.adopted:
		held, _, err := flock.Held(j.lockPath)
		return err == nil && held
	}
	return false
}

// stopBound is how long a stopping agent may take: its drain, its drain
// probe, its replica's stop grace, and some slack.
func (j *job) stopBound() time.Duration {
	d := j.spec.DrainTimeout + j.spec.StopGrace + 15*time.Second
	if j.spec.DrainProbe != "" {
		d += time.Minute
	}
	return d
}

// start starts the job's agent, or adopts one that holds its lock. r.mu
// is held.
func (r *Runner) start(j *job) {
	j.lockPath = filepath.Join(runnerDir(j.dir), j.replica+".lock")
	if held, _, err := flock.Held(j.lockPath); err == nil && held {
		// An agent runs it already (one an earlier process started, which
		// the next adoptFrom would find): adopt it rather than start a
		// second, which would refuse to start anyway.
		r.adoptFrom(j.dir)
		if nj := r.jobs[j.replica]; nj != j && nj.alive() {
			return
		}
	}
	if err := r.spawn(j); err != nil {
		j.err = err.Error()
		j.restarts++
		j.retryAt = time.Now().Add(backoff(j.restarts))
		r.log.Error("job not started", zap.String("set", j.set), zap.String("replica", j.replica), zap.Error(err))
		r.event(j, map[string]any{"event": "start_error", "error": err.Error()})
	}
}

// spawn starts `keyway agent -c FILE -- CMD` for j.
func (r *Runner) spawn(j *job) error {
	port, err := r.port(j)
	if err != nil {
		return fmt.Errorf("no port for %s on %s: %w", j.replica, j.spec.Host, err)
	}
	addr := net.JoinHostPort(j.spec.Host, strconv.Itoa(port))
	stateDir := filepath.Join(j.dir, j.replica)
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	v := vars{set: j.set, replica: j.replica, host: j.spec.Host, stateDir: stateDir, keyway: r.exe, ordinal: j.ordinal, port: port}
	cfgFile := filepath.Join(runnerDir(j.dir), j.replica+".yaml")
	b, err := r.agentFile(j, addr)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(cfgFile, b); err != nil {
		return fmt.Errorf("agent configuration: %w", err)
	}
	logFile := filepath.Join(runnerDir(j.dir), j.replica+".log")
	if fi, err := os.Stat(logFile); err == nil && fi.Size() > maxLogBytes {
		_ = os.Rename(logFile, logFile+".1")
	}
	out, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	defer out.Close() // the child has its own descriptor
	argv := []string{"agent", "-c", cfgFile, "--"}
	for _, a := range j.spec.Command {
		argv = append(argv, v.expand(a))
	}
	cmd := exec.Command(r.exe, argv...)
	cmd.Dir = stateDir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = jobEnv(os.Environ(), j.spec, v)
	cmd.SysProcAttr = newProcessGroup()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the agent: %w", err)
	}
	j.pid, j.addr, j.since, j.child, j.adopted = cmd.Process.Pid, addr, time.Now(), true, false
	j.retiring, j.err, j.retryAt = false, "", time.Time{}
	exited := make(chan struct{})
	j.exited = exited
	r.log.Info("job started", zap.String("set", j.set), zap.String("replica", j.replica), zap.Int("agent_pid", j.pid), zap.String("addr", addr),
		zap.Strings("command", argv[4:]), zap.String("log", logFile))
	r.event(j, map[string]any{"event": "start", "agent_pid": j.pid, "addr": addr, "command": argv[4:]})
	go func() {
		err := cmd.Wait()
		close(exited)
		r.reaped(j, cmd.Process.Pid, err, logFile)
	}()
	return nil
}

// maxLogBytes is the size at which a job's log file is moved to .log.1
// when its agent starts.
const maxLogBytes = 16 << 20

// reaped records how a child agent ended.
func (r *Runner) reaped(j *job, pid int, err error, logFile string) {
	how := "exited with code 0"
	if err != nil {
		how = err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			how = describeExit(ee)
		}
		if line := lastErrorLine(logFile); line != "" {
			how += ": " + line
		}
	}
	r.mu.Lock()
	defer r.wake()
	defer r.mu.Unlock()
	if j.pid != pid {
		return
	}
	j.lastExit = how
	if j.retiring {
		r.log.Info("job stopped", zap.String("set", j.set), zap.String("replica", j.replica), zap.Int("agent_pid", pid), zap.String("exit", how))
		r.event(j, map[string]any{"event": "stopped", "agent_pid": pid, "exit": how})
		return
	}
	j.restarts++
	j.retryAt = time.Now().Add(backoff(j.restarts))
	r.log.Warn("agent exited; starting it again after a backoff", zap.String("set", j.set), zap.String("replica", j.replica),
		zap.Int("agent_pid", pid), zap.String("exit", how), zap.Time("retry_at", j.retryAt))
	r.event(j, map[string]any{"event": "exit", "agent_pid": pid, "exit": how, "restarts": j.restarts})
}

// lastErrorLine returns the line of a log file's tail that says why its
// agent exited: the last that mentions an error or is keyway's own
// ("keyway: ..."), else the last one; shortened.
func lastErrorLine(file string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-4096, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	pick := ""
	for i := len(lines) - 1; i >= 0 && pick == ""; i-- {
		l := strings.TrimSpace(string(lines[i]))
		if strings.HasPrefix(l, "keyway: ") || strings.Contains(strings.ToLower(l), "error") {
			pick = l
		}
	}
	if pick == "" && len(lines) > 0 {
		pick = strings.TrimSpace(string(lines[len(lines)-1]))
	}
	if len(pick) > 300 {
		pick = pick[:300] + "…"
	}
	return pick
}

// jobEnv is the environment of a job's agent, which passes it to the
// replica: this process's, without its KEYWAY_ settings (they configure
// the proxy) except the gossip key, plus the spec's env and the job's
// KEYWAY_SET, KEYWAY_REPLICA, KEYWAY_ORDINAL, KEYWAY_PORT and
// KEYWAY_STATE_DIR.
func jobEnv(base []string, s Spec, v vars) []string {
	env := make([]string, 0, len(base)+len(s.Env)+5)
	for _, kv := range base {
		if strings.HasPrefix(kv, "KEYWAY_") && !strings.HasPrefix(kv, "KEYWAY_GOSSIP_KEY=") {
			continue
		}
		env = append(env, kv)
	}
	for _, kv := range s.Env {
		env = append(env, v.expand(kv))
	}
	return append(env, "KEYWAY_SET="+v.set, "KEYWAY_REPLICA="+v.replica, "KEYWAY_ORDINAL="+strconv.Itoa(v.ordinal),
		"KEYWAY_PORT="+strconv.Itoa(v.port), "KEYWAY_STATE_DIR="+v.stateDir)
}

// agentFile is the configuration file of a job's agent (docs/agent.md):
// the replica, its probes, drain and supervision from the spec, leaving
// for good when stopped (drain.remove), no HTTP listener, its lock file,
// and the proxy's gossip settings.
func (r *Runner) agentFile(j *job, addr string) ([]byte, error) {
	a := r.opts.Agent
	var join []string
	if a.Join != nil {
		join = a.Join()
	}
	if len(join) == 0 {
		return nil, fmt.Errorf("no gossip address to join yet")
	}
	type kv = map[string]any
	drain := kv{"timeout": j.spec.DrainTimeout.String(), "remove": true}
	if j.spec.DrainProbe != "" {
		drain["probe_path"] = j.spec.DrainProbe
	}
	probe := kv{"path": j.spec.ReadyPath, "interval": j.spec.ProbeInterval.String()}
	gossip := kv{"bind_addr": a.BindAddr, "join": join, "label": a.Label, "insecure": a.Insecure}
	if a.AdvertiseAddr != "" {
		gossip["advertise_addr"] = a.AdvertiseAddr
	}
	if a.KeyFile != "" {
		gossip["key_file"] = a.KeyFile
	}
	if c := cmpOr(j.spec.CredentialsFile, a.Credentials); c != "" {
		gossip["credentials_file"] = c
	}
	if a.Signatures != "" {
		gossip["signatures"] = a.Signatures
	}
	if a.Profile != "" {
		gossip["profile"] = a.Profile
	}
	logc := kv{}
	if a.LogLevel != "" {
		logc["level"] = a.LogLevel
	}
	if a.LogFormat != "" {
		logc["format"] = a.LogFormat
	}
	doc := kv{
		"replica":          kv{"set": j.set, "name": j.replica, "addr": addr},
		"probe":            probe,
		"drain":            drain,
		"supervise":        kv{"stop_grace": j.spec.StopGrace.String(), "max_restarts": j.spec.MaxRestarts, "window": j.spec.RestartWindow.String()},
		"listen":           "",
		"lock_file":        filepath.Join(runnerDir(j.dir), j.replica+".lock"),
		"exit_with_parent": a.ExitWithParent,
		"log":              logc,
		"gossip":           gossip,
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return append([]byte("# written by the keyway runner for "+j.replica+"; rewritten whenever its agent starts\n"), b...), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// freePort returns a port free on host now.
//
// It prefers a port below the kernel's ephemeral range (Linux:
// net.ipv4.ip_local_port_range), which the kernel never hands out by
// itself: between this check and the replica's bind, only a process
// binding that very port can take it, not any outgoing connection or
// port-0 listener. Elsewhere, or when none is free there, it asks the
// kernel for one.
func freePort(host string) (int, error) {
	if lo, ok := ephemeralLow(); ok {
		start := max(lo-reservedSpan, 1024)
		span := lo - start
		for range 32 {
			p := start + rand.IntN(span)
			if portFree(host, p) {
				return p, nil
			}
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// reservedSpan is how far below the ephemeral range freePort looks.
const reservedSpan = 8192

// ephemeralLow returns the first port of the kernel's ephemeral range.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo <= 1024+256 {
		return 0, false
	}
	return lo, true
}

// portFree reports whether port can be bound on host now.
func portFree(host string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}
