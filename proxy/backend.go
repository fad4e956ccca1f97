package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"keyway/balancer"
	"keyway/proxy/internal/wire"
)

// Backend is the proxy's long-lived state for one replica: its keep-alive
// connection pool, in-flight count, traffic counters and latency series. It
// survives table rebuilds (the Router keeps one per ring member) and is
// safe for concurrent use. It must not be copied.
type Backend struct {
	_        noCopy
	name     string
	addr     string
	tlsName  string // the server name its TLS connections verify ("" without TLS, or insecure_skip_verify)
	hc       *fasthttp.HostClient
	inflight atomic.Int64
	// lastOK and lastFail are when (Unix nanoseconds) the replica last
	// answered below 500, and last answered 5xx or failed an exchange that
	// reached it: this proxy's evidence for vetoing others' votes against
	// the replica (fleet.go).
	lastOK, lastFail atomic.Int64
	// refused says this backend holds its replica out of rotation after a
	// refused connection; refusedGen numbers those holds. refusedMu
	// serializes taking and lifting a hold together with the Router call,
	// so that an ejection and a readmission cannot interleave (lock order:
	// refusedMu, then the Router's and the set's locks).
	refusedMu  sync.Mutex
	refused    atomic.Bool
	refusedGen uint64
	// released says the Router retired this backend: requests still using
	// it close their connection when they finish.
	released atomic.Bool
	// pool numbers the generations of the backend's connections: it goes
	// up when the replica's process is replaced (a new incarnation at the
	// same address, see retirePool). A connection made in an earlier
	// generation is closed when handed back and never reused.
	pool atomic.Uint64
	// tlsLogged is when (Unix nanoseconds) a failed TLS handshake with the
	// replica was last logged; tlsUnlogged counts those not logged since.
	tlsLogged, tlsUnlogged atomic.Int64
	// saturatedUntil is when (Unix nanoseconds) the replica's last
	// "saturated" answer stops shedding its keyed requests (shed.go).
	saturatedUntil atomic.Int64
	// queue holds the requests waiting for one of the replica's
	// max_inflight_per_replica slots (shed.go).
	queue replicaQueue
	// shedText caches the messages of its shed answers (shed.go).
	shedText atomic.Pointer[shedTexts]

	ctr     *replicaCounters // shared by every Backend of the replica while it stays on the ring
	latency prometheus.Observer
}

// Name returns the replica's name.
func (b *Backend) Name() string { return b.name }

// Addr returns the address the backend dials.
func (b *Backend) Addr() string { return b.addr }

// Inflight returns the number of requests being forwarded to the replica now.
func (b *Backend) Inflight() int64 { return b.inflight.Load() }

// retirePool is called when the replica's process was replaced by a new
// incarnation at the same address: the old process's connections are
// dead or about to be. Its idle connections close now; connections in use
// close when their request hands them back (forward compares the
// generation), and any that slips back into the pool fails its next reuse
// as stale before writing (wire.ReplicaConn). Safe for concurrent use.
func (b *Backend) retirePool() {
	b.pool.Add(1)
	b.hc.CloseIdleConnections()
}

type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// DialError is returned for a connection that could not be made: the
// request never reached the replica, so it is always safe to retry.
type DialError struct {
	Addr string
	Err  error
}

func (e *DialError) Error() string { return "dial " + e.Addr + ": " + e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// ConnectFailure marks the error as a failure to connect, for passive
// health checks (health.Checker classifies errors by this method).
func (e *DialError) ConnectFailure() bool { return true }

// HandshakeError is returned for a connection whose TLS handshake with
// the replica failed (tls.enabled): the request never reached the
// replica, so it is always safe to retry; and the replica cannot be
// reached as configured, so it counts against it like a failed connect.
type HandshakeError struct {
	Addr       string
	ServerName string // the name verified ("" with insecure_skip_verify)
	Err        error
}

func (e *HandshakeError) Error() string {
	return "tls handshake with " + e.Addr + " (server name " + strconv.Quote(e.ServerName) + "): " + e.Err.Error() + handshakeHint(e.Err)
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// ConnectFailure marks the error as a failure to connect, for passive
// health checks.
func (e *HandshakeError) ConnectFailure() bool { return true }

// handshakeHint says which key to check for a failed handshake.
func handshakeHint(err error) string {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	switch {
	case errors.As(err, &unknown):
		return "; check the set's tls.ca_file: it must hold the CA that signed the replica's certificate"
	case errors.As(err, &host):
		return "; the replica's certificate is not issued for this name: set the set's tls.server_name (\"{replica}\" stands for the replica's name)"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "; the replica's certificate expired (or is not valid yet): renew it"
	case errors.As(err, &record):
		return "; the replica does not speak TLS at this address: turn the set's tls.enabled off, or point it at the replica's TLS port"
	case wire.IsRemoteAlert(err):
		return "; the replica refused the handshake: if it requires a client certificate (mTLS), check the set's tls.cert_file and tls.key_file, and that its CA trusts them"
	}
	return ""
}

// dialFunc opens a connection to a replica. Tests replace net.DialTimeout
// with an in-memory listener's Dial (Options.dial).
type dialFunc func(addr string, timeout time.Duration) (net.Conn, error)

// newHostClient makes the connection pool of a replica. pool is the
// backend's pool generation (Backend.pool): each connection remembers the
// generation it was dialed in. tlsCfg, when not nil, makes every
// connection a TLS one, its handshake done within timeouts.connect along
// with the TCP connect.
func newHostClient(rep balancer.Replica, sc *SetConfig, dial dialFunc, pool *atomic.Uint64, tlsCfg *tls.Config) *fasthttp.HostClient {
	connect := sc.Timeouts.Connect
	if dial == nil {
		dial = func(addr string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("tcp", addr, timeout)
		}
	}
	return &fasthttp.HostClient{
		Addr: rep.Addr,
		Name: "",
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			if timeout <= 0 || timeout > connect {
				timeout = connect
			}
			start := time.Now()
			gen := pool.Load()
			c, err := dial(addr, timeout)
			if err != nil {
				return nil, &DialError{Addr: addr, Err: err}
			}
			if tlsCfg != nil {
				// keyway does the handshake itself rather than fasthttp
				// (IsTLS): the stale check wraps the tls.Conn and peeks at
				// the socket beneath it, and a failed handshake becomes a
				// HandshakeError. fasthttp sees a plain connection and
				// requests stay http:// (IsTLS false).
				tc := tls.Client(c, tlsCfg)
				_ = c.SetDeadline(start.Add(timeout))
				if err := tc.Handshake(); err != nil {
					c.Close()
					return nil, &HandshakeError{Addr: addr, ServerName: tlsCfg.ServerName, Err: err}
				}
				_ = c.SetDeadline(time.Time{})
				return wire.NewReplicaConn(tc, gen, pool), nil
			}
			return wire.NewReplicaConn(c, gen, pool), nil
		},
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		MaxConns:                      sc.MaxConnsPerReplica,
		MaxConnWaitTimeout:            100 * time.Millisecond,
		MaxIdleConnDuration:           sc.Timeouts.Idle,
		// No ReadTimeout or WriteTimeout: every exchange goes through
		// wire.RoundTrip with its request's deadline (timeouts.request
		// from the request's start), which bounds the pool wait, the write
		// and the read. Do is never called: no transport, and the retry
		// settings below only guard against a future caller.
		MaxIdemponentCallAttempts: 1, // keyway owns every retry
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		ConnPoolStrategy:          fasthttp.LIFO,
		MaxResponseBodySize:       int(sc.MaxResponseBodyBytes), // beyond: ErrBodyTooLarge, the connection closed
		ReadBufferSize:            16 << 10,
	}
}

// errKind classifies a failed exchange with a replica.
type errKind uint8

const (
	errDial        errKind = iota // could not connect: never reached the replica
	errStale                      // a pooled connection was already closed: nothing sent
	errNoFreeConns                // pool exhausted: never reached the replica
	errTimeout                    // no complete answer in time: fate unknown
	errReset                      // connection closed or reset after sending: fate unknown
	errOther                      // anything else (malformed response, ...): fate unknown
	// A reused pooled connection closed or reset before the first response
	// byte: the replica closed it as the request went out (a restart, its
	// keep-alive timeout). Fate unknown, but no evidence against the
	// replica.
	errReusedClosed
	errTLS // the TLS handshake failed (HandshakeError): never reached the replica
	// The reply's body exceeds the set's max_response_body_bytes: the
	// replica answered, keyway relays nothing of it. No evidence against
	// the replica (its answer may be right, the bound too low), and not
	// retried: another replica would answer alike.
	errReplyTooLarge
	errKinds
)

var errKindNames = [errKinds]string{"dial", "stale_conn", "no_free_conns", "timeout", "reset", "other", "reused_closed", "tls_handshake", "reply_too_large"}

func (k errKind) String() string { return errKindNames[k] }

// evidence reports whether a failure of this kind says something about the
// replica, for passive health checks (Observer): keyway's own outcomes (no
// free pooled connection, a reply over its own bound) and dead pooled
// connections (stale, or closed by the replica as the request went out)
// do not.
func (k errKind) evidence() bool {
	return k != errStale && k != errNoFreeConns && k != errReusedClosed && k != errReplyTooLarge
}

// neverSent reports whether the request provably did not reach the replica.
func (k errKind) neverSent() bool {
	return k == errDial || k == errStale || k == errNoFreeConns || k == errTLS
}

// errBadStatus is a replica reply whose status is no final status a
// client could take: 101, one not three digits, or 600-999.
var errBadStatus = errors.New("the replica's reply has no final status code from 200 to 599")

// classifyAttempt classifies a failed attempt on b from its outcome: a
// reset or close of a reused connection before the first reply byte is
// errReusedClosed, and a TLS alert on a fresh connection before the first
// reply byte is errTLS, whatever error fasthttp made of them. It returns
// the error to report: o.Err, or for errTLS the HandshakeError behind it.
func classifyAttempt(o wire.Outcome, b *Backend) (errKind, error) {
	k := classify(o.Err)
	switch {
	case o.Stale:
		return errStale, wire.ErrStale
	case k == errReset && o.LostReused:
		return errReusedClosed, o.Err
	case !k.neverSent() && o.TLSRefused != nil:
		return errTLS, &HandshakeError{Addr: b.addr, ServerName: b.tlsName, Err: o.TLSRefused}
	}
	return k, o.Err
}

func classify(err error) errKind {
	var de *DialError
	var he *HandshakeError
	switch {
	case errors.As(err, &de):
		return errDial
	case errors.As(err, &he):
		return errTLS
	case errors.Is(err, wire.ErrStale), errors.Is(err, wire.ErrNoHeadEnd):
		// ErrNoHeadEnd: nothing was written.
		return errStale
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return errNoFreeConns
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout):
		return errTimeout
	case errors.Is(err, fasthttp.ErrConnectionClosed):
		return errReset
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return errReplyTooLarge
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errTimeout
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return errReset
	}
	return errOther
}
