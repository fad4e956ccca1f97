package integration

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"keyway/internal/poll"
)

// statusKB is the field of /proc/PID/status (Linux) named by prefix, in
// kB: VmRSS, the resident memory; VmHWM, its peak.
func statusKB(t *testing.T, pid int, prefix string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", prefix, v, err)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/PID/status", prefix)
	return 0
}

// rssBytes is the resident memory of process pid.
func rssBytes(t *testing.T, pid int) int64 { return statusKB(t, pid, "VmRSS:") << 10 }

// TestAnnouncedBodyAllocatesNothing: connections that announce an 8 MB
// body and send 3 bytes of it (each cost keyway more than 2 MiB while a
// body was buffered by its announced length)
// cost keyway at most 32 KiB of resident memory each, and a keyed request
// on another connection is answered meanwhile.
func TestAnnouncedBodyAllocatesNothing(t *testing.T) {
	skipShort(t)
	if runtime.GOOS != "linux" {
		t.Skip("reads the proxy's resident memory from /proc")
	}
	const n = 300
	_, raddr := StartReplicaProcess(t, "orders-0")
	cfg := WriteFile(t, t.TempDir(), "attack.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
server: {read_timeout: 2m}
replica_sets:
  - name: orders
    static: [{name: orders-0, addr: %q}]
`, raddr))
	p := Start(t, "keyway", "proxy", "-c", cfg)
	addr := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	pid := p.cmd.Process.Pid

	// The probes share one keep-alive connection: keyway's count of open
	// sockets (below) then moves with the attack alone.
	pc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pbr := bufio.NewReader(pc)
	probe := func() time.Duration {
		t.Helper()
		_ = pc.SetDeadline(time.Now().Add(10 * time.Second))
		t0 := time.Now()
		if _, err := io.WriteString(pc, "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: probe\r\nContent-Length: 2\r\n\r\nhi"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(pbr, nil)
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("probe: %s", resp.Status)
		}
		return time.Since(t0)
	}
	p50 := func() time.Duration {
		var ds []time.Duration
		for range 9 {
			ds = append(ds, probe())
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	idle := p50()
	// Nothing but the attack and the probes reaches keyway from here: a
	// scrape of /metrics would leave megabytes of garbage in the heap.
	fds := func() int {
		es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	fdBefore := fds()
	before := rssBytes(t, pid)

	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := fmt.Fprintf(c, "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Key: a-%d\r\nContent-Length: 8388000\r\n\r\nabc", i); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 20*time.Second, "keyway to hold every attacking connection", func() bool { return fds() >= fdBefore+n })
	attacked := p50()
	after := rssBytes(t, pid)

	per := (after - before) / n
	t.Logf("%d connections announcing 8388000 bytes, sending 3: RSS %d → %d KiB, %d bytes per connection; probe p50 %v idle, %v under attack",
		n, before>>10, after>>10, per, idle, attacked)
	if per > 32<<10 {
		t.Fatalf("%d bytes of resident memory per attacking connection, want at most 32 KiB", per)
	}
}

// bodyReader yields n bytes of a sequence seeded by seed.
type bodyReader struct {
	n, off int64
	x      uint64
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if r.off >= r.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n-r.off)]
	for i := range p {
		r.x ^= r.x << 13
		r.x ^= r.x >> 7
		r.x ^= r.x << 17
		p[i] = byte(r.x)
	}
	r.off += int64(len(p))
	return len(p), nil
}

// digestServer is a replica that answers each request with the length and
// SHA-256 of the body it read from its stream.
func digestServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			w.WriteHeader(599)
			return
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestLargeBodiesConcurrently: 50 concurrent 7 MiB POSTs all get 200 and
// arrive byte-exact at the replica, and keyway's peak resident memory
// stays at most 128 MiB.
func TestLargeBodiesConcurrently(t *testing.T) {
	skipShort(t)
	if runtime.GOOS != "linux" {
		t.Skip("reads the proxy's peak resident memory from /proc")
	}
	const conns, size = 50, 7 << 20
	raddr := digestServer(t)
	cfg := WriteFile(t, t.TempDir(), "bodies.yaml", fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
replica_sets:
  - name: orders
    timeouts: {request: 2m}
    static: [{name: orders-0, addr: %q}]
`, raddr))
	p := Start(t, "keyway", "proxy", "-c", cfg)
	addr := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	client := &http.Client{Timeout: 2 * time.Minute}
	errs := make(chan error, conns)
	for i := range conns {
		go func() {
			h := sha256.New()
			body := io.TeeReader(&bodyReader{n: size, x: uint64(i)*0x9e3779b97f4a7c15 + 1}, h)
			req, err := http.NewRequest("POST", "http://"+addr+"/ingest", body)
			if err != nil {
				errs <- err
				return
			}
			req.ContentLength = size
			req.Header.Set("X-Key", fmt.Sprintf("big-%d", i))
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := fmt.Sprintf("%d %x", size, h.Sum(nil)); resp.StatusCode != 200 || string(got) != want {
				errs <- fmt.Errorf("body %d: %s %q, want 200 %q", i, resp.Status, got, want)
				return
			}
			errs <- nil
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	peak := statusKB(t, p.cmd.Process.Pid, "VmHWM:") << 10
	t.Logf("%d concurrent %d MiB POSTs: keyway's peak RSS %d MiB", conns, size>>20, peak>>20)
	if peak > 128<<20 {
		t.Fatalf("peak RSS %d MiB, want at most 128 MiB", peak>>20)
	}
}
