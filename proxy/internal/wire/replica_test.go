//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wire

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"keyway/internal/poll"
	"keyway/internal/testcerts"
)

// fasthttp sets a connection's read deadline before reading a reply and
// leaves it there: a pooled connection idle for longer than
// timeouts.request carries a read deadline in the past when it is reused.
// The stale check must still look at it (RawConn.Read would refuse to).
func TestStaleCheckIgnoresPassedReadDeadline(t *testing.T) {
	c, s := tcpPair(t)
	w := NewReplicaConn(c, 0, nil)
	exchangeBytes(t, w, s)
	if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	poll.Until(t, 5*time.Second, "the replica's FIN to arrive", func() bool { return peerClosed(c) })
	if err := sendOn(w); !errors.Is(err, ErrStale) {
		t.Fatalf("send on a closed pooled connection with a passed read deadline: %v, want ErrStale", err)
	}
	var o Outcome
	w.outcome(&o)
	if !o.Stale {
		t.Fatal("the outcome does not say stale")
	}
}

// Bytes a replica sent unasked on an idle pooled connection (a 408 before
// it closes, say) would be read as the next request's answer: the
// connection is not reused.
func TestStaleCheckRefusesUnaskedBytes(t *testing.T) {
	c, s := tcpPair(t)
	w := NewReplicaConn(c, 0, nil)
	exchangeBytes(t, w, s)
	if _, err := s.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the replica's bytes to arrive", func() bool { return peerSpoke(c) })
	if err := sendOn(w); !errors.Is(err, ErrStale) {
		t.Fatalf("send on a pooled connection with unasked bytes: %v, want ErrStale", err)
	}
}

// An idle connection the replica left alone is reused, and its request
// reaches the replica.
func TestStaleCheckReusesAQuietConnection(t *testing.T) {
	c, s := tcpPair(t)
	w := NewReplicaConn(c, 0, nil)
	for range 3 {
		exchangeBytes(t, w, s)
	}
	var o Outcome
	w.outcome(&o)
	if o.Stale || o.LostReused || o.TLSRefused != nil {
		t.Fatalf("outcome of a good exchange: %+v", o)
	}
}

// A connection dialed before its replica's incarnation changed is never
// reused: its next request fails as stale before anything is written.
func TestStaleCheckRefusesAnEarlierIncarnation(t *testing.T) {
	c, s := tcpPair(t)
	var pool atomic.Uint64
	w := NewReplicaConn(c, pool.Load(), &pool)
	exchangeBytes(t, w, s)
	exchangeBytes(t, w, s) // reused within the same generation
	pool.Add(1)
	if _, err := w.Write([]byte("q")); !errors.Is(err, ErrStale) {
		t.Fatalf("reuse after the pool was retired: %v, want ErrStale", err)
	}
}

// The race the peek cannot close: the replica closes (or resets) a reused
// connection just after the check, before or after it read the request.
// The exchange fails before its first reply byte, and the outcome says
// so. A fresh connection, or one whose answer had begun, does not.
func TestReusedConnectionLostBeforeFirstByte(t *testing.T) {
	cases := map[string]struct {
		reuse   bool // a completed exchange first
		rst     bool // the server resets instead of closing
		partial bool // the server sends a byte of the answer first
		want    bool
	}{
		"reused, FIN":              {reuse: true, want: true},
		"reused, RST":              {reuse: true, rst: true, want: true},
		"fresh, FIN":               {},
		"reused, FIN after a byte": {reuse: true, partial: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c, s := tcpPair(t)
			w := NewReplicaConn(c, 0, nil)
			w.peekFn = func(uintptr) {} // the replica's close comes just after the check
			if tc.reuse {
				exchangeBytes(t, w, s)
			}
			if _, err := w.Write([]byte("q")); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			if _, err := io.ReadFull(s, b[:]); err != nil { // the replica read the request
				t.Fatal(err)
			}
			if tc.partial {
				if _, err := s.Write([]byte("H")); err != nil {
					t.Fatal(err)
				}
				if n, err := w.Read(b[:]); n != 1 || err != nil {
					t.Fatalf("first read: %d, %v", n, err)
				}
			}
			if tc.rst {
				if err := s.(*net.TCPConn).SetLinger(0); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
			if _, err := w.Read(b[:]); err == nil {
				t.Fatal("read after the replica closed succeeded")
			}
			var o Outcome
			w.outcome(&o)
			if o.LostReused != tc.want {
				t.Fatalf("LostReused = %v, want %v", o.LostReused, tc.want)
			}
		})
	}
	t.Run("reused, write fails", func(t *testing.T) {
		c, s := tcpPair(t)
		w := NewReplicaConn(c, 0, nil)
		w.peekFn = func(uintptr) {}
		exchangeBytes(t, w, s)
		if err := s.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		s.Close()
		poll.Until(t, 5*time.Second, "the replica's RST to arrive", func() bool { return peerClosed(c) })
		if err := sendOn(w); err == nil {
			t.Fatal("send on a reset connection succeeded")
		}
		var o Outcome
		w.outcome(&o)
		if !o.LostReused {
			t.Fatal("a reused connection whose write failed with a reset is not reported lost")
		}
	})
}

// finHeld is a server's TCP connection whose Close sends nothing: a
// tls.Conn over it sends its close_notify alert and no FIN (the FIN of a
// server that is slow to close, still on its way).
type finHeld struct{ net.Conn }

func (finHeld) Close() error { return nil }

// tlsPair returns a TLS client and server over tcpPair, handshake done.
// The server's TCP connection sends no FIN on Close with holdFIN.
func tlsPair(t *testing.T, version uint16, holdFIN bool, clientCert bool) (client, server *tls.Conn, raw net.Conn, ca *testcerts.CA) {
	t.Helper()
	dir := t.TempDir()
	ca = testcerts.New(t)
	certFile, keyFile := ca.Issue(t, dir, "replica", "127.0.0.1")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	c, s := tcpPair(t)
	var under net.Conn = s
	if holdFIN {
		under = finHeld{s}
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MaxVersion: version}
	if clientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = ca.Pool()
	}
	server = tls.Server(under, cfg)
	client = tls.Client(c, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	done := make(chan error, 1)
	go func() { done <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	if !clientCert {
		if err := within(t, done, 5*time.Second, "the server's handshake"); err != nil {
			t.Fatal(err)
		}
	}
	return client, server, c, ca
}

// The stale check over TLS: a replica that closes an idle connection
// sends its close_notify alert first. Whether its FIN follows or not yet,
// the next write on the connection must fail as stale before sending
// anything; so must any other record the replica sent unasked. An idle
// connection the replica left alone is reused.
func TestStaleCheckOverTLS(t *testing.T) {
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for name, tc := range map[string]struct {
			holdFIN bool
			act     func(s *tls.Conn) // on the idle connection, server side
			stale   bool
		}{
			"close_notify and FIN":  {act: func(s *tls.Conn) { s.Close() }, stale: true},
			"close_notify, no FIN":  {holdFIN: true, act: func(s *tls.Conn) { s.Close() }, stale: true},
			"unasked record":        {act: func(s *tls.Conn) { s.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n")) }, stale: true},
			"nothing: reused as is": {act: func(*tls.Conn) {}},
		} {
			t.Run(tls.VersionName(version)+", "+name, func(t *testing.T) {
				client, server, c, _ := tlsPair(t, version, tc.holdFIN, false)
				w := NewReplicaConn(client, 0, nil)
				if !w.isTLS {
					t.Fatal("the wrapper does not know it wraps TLS")
				}
				exchangeBytes(t, w, server)
				tc.act(server)
				if tc.stale {
					poll.Until(t, 5*time.Second, "the replica's record to reach the proxy's socket", func() bool { return peerSpoke(c) })
				}
				if first, _, _ := peek(c); tc.holdFIN && version == tls.VersionTLS12 && first != 21 {
					t.Fatalf("the first byte waiting is %d, want 21 (a TLS 1.2 alert record)", first)
				}
				// Idle for longer than timeouts.request: a read deadline in the past.
				if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
					t.Fatal(err)
				}
				_, err := w.Write([]byte("q"))
				if tc.stale {
					if !errors.Is(err, ErrStale) {
						t.Fatalf("write after the replica's %s: %v, want ErrStale", name, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("write on an idle connection the replica left alone: %v", err)
				}
				var b [1]byte
				if _, err := io.ReadFull(server, b[:]); err != nil || b[0] != 'q' {
					t.Fatalf("the replica read %q, %v", b[:], err)
				}
			})
		}
	}
}

// With TLS 1.3 the client's handshake ends before the server has checked
// the client's certificate: a replica that requires one and gets none
// answers the first exchange with an alert. The outcome says so.
func TestTLSAlertInPlaceOfTheFirstReply(t *testing.T) {
	client, server, _, _ := tlsPair(t, tls.VersionTLS13, false, true)
	go func() { _ = server.Handshake(); server.Close() }()
	w := NewReplicaConn(client, 0, nil)
	if _, err := w.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := w.Read(b[:]); err == nil {
		t.Fatal("read after the replica refused the handshake succeeded")
	}
	var o Outcome
	w.outcome(&o)
	if o.TLSRefused == nil || !IsRemoteAlert(o.TLSRefused) {
		t.Fatalf("TLSRefused = %v, want the replica's alert", o.TLSRefused)
	}
}
