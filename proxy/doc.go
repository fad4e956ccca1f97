// Package proxy is keyway's HTTP front end: a fasthttp server that routes
// each request to one replica of a replica set and relays the answer.
//
// # Request path
//
// Per request, one value (request, handler.go) passed down the path: the
// head's verdict (framing.go) → match the replica set by host and raw path
// prefix → take the key from the set's sources in order (header, path
// segment, query; the first present one decides) → one atomic load of the
// set's [balancer.Table] → its precomputed candidates for the key's
// partition (route.go) → forward (forward.go), each attempt one round trip
// on the candidate's [fasthttp.HostClient] pool (proxy/internal/wire),
// whose outcome comes back as a value → relay the reply or answer itself
// (reply.go), and record the outcome (metrics, [Observer], the access
// log). A request without a key follows the set's fallback policy. In
// steady state a proxied request allocates nothing (TestHandlerAllocs,
// BenchmarkProxyRequest). docs/proxy.md lists the walk, and what keyway
// assumes of fasthttp and Go, each with its contract test.
//
// Where a request goes is decided by one function (route.go): the
// candidates of its key (failover next or strict), the fallback for a
// request without one, and the all-down policy (fail open or closed).
// [Proxy.Explain] reports that same decision for a key, so an explanation
// cannot disagree with the routing.
//
// # Own state
//
// The proxy answers for its own state: what it sent each replica is kept
// in atomic counters per set and per replica (counters.go), exported as
// keyway_requests_total and keyway_upstream_errors_total and read by
// [Proxy.Traffic] with rates (traffic.go); a replica that refuses a
// connection is held out of rotation on this proxy for [RefusedHold]
// (refused.go).
//
// # Delivery contract
//
// keyway answers 2xx only when a replica did. A request that provably never
// reached a replica (dial failure, failed TLS handshake, no free pooled
// connection, a stale pooled connection) goes to the
// next candidate; one whose fate is unknown (reset or bad answer after
// sending) only if it is replayable: an idempotent method or the
// configured idempotency header. A timeout spends the set's whole request
// budget and is never retried. What keyway answers itself is a small JSON
// body {"error","replica_set","replica"}:
//
//	400  no key (fallback reject, naming the sources) or a key in a non-canonical form
//	404  no replica set matches
//	413  body over max_body_bytes      431  headers over max_header_bytes
//	414  request line alone over max_header_bytes
//	501  CONNECT, or a transfer coding keyway does not implement
//	502  the replica failed after the request was sent, or its reply body exceeds max_response_body_bytes
//	503  nothing in rotation (or failover strict), or no candidate reachable; with Retry-After
//	504  the replica did not answer within timeouts.request
//
// # Headers
//
// Hop-by-hop headers and the ones a Connection header lists are dropped in
// both directions, except that Connection cannot remove Host,
// Content-Length or the X-Forwarded-* and X-Request-Id headers keyway sets.
// The raw request URI is forwarded byte for byte; upstream keyway speaks
// HTTP/1.1 and keeps its pooled connections whatever the client or the
// replica say about theirs. No User-Agent, Server or Content-Type is
// added.
//
// # TLS to replicas
//
// A set with tls.enabled speaks TLS to its replicas (upstreamtls.go): one
// tls.Config per replica (its server name, its session cache), the
// handshake done in the dial (backend.go) so that the replica connection
// (wire.ReplicaConn) wraps the tls.Conn and peeks at the TCP socket beneath:
// a close_notify on an idle pooled connection retires it before reuse.
package proxy
