// Package integration holds keyway's whole-system tests: real keyway
// binaries (proxies, agents, demo replicas) as separate processes, talking
// over real sockets and real gossip on 127.0.0.1, with failures injected
// by signalling those processes. The package has no non-test code but this
// harness; its tests are skipped under -short.
package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"keyway/fleetauth"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binary is the path of the keyway binary the tests run; TestMain builds it.
var Binary string

// Build compiles ./cmd/keyway into dir and returns the binary's path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "keyway")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/keyway")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// Proc is one keyway process started by a test. Its JSON log lines
// (stderr) and stdout lines are kept for waiting on.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	// shared: its output file is shared with processes it starts, which
	// go on writing lines after it exited (StartLogged).
	shared bool

	mu    sync.Mutex
	lines []string // stdout and stderr, in arrival order
	cond  chan struct{}
	done  chan struct{}
	err   error
}

// Credentials are the fleet credentials every keyway the tests start
// uses (TestMain writes them to CredentialsFile and names the file in
// KEYWAY_GOSSIP_CREDENTIALS_FILE and KEYWAY_AGENT_GOSSIP_CREDENTIALS_FILE,
// which every process inherits): the proxy key and an agent key for each
// of CredentialSets. A test that needs a member without them (a rogue)
// builds it in-process.
var (
	Credentials     fleetauth.Credentials
	CredentialsFile string
	CredentialSets  = []string{"orders", "users", "events", "billing", "clicks"}
)

// Start runs the binary with args. The process is killed at test end if
// it is still running.
func Start(t testing.TB, name string, args ...string) *Proc {
	t.Helper()
	return StartBinary(t, Binary, name, args...)
}

// StartBinary is Start with another keyway binary (an older version's).
func StartBinary(t testing.TB, bin, name string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, cmd: exec.Command(bin, args...), cond: make(chan struct{}, 1), done: make(chan struct{})}
	stdout, _ := p.cmd.StdoutPipe()
	stderr, _ := p.cmd.StderrPipe()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	var wg sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				p.mu.Lock()
				p.lines = append(p.lines, sc.Text())
				p.mu.Unlock()
				p.notify()
			}
		}()
	}
	go func() {
		wg.Wait()
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
		p.notify()
	}()
	t.Cleanup(func() {
		if !p.Exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- output of %s (last 40 lines):\n%s", name, p.tail(40))
		}
	})
	return p
}

// StartLogged is Start with the process's output going to a file in a
// temporary directory rather than to pipes, for a process that passes its
// output on to processes it starts (a binary upgrade's new process): the
// test sees when the first one exits, though the others still write. The
// file's lines are read as they come, from every process writing it.
func StartLogged(t testing.TB, name string, args ...string) *Proc {
	t.Helper()
	return startLogged(t, name, func(cmd *exec.Cmd) { cmd.Args = append([]string{Binary}, args...) })
}

func startLogged(t testing.TB, name string, setup func(*exec.Cmd)) *Proc {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &Proc{Name: name, cmd: exec.Command(Binary), cond: make(chan struct{}, 1), done: make(chan struct{}), shared: true}
	setup(p.cmd)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	stop := make(chan struct{})
	var tailing sync.WaitGroup
	tailing.Go(func() { p.follow(path, stop) })
	go func() {
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
		p.notify()
	}()
	t.Cleanup(func() {
		if !p.Exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		close(stop)
		tailing.Wait()
		if t.Failed() {
			t.Logf("--- output of %s (last 60 lines):\n%s", name, p.tail(60))
		}
	})
	return p
}

// StartActivated starts keyway as systemd's socket activation would: the
// listening sockets files as fds 3, 4, ..., named by names
// (LISTEN_FDNAMES, e.g. "proxy"), and LISTEN_FDS and LISTEN_PID set. The
// PID is the process's own: a shell sets it and execs keyway, so the PID
// stays. Its output goes to a log file as with StartLogged.
func StartActivated(t testing.TB, name string, files []*os.File, names string, args ...string) *Proc {
	t.Helper()
	sh := append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, Binary}, args...)
	return startLogged(t, name, func(cmd *exec.Cmd) {
		cmd.Path, cmd.Args = "/bin/sh", append([]string{"/bin/sh"}, sh...)
		cmd.ExtraFiles = files
		cmd.Env = append(os.Environ(), "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+names)
	})
}

// follow reads the lines of the log file path as they are written, until
// stop.
func (p *Proc) follow(path string, stop <-chan struct{}) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	var partial []byte
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		line, err := br.ReadBytes('\n')
		partial = append(partial, line...)
		if err == nil {
			p.mu.Lock()
			p.lines = append(p.lines, strings.TrimRight(string(partial), "\n"))
			p.mu.Unlock()
			partial = partial[:0]
			p.notify()
			continue
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

func (p *Proc) notify() {
	select {
	case p.cond <- struct{}{}:
	default:
	}
}

func (p *Proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lines
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL (a crash: no graceful leave) and waits for the exit.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Term sends SIGTERM and waits up to d for a clean exit.
func (p *Proc) Term(t testing.TB, d time.Duration) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("%s did not exit within %s of SIGTERM", p.Name, d)
	}
	p.mu.Lock()
	err := p.err
	p.mu.Unlock()
	if err != nil {
		t.Fatalf("%s exited with %v after SIGTERM", p.Name, err)
	}
}

// WaitLine waits until a line matches re and returns its submatches.
func (p *Proc) WaitLine(t testing.TB, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	seen := 0
	for {
		p.mu.Lock()
		lines := p.lines[seen:]
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		select {
		case <-p.cond:
		case <-deadline.C:
			t.Fatalf("%s: no line matching %s within %s", p.Name, re, d)
		case <-p.done:
			if p.shared {
				// Others may still write its file: wait for lines.
				select {
				case <-p.cond:
				case <-deadline.C:
					t.Fatalf("%s: no line matching %s within %s", p.Name, re, d)
				}
				continue
			}
			p.mu.Lock()
			more := len(p.lines) > seen
			p.mu.Unlock()
			if !more {
				t.Fatalf("%s exited before printing a line matching %s", p.Name, re)
			}
		}
	}
}

// Logs returns the parsed JSON log lines whose msg is msg.
func (p *Proc) Logs(msg string) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, l := range p.lines {
		if !strings.HasPrefix(l, "{") || !strings.Contains(l, msg) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// logField matches `"msg":"MSG"...,"FIELD":"VALUE"` in a JSON log line.
func logField(msg, field string) *regexp.Regexp {
	return regexp.MustCompile(`"msg":"` + regexp.QuoteMeta(msg) + `".*"` + field + `":"([^"]+)"`)
}

// Metric returns the value of the first sample of name whose labels
// include every given label, from a Prometheus text endpoint, or -1.
func Metric(adminAddr, name string, labels map[string]string) float64 {
	vs, err := metricSamples(adminAddr, name, labels)
	if err != nil || len(vs) == 0 {
		return -1
	}
	return vs[0]
}

// metricSamples returns the values of the samples of name whose labels
// include every given label, in exposition order.
func metricSamples(adminAddr, name string, labels map[string]string) ([]float64, error) {
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out []float64
	for _, line := range bytes.Split(body, []byte("\n")) {
		l := string(line)
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for k, v := range labels {
			ok = ok && strings.Contains(l, k+`="`+v+`"`)
		}
		if f, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil && ok {
			out = append(out, f)
		}
	}
	return out, nil
}

// WriteFile writes content to a file in dir and returns its path.
func WriteFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
