package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"keyway/internal/poll"
)

// Malformed and ambiguous requests to the real binary are answered at
// once (far below the default 30s server.read_timeout) and their
// connection closed; a request smuggled in a first one's body never
// reaches a replica.
func TestMalformedRequestsAnsweredAtOnce(t *testing.T) {
	skipShort(t)
	px, reps := cluster(t, 1)
	cases := []struct {
		name, raw string
		want      int
	}{
		{"content-length with transfer-encoding", "POST /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: outer\r\n" +
			"Content-Length: 60\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: smuggled\r\n\r\n", 400},
		{"transfer-encoding with content-length", "POST /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: outer\r\n" +
			"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\nGET /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: smuggled\r\n\r\n", 400},
		{"content-length twice", "POST /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: outer\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400},
		{"bad chunk size", "POST /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: outer\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
		{"http/2.0", "GET /orders HTTP/2.0\r\nHost: orders.example\r\nX-Key: outer\r\n\r\n", 505},
		{"no host", "GET /orders HTTP/1.0\r\nX-Key: outer\r\n\r\n", 400},
		{"garbage", "HELLO\r\n\r\n", 400},
		// fasthttp alone would wait for a CRLF CRLF until read_timeout.
		{"head ended by bare LFs", "GET /orders HTTP/1.1\nHost: orders.example\nX-Key: outer\n\n", 400},
		{"unknown transfer coding", "POST /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: outer\r\n" +
			"Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 501},
		{"chunked not final", "POST /orders HTTP/1.1\r\nHost: orders.example\r\nX-Key: outer\r\n" +
			"Transfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400},
		{"request line too long", "GET /" + strings.Repeat("a", 40<<10) + " HTTP/1.1\r\nHost: orders.example\r\n\r\n", 414},
		{"headers too large", "GET /orders HTTP/1.1\r\nHost: orders.example\r\nX-Big: " + strings.Repeat("a", 40<<10) + "\r\n\r\n", 431},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", px.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			if _, err := io.WriteString(conn, c.raw); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer within 1s: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.want)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("connection not closed within 1s of the answer: %v", err)
			}
		})
	}
	for key, n := range Stats(t, reps[0].Addr) {
		t.Errorf("the replica received %d requests with key %q", n, key)
	}
}

// A replica's reply over its set's max_response_body_bytes never reaches
// the client: the binary answers 502 naming the key, counts kind
// reply_too_large, and a reload raising the bound lets the same reply
// through.
func TestReplyOverMaxResponseBodyBytes(t *testing.T) {
	skipShort(t)
	big := strings.Repeat("b", 4<<10)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = io.WriteString(w, big)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "keyway.yaml")
	config := func(bound string) string {
		return fmt.Sprintf(`listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {level: info, format: json}
replica_sets:
  - name: orders
    replicas: 1
    max_response_body_bytes: %s
    static: [{name: r0, addr: %q}]
`, bound, ln.Addr().String())
	}
	writeAtomic(t, cfgPath, config("2KiB"))
	p := Start(t, "proxy", "proxy", "-c", cfgPath)
	proxy := p.WaitLine(t, logField("proxy listening", "addr"), 20*time.Second)[1]
	admin := p.WaitLine(t, logField("admin listening", "addr"), 20*time.Second)[1]

	get := func(path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+proxy+path, nil)
		req.Header.Set("X-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/small"); code != 200 || body != "ok" {
		t.Fatalf("/small: %d %q", code, body)
	}
	code, body := get("/big")
	if code != 502 || !strings.Contains(body, "max_response_body_bytes (2KiB)") || strings.Contains(body, "bbbb") {
		t.Fatalf("/big over 2KiB: %d %.200q, want keyway's 502 naming max_response_body_bytes", code, body)
	}
	kind := map[string]string{"set": "orders", "replica": "r0", "kind": "reply_too_large"}
	if got := Metric(admin, "keyway_upstream_errors_total", kind); got != 1 {
		t.Fatalf("keyway_upstream_errors_total{kind=reply_too_large} = %v, want 1", got)
	}

	writeAtomic(t, cfgPath, config("8KiB"))
	reloads := func() float64 {
		return Metric(admin, "keyway_config_reloads_total", map[string]string{"result": "success"})
	}
	before := reloads()
	kill(t, p.Pid(), syscall.SIGHUP)
	poll.Until(t, 10*time.Second, "the reload", func() bool { return reloads() == before+1 })
	if code, body := get("/big"); code != 200 || body != big {
		t.Fatalf("/big after raising max_response_body_bytes to 8KiB: %d, %d bytes", code, len(body))
	}
}
