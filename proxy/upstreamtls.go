package proxy

import (
	"crypto/tls"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// TLS to replicas (a set's tls section): the dial and its HandshakeError
// live in backend.go, the stale check over TLS in staleconn.go; this file
// has what the proxy says about it.

// handshakeLogEvery bounds the warnings about one replica's failed TLS
// handshakes: a replica with a certificate the proxy refuses fails every
// dial, and a log line per request would drown the log.
const handshakeLogEvery = 10 * time.Second

// handshakeFailed logs a failed TLS handshake with b's replica: the first
// one, then at most one per handshakeLogEvery with the number left
// unlogged meanwhile. Called from fasthttp's dial, on the request path of
// the request that needed the connection.
func (p *Proxy) handshakeFailed(set string, b *Backend, err error) {
	now := time.Now().UnixNano()
	last := b.tlsLogged.Load()
	if last != 0 && now-last < int64(handshakeLogEvery) || !b.tlsLogged.CompareAndSwap(last, now) {
		b.tlsUnlogged.Add(1)
		return
	}
	p.log.Warn("TLS handshake with a replica failed; the request goes to the next candidate or gets 503",
		zap.String("set", set), zap.String("replica", b.name), zap.String("addr", b.addr),
		zap.Int64("unlogged_failures", b.tlsUnlogged.Swap(0)), zap.Error(err))
}

// ReplicaTLS returns the TLS configuration the proxy's requests to a
// replica of set use now — the set's CA, client certificate and server
// name for replica at addr — or nil when the set speaks plain HTTP to its
// replicas or is not served. Each call makes a new configuration, for
// active health probes (health.Options.ProbeTLS). Safe for concurrent use.
func (p *Proxy) ReplicaTLS(set, replica, addr string) *tls.Config {
	rs := p.routes.Load().byName[set]
	if rs == nil || rs.tls == nil {
		return nil
	}
	return rs.tls.Config(replica, addr)
}

// warnTLS logs, once per call, what the sets' tls sections make unsafe
// (insecure_skip_verify) or ignore: at start and at every reload, so that
// it is never forgotten in a log rotated long ago.
func (p *Proxy) warnTLS(scs []SetConfig) {
	for _, sc := range scs {
		for _, w := range sc.TLS.Warnings() {
			p.log.Warn("replica set TLS setting", zap.String("set", sc.Name), zap.String("warning", "tls."+w))
		}
	}
}

// Warnings describes what in c is valid but unsafe or probably a mistake,
// one line each starting with the key's YAML path, e.g.
// "replica_sets[0].tls.insecure_skip_verify: true: ...". keyway validate
// prints them.
func (c Config) Warnings() []string {
	var out []string
	for i, sc := range c.ReplicaSets {
		for _, w := range sc.TLS.Warnings() {
			out = append(out, fmt.Sprintf("replica_sets[%d].tls.%s (set %s)", i, w, sc.Name))
		}
	}
	return out
}
