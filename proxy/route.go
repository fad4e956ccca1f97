package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
	"keyway/proxy/internal/wire"
)

// route is the request's way to its candidates: the set its host and path
// match, the set's bounds (body size, the memory guard, its in-flight
// bound), its key, and the routing decision (decide); then forward.
func (p *Proxy) route(r *request) {
	ctx := r.ctx
	if len(ctx.Host()) == 0 {
		// HTTP/1.1 without Host fasthttp refuses itself; an HTTP/1.0
		// request may lack it, but keyway routes by it and a replica
		// needs one.
		p.reply(r, refusal(vNoHost))
		return
	}
	uri := ctx.URI()
	path := uri.PathOriginal()
	rs, g := p.matchRoute(ctx.Host(), path)
	r.rs = rs
	if g != nil {
		r.rs = nil
		p.reply(r, answer{status: fasthttp.StatusGone, why: "set_deleted", msg: g.msg})
		return
	}
	if r.rs == nil {
		p.reply(r, answer{status: fasthttp.StatusNotFound, why: "no_set",
			msg: "no replica set matches host " + strconv.Quote(string(ctx.Host())) + " and path " + strconv.Quote(string(path))})
		return
	}
	if p.mem.over.Load() {
		p.reply(r, answer{reason: lrMemory, status: fasthttp.StatusServiceUnavailable, retry: time.Second,
			msg: "keyway's heap is above server.max_heap_bytes: the request was not delivered; retry later"})
		return
	}
	if stream := ctx.RequestBodyStream(); stream != nil && !p.readBody(r, stream) {
		return
	}
	p.admit(r, path, uri)
}

// readBody reads the request's body before any replica connection is
// taken: whole, if it fits the body buffer (server.body_buffer_bytes),
// else until the buffer is full, the rest to be streamed to the replica
// as it takes it (wire.Body). Each chunk of the buffer is taken from the
// memory guard's budget (server.max_inflight_body_bytes) before it is
// allocated. It answers and reports false for a body it refuses or could
// not read.
func (p *Proxy) readBody(r *request, stream io.Reader) bool {
	rs, req := r.rs, &r.ctx.Request
	r.body = wire.AcquireBody()
	err := r.body.Fill(stream, int64(req.Header.ContentLength()), int64(rs.maxBody), p.bodyBuffer, p.mem)
	if err != nil {
		p.reply(r, bodyAnswer(rs, err))
		return false
	}
	if b := r.body.Bytes(); b != nil {
		req.SetBodyRaw(b) // whole: sent as it is, on every attempt
	}
	return true
}

// tooLarge is keyway's answer to a request whose body exceeds its set's
// max_body_bytes. The rest of the body is unread: the connection closes
// lingering, so that a client still sending reads the answer.
func tooLarge(rs *replicaSet) answer {
	return answer{reason: lrBodyTooLarge, status: fasthttp.StatusRequestEntityTooLarge, conn: connLinger,
		msg: "request body exceeds max_body_bytes (" + ByteSize(rs.maxBody).String() + ") of this replica set"}
}

// bodyAnswer is keyway's answer to a request whose body failed as err
// said (wire.Body.Err): too large, over the budget, or not received.
func bodyAnswer(rs *replicaSet, err error) answer {
	var ne net.Error
	switch {
	case errors.Is(err, wire.ErrBodyTooLarge):
		return tooLarge(rs)
	case errors.Is(err, wire.ErrBudget):
		return answer{reason: lrMemory, status: fasthttp.StatusServiceUnavailable, retry: time.Second, conn: connLinger,
			msg: "the request bodies buffered would exceed server.max_inflight_body_bytes: the request was not delivered; retry later"}
	case errors.As(err, &ne) && ne.Timeout():
		return answer{reason: lrClientBody, status: fasthttp.StatusRequestTimeout, conn: connClose,
			msg: "request body not received within server.read_timeout: the request was not delivered"}
	}
	return answer{reason: lrClientBody, status: fasthttp.StatusBadRequest, conn: connClose,
		msg: "request body could not be read (" + err.Error() + "): the request was not delivered"}
}

// admit holds the request's share of its set's in-flight bound while it
// is dispatched, or sheds it.
func (p *Proxy) admit(r *request, path []byte, uri *fasthttp.URI) {
	rs := r.rs
	if bound := rs.limits.set; bound > 0 {
		st := rs.st
		defer st.inflight.Add(-1)
		if st.inflight.Add(1) > bound {
			p.reply(r, answer{reason: lrSetOverloaded, status: rs.limits.status, retry: time.Second, msg: rs.limits.setMsg})
			return
		}
	}
	p.dispatch(r, path, uri)
}

// dispatch keys the request, decides its candidates and forwards it.
func (p *Proxy) dispatch(r *request, path []byte, uri *fasthttp.URI) {
	rs := r.rs
	t := rs.router.Table()
	hash, status, src := rs.key(&r.ctx.Request.Header, path, uri)
	if status == balancer.KeyDuplicate {
		p.reply(r, answer{reason: lrDupKey, status: fasthttp.StatusBadRequest, msg: rs.sources[src].dupMsg})
		return
	}
	var buf [8]uint16
	cands, d := p.decide(rs, t, status, hash, buf[:0])
	if d.allDown {
		rs.allDown.Inc()
	}
	if len(cands) == 0 {
		a := answer{reason: d.reason, status: d.status, msg: d.msg}
		if d.reason == lrStopped {
			// A stopped set stays stopped until an operator starts it:
			// producers need not retry every second.
			a.retry = 10 * time.Second
		}
		r.named = d.replica
		p.reply(r, a)
		return
	}
	p.forward(r, t, cands, status == balancer.KeyOK, hash)
}

// key looks for the request's key in the set's sources, in order: the
// first source that is present decides (a malformed key is KeyInvalid, a
// key header or query parameter sent twice KeyDuplicate, not skipped). It
// also returns the index of the source that decided. path is the raw
// request path.
func (rs *replicaSet) key(h *fasthttp.RequestHeader, path []byte, uri *fasthttp.URI) (uint64, balancer.KeyStatus, int) {
	for i := range rs.sources {
		src := &rs.sources[i]
		var hash uint64
		var status balancer.KeyStatus
		switch src.kind {
		case keyHeader:
			// Every field of the name: fasthttp's PeekBytes gives the
			// first, a replica may read another.
			hash, status = balancer.HashHeaderValues(h.PeekAll(src.header))
		case keyPathSegment:
			hash, status = balancer.HashPathSegment(path, src.segment)
		default:
			hash, status = balancer.HashQuery(uri.QueryString(), src.name)
		}
		if status != balancer.KeyMissing {
			return hash, status, i
		}
	}
	return 0, balancer.KeyMissing, -1
}

// matchSet returns the replica set of a request, or nil.
func (p *Proxy) matchSet(host, path []byte) *replicaSet {
	rs, _ := p.matchRoute(host, path)
	return rs
}

// goneRoute is the route of a set deleted at run time (Config.Gone).
type goneRoute struct {
	host, prefix []byte
	msg          string // the 410's message
}

// matchRoute returns the replica set of a request (nil for none) and,
// when the request matches a deleted set's route more closely than that
// set, the route (nil otherwise): such a request is answered 410, not
// sent to a broader set. One load of the routes, one pass over each list.
func (p *Proxy) matchRoute(host, path []byte) (*replicaSet, *goneRoute) {
	if i := bytes.LastIndexByte(host, ':'); i >= 0 && bytes.IndexByte(host[i:], ']') < 0 {
		host = host[:i]
	}
	rt := p.routes.Load()
	var match *replicaSet
	for _, rs := range rt.sets {
		if (len(rs.host) == 0 || bytes.EqualFold(rs.host, host)) && hasPathPrefix(path, rs.prefix) {
			match = rs
			break
		}
	}
	for i := range rt.gone {
		g := &rt.gone[i]
		if len(g.host) > 0 && !bytes.EqualFold(g.host, host) || !hasPathPrefix(path, g.prefix) {
			continue
		}
		if match != nil && (len(match.host) > len(g.host) || len(match.host) == len(g.host) && len(match.prefix) >= len(g.prefix)) {
			return match, nil // the set served matches at least as closely
		}
		return match, g
	}
	return match, nil
}

// hasPathPrefix matches whole segments: "/orders" matches "/orders" and
// "/orders/x" but not "/ordersx"; a prefix ending in '/' is a plain prefix.
func hasPathPrefix(path, prefix []byte) bool {
	if !bytes.HasPrefix(path, prefix) {
		return false
	}
	if len(path) == len(prefix) || prefix[len(prefix)-1] == '/' {
		return true
	}
	c := path[len(prefix)]
	return c == '/' || c == '?'
}

// decision is how a request is routed, besides the slots it tries (which
// decide returns apart: escape analysis is field-insensitive, and the
// slots may point into the caller's stack buffer while the message goes to
// the heap-bound response). It refers to constant strings only: making
// one allocates nothing.
type decision struct {
	// allDown says the set has ring members and none in rotation: the
	// all-down policy decided (keyway_all_replicas_unhealthy_total).
	allDown bool
	// failOpen says the first slot was chosen by the all-down fail-open
	// policy.
	failOpen bool
	// keyway's own answer when there is no slot to try: why
	// (local_responses_total), the status, the message and the replica
	// the error body names.
	reason  localReason
	status  int
	msg     string
	replica string
}

const (
	msgNoReplica = "no replica of this set is in rotation"
	msgStopped   = "this replica set is stopped by an operator; it answers again once started"
	msgStrict    = "the owner of this key is out of rotation and failover is strict"
	msgBadKey    = "the key is not in canonical form: it contains an encoded '/', '\\', '.' or '%', a backslash, a malformed escape or a dot-segment; send the key unencoded or with other escapes only"

	skipStrict       = "failover strict: only the owner may take the key"
	skipNotCandidate = "not a candidate"
	skipStopped      = "the replica set is stopped"
)

// decide is the routing decision for one request of rs, whose key lookup
// gave ks and hash, on table t: the request handler routes by it and
// Explain explains it, so that the two cannot disagree. It returns the
// slots of the attempts, first to last (at most the set's
// retries.attempts), or none when keyway answers itself (d says how). A
// keyed request goes to the key's candidates (failover next or strict); a
// keyless one follows the set's fallback; with no ring member in rotation
// the all-down policy decides both (failOpen). dst is a buffer for slots
// that are not the table's own (capacity 8 suffices). decide counts
// nothing and allocates nothing.
func (p *Proxy) decide(rs *replicaSet, t *balancer.Table[*Backend], ks balancer.KeyStatus, hash uint64, dst []uint16) (cands []uint16, d decision) {
	if rs.cfg.Stopped {
		d.reason, d.status, d.msg = lrStopped, fasthttp.StatusServiceUnavailable, msgStopped
		return nil, d
	}
	switch ks {
	case balancer.KeyInvalid:
		d.reason, d.status, d.msg = lrBadKey, fasthttp.StatusBadRequest, msgBadKey
		return nil, d
	case balancer.KeyOK:
		cands = t.Candidates(hash)
		if len(cands) > rs.attempts {
			cands = cands[:rs.attempts]
		}
		if len(cands) > 0 {
			return cands, d
		}
		owner := t.Owner(hash)
		if d.allDown = allDown(t); d.allDown {
			// Only the ring owner: a key must not split because the health
			// checks failed everywhere at once.
			if s, ok := p.failOpen(t, owner, 1); ok {
				d.failOpen = true
				return oneSlot(dst, s), d
			}
		}
		d.reason, d.status, d.msg = lrNoReplica, fasthttp.StatusServiceUnavailable, msgNoReplica
		if t.Failover() == balancer.FailoverStrict && len(t.Rotation()) > 0 {
			d.msg = msgStrict
		}
		if owner >= 0 {
			d.replica = t.Replica(owner).Name
		}
		return nil, d
	}
	if rs.cfg.Fallback == balancer.FallbackReject {
		d.reason, d.status, d.msg = lrNoKey, fasthttp.StatusBadRequest, rs.noKeyMsg
		return nil, d
	}
	if cands = p.keyless(rs, t, dst); len(cands) > 0 {
		return cands, d
	}
	if d.allDown = allDown(t); d.allDown && p.opts.FailOpen {
		// Any ring member, from a random start.
		if s, ok := p.failOpen(t, rand.IntN(t.Len()), t.Len()); ok {
			d.failOpen = true
			return oneSlot(dst, s), d
		}
	}
	d.reason, d.status, d.msg = lrNoReplica, fasthttp.StatusServiceUnavailable, msgNoReplica
	return nil, d
}

// keyless picks candidates for a request without a key, or nil.
func (p *Proxy) keyless(rs *replicaSet, t *balancer.Table[*Backend], dst []uint16) []uint16 {
	rot := t.Rotation()
	if len(rot) == 0 || rs.cfg.Fallback == balancer.FallbackReject {
		return nil
	}
	var first int
	switch rs.cfg.Fallback {
	case balancer.FallbackRandom:
		first, _ = t.RandomSlot()
	case balancer.FallbackLeastInflight:
		// Power of two choices between two distinct replicas: drawing both
		// with replacement would send a quarter of the requests to a
		// blocked replica of two.
		first = int(rot[0])
		if n := len(rot); n > 1 {
			i := rand.IntN(n)
			j := rand.IntN(n - 1)
			if j >= i {
				j++
			}
			a, b := int(rot[i]), int(rot[j])
			if t.Backend(b).inflight.Load() < t.Backend(a).inflight.Load() {
				a = b
			}
			first = a
		}
	default:
		first, _ = t.NextRoundRobin()
	}
	// Retries go to the following replicas of the rotation.
	i := 0
	for i < len(rot) && int(rot[i]) != first {
		i++
	}
	for n := 0; n < min(len(rot), rs.attempts, cap(dst)); n++ {
		dst = append(dst, rot[(i+n)%len(rot)])
	}
	return dst
}

// oneSlot returns dst holding slot alone. dst must have room for one.
func oneSlot(dst []uint16, slot int) []uint16 {
	dst = dst[:1]
	dst[0] = uint16(slot)
	return dst
}

// allDown reports whether a set has ring members and none is in rotation:
// the case its all-down policy (Options.FailOpen) decides.
func allDown(t *balancer.Table[*Backend]) bool { return len(t.Rotation()) == 0 && t.Len() > 0 }

// failOpen applies the all-down policy to the n ring slots from start on
// (wrapping): failing open, it returns the first whose own lifecycle allows
// traffic — ready and not down in gossip. Fail open bets against the health
// checks, never against a replica's lifecycle: it never picks a draining,
// stopped or dead replica. ok is false when the policy fails closed or no
// such slot exists.
func (p *Proxy) failOpen(t *balancer.Table[*Backend], start, n int) (slot int, ok bool) {
	if !p.opts.FailOpen || start < 0 {
		return -1, false
	}
	for i := 0; i < n; i++ {
		if s := (start + i) % t.Len(); lifecycleReady(t.Replica(s)) {
			return s, true
		}
	}
	return -1, false
}

// Explanation says where a request with a given key goes now on this
// proxy, and why: the decision the request handler makes for it, from one
// routing table snapshot and by the same code. A plain value.
type Explanation struct {
	Set string
	// Key is the key as an X-Key header carries it. Hash is its 64-bit
	// hash (balancer.HashString); path and query keys hash their decoded
	// form identically.
	Key       string
	Hash      uint64
	Partition int
	Failover  balancer.Failover
	// Owner is the ring owner of the key's partition, in rotation or not;
	// "" when the ring is empty.
	Owner string
	// Pick is the replica the first attempt goes to; "" when keyway
	// answers the request itself (see Answer). Later attempts, if the
	// first fails, follow Candidates' Attempt order.
	Pick string
	// FailOpen says Pick was made by the all-down fail-open policy: no
	// replica of the set is in rotation, and the ring owner's own
	// lifecycle allows traffic (Options.FailOpen).
	FailOpen bool
	// AllDown says the set has ring members and none is in rotation (the
	// all-down policy decides, and keyway_all_replicas_unhealthy_total
	// counts the request).
	AllDown bool
	// Answer is keyway's own answer when Pick is "", nil otherwise.
	Answer *Answer
	// Candidates are the ring members in the key's failover order (owner
	// first; up to 8), followed by any replica an attempt goes to beyond
	// that order (with every one of those out of rotation, failover next
	// walks the whole ring).
	Candidates  []Candidate
	Fingerprint string
	Generation  uint64
}

// Answer is a response keyway gives itself: its status code and the error
// message of its JSON body.
type Answer struct {
	Status  int
	Message string
}

// Candidate is one ring member in a key's failover order. A plain value.
type Candidate struct {
	Name       string
	Addr       string
	State      balancer.State
	InRotation bool
	// Attempt is 1 for the replica the first attempt goes to, 2, 3, ... for
	// the retries' order, and 0 for a replica the request never tries.
	Attempt int
	// Skipped says why a replica listed before the last attempt (or any,
	// when keyway answers itself) is not tried: why it is out of rotation
	// (balancer.Member.OutReason), "failover strict: only the owner may
	// take the key", or "not a candidate". "" for attempts and for
	// replicas after the last one.
	Skipped string
}

// ErrEmptyKey is returned by Explain for an empty key: a request with an
// empty key has none, and follows the set's fallback.
var ErrEmptyKey = errors.New("empty key: a request without a key follows the set's fallback, not the ring")

// Explain says where a request whose key is key (as an X-Key header value
// carries it; path and query keys hash their decoded form identically —
// see balancer.HashString) goes now on this proxy, and why. The error
// wraps ErrUnknownSet for a set the proxy does not serve, or is
// ErrEmptyKey. Safe for concurrent use; it changes no counter.
func (p *Proxy) Explain(set, key string) (Explanation, error) {
	rs := p.routes.Load().byName[set]
	if rs == nil {
		return Explanation{}, fmt.Errorf("%w %q", ErrUnknownSet, set)
	}
	if key == "" {
		return Explanation{}, ErrEmptyKey
	}
	t := rs.router.Table()
	h := balancer.HashString(key)
	var buf [8]uint16
	cands, d := p.decide(rs, t, balancer.KeyOK, h, buf[:0])

	ex := Explanation{
		Set: set, Key: key, Hash: h, Partition: t.Partition(h), Failover: t.Failover(),
		FailOpen: d.failOpen, AllDown: d.allDown,
		Fingerprint: t.Fingerprint(), Generation: t.Generation(),
		Candidates: []Candidate{},
	}
	if o := t.Owner(h); o >= 0 {
		ex.Owner = t.Replica(o).Name
	}
	if len(cands) == 0 {
		ex.Answer = &Answer{Status: d.status, Message: d.msg}
	} else {
		ex.Pick = t.Replica(int(cands[0])).Name
	}
	order := t.Order(h)
	for _, s := range cands {
		if !slices.Contains(order, int(s)) {
			order = append(order, int(s))
		}
	}
	last := -1 // the position of the last attempt in order
	for i, slot := range order {
		rep := t.Replica(slot)
		c := Candidate{Name: rep.Name, Addr: rep.Addr, State: rep.State, InRotation: t.InRotation(slot)}
		for n, s := range cands {
			if int(s) == slot {
				c.Attempt = n + 1
				last = i
			}
		}
		ex.Candidates = append(ex.Candidates, c)
	}
	for i := range ex.Candidates {
		c := &ex.Candidates[i]
		if c.Attempt > 0 || (last >= 0 && i > last) {
			continue
		}
		switch {
		case rs.cfg.Stopped:
			c.Skipped = skipStopped
		case !c.InRotation:
			c.Skipped = balancer.Member{Replica: *t.Replica(order[i]), Slot: order[i], Excluded: t.Excluded(order[i])}.OutReason()
		case i > 0 && t.Failover() == balancer.FailoverStrict:
			c.Skipped = skipStrict
		default:
			c.Skipped = skipNotCandidate
		}
	}
	return ex, nil
}

// lifecycleReady reports whether a replica's own view allows traffic —
// ready and not down in gossip — whatever this proxy's health checks say.
func lifecycleReady(r *balancer.Replica) bool { return r.State == balancer.StateReady && !r.Down }
