package tlsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Listener wraps ln so that every accepted connection is a TLS server
// connection (a *Conn) using TLSConfig. The handshake happens when the
// server first calls Handshake, Read or Write, on the server's goroutine
// for the connection and under its deadlines, never in Accept.
//
// A connection whose handshake failed is counted
// (keyway_tls_handshake_errors_total), logged at debug level, and then
// reads as closed (net.ErrClosed): a server does not answer it with an
// HTTP error nor log it as a broken request. fasthttp serves it as is;
// net/http needs *tls.Conn to fill Request.TLS, so serve it with
// tls.NewListener(ln, s.TLSConfig()) instead.
func (s *Server) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, s: s} }

type listener struct {
	net.Listener
	s *Server
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: tls.Server(c, l.s.base), s: l.s}, nil
}

// errHandshake is what a connection whose handshake failed reads.
var errHandshake = fmt.Errorf("tls handshake failed: %w", net.ErrClosed)

// Conn is a server connection accepted by Listener: a *tls.Conn that
// counts a failed handshake once. Its methods are tls.Conn's (so
// fasthttp's RequestCtx.IsTLS is true); NetConn returns the accepted
// connection. It must not be copied.
type Conn struct {
	*tls.Conn
	s      *Server
	failed atomic.Bool
}

// Handshake runs the handshake if it has not run yet.
func (c *Conn) Handshake() error { return c.HandshakeContext(context.Background()) }

// HandshakeContext is Handshake with a context.
func (c *Conn) HandshakeContext(ctx context.Context) error {
	err := c.Conn.HandshakeContext(ctx)
	if err != nil {
		c.fail(err)
	}
	return err
}

// Read reads application data, running the handshake first if needed.
func (c *Conn) Read(b []byte) (int, error) {
	if c.failed.Load() {
		return 0, errHandshake
	}
	n, err := c.Conn.Read(b)
	if err != nil && !c.Conn.ConnectionState().HandshakeComplete {
		c.fail(err)
		return n, errHandshake
	}
	return n, err
}

// fail records a failed handshake once.
func (c *Conn) fail(err error) {
	if !c.failed.CompareAndSwap(false, true) {
		return
	}
	// A client that connects and closes without a hello (a TCP health
	// check, a port scan) did not fail a handshake.
	if errors.Is(err, io.EOF) {
		return
	}
	c.s.handshakes.Inc()
	if ce := c.s.log.Check(zapcore.DebugLevel, "TLS handshake failed"); ce != nil {
		ce.Write(zap.String("listener", c.s.name), zap.Stringer("remote", c.RemoteAddr()), zap.Error(err))
	}
}
