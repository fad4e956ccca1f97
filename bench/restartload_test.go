package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// timeoutErr is a net.Error that timed out.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestErrorClass(t *testing.T) {
	op := func(op string, err error) error {
		return &url.Error{Op: "Post", URL: "http://127.0.0.1:1/ingest", Err: &net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, err)}}
	}
	for name, c := range map[string]struct {
		err  error
		want string
	}{
		"nil":                 {nil, ""},
		"dial refused":        {op("dial", syscall.ECONNREFUSED), classRefused},
		"read reset":          {op("read", syscall.ECONNRESET), classReset},
		"write broken pipe":   {op("write", syscall.EPIPE), classReset},
		"EOF":                 {&url.Error{Op: "Post", URL: "u", Err: io.EOF}, classEOF},
		"unexpected EOF":      {fmt.Errorf("read body: %w", io.ErrUnexpectedEOF), classEOF},
		"server closed idle":  {&url.Error{Op: "Post", URL: "u", Err: errors.New("http: server closed idle connection")}, classEOF},
		"transport broken":    {errors.New("net/http: HTTP/1.x transport connection broken: unexpected EOF"), classEOF},
		"deadline":            {&url.Error{Op: "Post", URL: "u", Err: context.DeadlineExceeded}, classTimeout},
		"net timeout":         {&net.OpError{Op: "read", Err: timeoutErr{}}, classTimeout},
		"refused, as text":    {errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), classRefused},
		"reset, as text":      {errors.New("read tcp: connection reset by peer"), classReset},
		"something else":      {errors.New("malformed HTTP response"), classOther},
		"canceled is not EOF": {&url.Error{Op: "Post", URL: "u", Err: context.Canceled}, classOther},
	} {
		if got := errorClass(c.err); got != c.want {
			t.Errorf("%s: errorClass(%v) = %q, want %q", name, c.err, got, c.want)
		}
	}
}

// scriptedServer accepts connections on 127.0.0.1:0 and runs each
// request's script: answer 200 (keep-alive), answer 503, close without an
// answer (EOF), reset (RST), or answer nothing at all. script gets the
// connection's number (from 1) and the request's number on it (from 1).
type scriptedServer struct {
	ln    net.Listener
	conns atomic.Int32
}

type action int

const (
	answer200 action = iota
	answer503
	closeEOF
	closeRST
	hang
)

func startScripted(t *testing.T, script func(conn, req int) action) *scriptedServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedServer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(s.conns.Add(1))
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for req := 1; ; req++ {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if _, err := io.Copy(io.Discard, r.Body); err != nil {
						return
					}
					switch script(n, req) {
					case answer200:
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
					case answer503:
						io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
					case closeEOF:
						return
					case closeRST:
						c.(*net.TCPConn).SetLinger(0)
						return
					case hang:
						io.Copy(io.Discard, br) // until the client gives up
						return
					}
				}
			}()
		}
	}()
	return s
}

// oneRequest sends one request through l as the schedule would and
// returns its outcome.
func oneRequest(l *restartLoad) reqOutcome {
	l.inflight.Go(func() { l.one(time.Since(l.start), "key-00001") })
	l.inflight.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outs[len(l.outs)-1]
}

// TestRestartLoadOutcomes: each way a request can end is recorded with
// its class, whether it went on a reused connection and whether it was
// written, and a request lost on a reused connection is not retried on a
// new one.
func TestRestartLoadOutcomes(t *testing.T) {
	newLoad := func(addr string) *restartLoad {
		l := newRestartLoad(addr, 1000, 4, 300*time.Millisecond, 10, 64, 1)
		l.start = time.Now()
		t.Cleanup(l.tr.CloseIdleConnections)
		return l
	}
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		o := oneRequest(newLoad(addr))
		if o.Class != classRefused || o.Status != 0 || o.Wrote || o.Reused || !o.failed() {
			t.Errorf("%+v: want refused, not written, not reused", o)
		}
	})
	for name, c := range map[string]struct {
		second action
		class  string
		status int
	}{
		"ok":      {answer200, "", 200},
		"503":     {answer503, "", 503},
		"eof":     {closeEOF, classEOF, 0},
		"reset":   {closeRST, classReset, 0},
		"timeout": {hang, classTimeout, 0},
	} {
		t.Run(name, func(t *testing.T) {
			// The first request opens the connection; the second goes
			// on it and meets the case's action.
			srv := startScripted(t, func(conn, req int) action {
				if conn == 1 && req == 2 {
					return c.second
				}
				return answer200
			})
			l := newLoad(srv.ln.Addr().String())
			if o := oneRequest(l); o.Status != 200 || o.Reused {
				t.Fatalf("first request: %+v", o)
			}
			o := oneRequest(l)
			if o.Class != c.class || o.Status != c.status || !o.Reused || !o.Wrote {
				t.Errorf("%+v: want class %q, status %d, on the reused connection, written", o, c.class, c.status)
			}
			if got := srv.conns.Load(); got != 1 {
				t.Errorf("the server saw %d connections, want 1: the client retried on a new one", got)
			}
			if o.failed() != (c.status != 200) {
				t.Errorf("failed() = %v for %+v", o.failed(), o)
			}
		})
	}
}

// TestRestartLoadSchedule: the load sends on schedule, open loop, and its
// pool warm-up opens every connection at once.
func TestRestartLoadSchedule(t *testing.T) {
	srv := startScripted(t, func(int, int) action { return answer200 })
	l := newRestartLoad(srv.ln.Addr().String(), 200, 8, time.Second, 50, 100, 7)
	if err := l.warmPool(8); err != nil {
		t.Fatal(err)
	}
	if n := srv.conns.Load(); n != 8 {
		t.Fatalf("warm-up opened %d connections, want 8", n)
	}
	l.startSending()
	if !waitUntil(context.Background(), time.Now().Add(10*time.Second), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.outs) >= 40
	}) {
		t.Fatal("fewer than 40 answers within 10s")
	}
	outs := l.wait()
	for i, o := range outs {
		if o.Due != time.Duration(i)*5*time.Millisecond {
			t.Fatalf("request %d due at %v, want %v", i, o.Due, time.Duration(i)*5*time.Millisecond)
		}
		if o.failed() {
			t.Errorf("request %d: %+v", i, o)
		}
	}
	if n := srv.conns.Load(); n != 8 {
		t.Errorf("%d connections after the load, want the 8 of the pool", n)
	}
	keys := map[string]bool{}
	for _, k := range l.keys[:100] {
		if !strings.HasPrefix(k, "key-000") {
			t.Fatalf("key %q outside the 50 keys", k)
		}
		keys[k] = true
	}
	if len(keys) < 30 {
		t.Errorf("%d distinct keys in 100 draws of 50", len(keys))
	}
}
