package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

// localReason says why keyway answered a request itself.
type localReason uint8

const (
	lrNoKey         localReason = iota // 400: no key and fallback reject
	lrBadKey                           // 400: key in a non-canonical form
	lrBodyTooLarge                     // 413
	lrNoReplica                        // 503: nothing in rotation for this key
	lrUnreachable                      // 503: every candidate refused or had no free connection
	lrUpstream                         // 502: the replica failed after the request was sent
	lrTimeout                          // 504: the replica did not answer in time
	lrInternal                         // 502: a bug in keyway (recovered panic)
	lrStopped                          // 503: an operator stopped the set
	lrOverloaded                       // 503 or 429: the key's replica is at its in-flight bound or out of pooled connections
	lrSetOverloaded                    // 503 or 429: the set is at its in-flight bound on this proxy
	lrSaturated                        // 503: the key's replica said it is saturated (pressure header)
	lrMemory                           // 503: the memory guard sheds (heap or bodies in flight)
	lrQueueTimeout                     // 503 or 429: the key's replica stayed full while the request waited in its queue
	localReasons
)

var localReasonNames = [localReasons]string{"no_key", "bad_key", "body_too_large", "no_replica", "unreachable", "upstream_error", "upstream_timeout", "internal", "set_stopped", "overloaded", "set_overloaded", "replica_saturated", "memory", "queue_timeout"}

func (r localReason) String() string { return localReasonNames[r] }

// request is one request's way through keyway: made by handle and passed
// by pointer down the path (route, forward, the wire round trip, the
// reply), never kept after handle returns. What one step decided is a
// field here, not state a later step reads back out of the connection.
type request struct {
	ctx   *fasthttp.RequestCtx
	start time.Time // when fasthttp had read the request
	// fields are the head's fields of interest (fieldOf), or fieldsAll
	// where the head cannot tell.
	fields fields
	rs     *replicaSet // nil until a set matched

	// Set by forward (prepare) for the request's attempts.
	deadline    time.Time // timeouts.request from start
	clientClose bool      // the client asked to close its connection
	http10      bool      // the client spoke HTTP/1.0 (forwarded as 1.1)
	lines       *[]byte   // forwarding header lines written after the head; nil: set in the header
	ownID       bool      // keyway gave the request its ID: id
	id          [32]byte

	// Who tried: the last replica tried, the attempts made, the time spent
	// in exchanges with replicas; named is the replica an answer names
	// when none was tried. For the answer and the access log.
	last     *Backend
	tried    int
	upstream time.Duration
	named    string
}

// requestID returns the ID keyway gave the request, or nil.
func (r *request) requestID() []byte {
	if !r.ownID {
		return nil
	}
	return r.id[:]
}

// replica names the last replica tried, or "".
func (r *request) replica() string {
	if r.last == nil {
		return r.named
	}
	return r.last.name
}

// handle is the request path: the head's verdict, then route (route.go),
// which forwards (forward.go) and replies (reply.go).
//
// Its defer is open-coded by the compiler (one defer, few returns): no
// defer record per request.
func (p *Proxy) handle(ctx *fasthttp.RequestCtx) {
	p.metrics.inflight.Inc()
	r := request{ctx: ctx, start: ctx.Time()}
	if r.start.IsZero() {
		r.start = time.Now() // a context that fasthttp's server did not start
	}
	defer func() {
		p.metrics.inflight.Dec()
		if v := recover(); v != nil {
			p.panicked(&r, v)
		}
	}()
	if v := p.headVerdict(&r); v != vOK {
		p.reply(&r, refusal(v))
		return
	}
	p.route(&r)
}

// lifecycleReady reports whether a replica's own view allows traffic —
// ready and not down in gossip — whatever this proxy's health checks say.
func lifecycleReady(r *balancer.Replica) bool { return r.State == balancer.StateReady && !r.Down }
