package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
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
