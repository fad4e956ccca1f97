package proxy

import (
	"bytes"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
	"keyway/internal/jsonstr"
)

// The access log: one JSON object per request, one line each, built by
// appending into a pooled buffer (no allocation per request) and handed to
// Options.AccessLog. The fields are documented in docs/logging.md.

// Bounds on what a client controls, so that one request cannot make a
// huge line: longer values are cut (at a UTF-8 boundary).
const (
	maxLogPath      = 4096 // the raw path; "path_truncated":true says it was cut
	maxLogHost      = 256
	maxLogRequestID = 128
	maxLogMethod    = 32
	maxLogKey       = 512 // key: plain
	// A buffer that grew beyond this for a huge line is not pooled.
	maxPooledLine = 64 << 10
)

// redactedSegment replaces a key's segment in a logged path, whatever
// log.access.key says: the path never carries the key, which is personal
// data more often than not.
const redactedSegment = "{key}"

// accessLine is a pooled line buffer with scratch space.
type accessLine struct {
	buf []byte // the line
	tmp []byte // the redacted path, the key
	out []byte // the key's logged form
}

// logAccess writes one access-log line for r, if the access log is on:
// reason is "" when a replica answered, else why keyway answered itself.
func (p *Proxy) logAccess(r *request, reason string, status int) {
	if p.access == nil {
		return
	}
	l, _ := p.accessBufs.Get().(*accessLine)
	if l == nil {
		l = &accessLine{buf: make([]byte, 0, 1024)}
	}
	l.buf = p.appendAccess(l, r, reason, status)
	_, _ = p.access.Write(l.buf)
	if cap(l.buf) <= maxPooledLine && cap(l.tmp) <= maxPooledLine {
		p.accessBufs.Put(l)
	}
}

// appendAccess builds the line in l.buf[:0] and returns it.
func (p *Proxy) appendAccess(l *accessLine, r *request, reason string, status int) []byte {
	ctx, rs, start, replica := r.ctx, r.rs, r.start, r.replica()
	now := time.Now()
	b := append(l.buf[:0], `{"time":"`...)
	b = start.UTC().AppendFormat(b, time.RFC3339Nano)

	b = append(b, `","request_id":`...)
	id := ctx.Request.Header.PeekBytes(hdrRequestID)
	if len(id) == 0 {
		id = r.requestID() // keyway's, written after the head by the round trip
	}
	if len(id) == 0 {
		// keyway answered before forwarding, which sets one: give the line
		// an id of its own, in the same form.
		l.tmp = appendRequestID(l.tmp[:0])
		id = l.tmp
	}
	b, _ = appendJSONString(b, id, maxLogRequestID)

	b = append(b, `,"client":"`...)
	b = appendAddr(b, ctx.RemoteAddr())
	b = append(b, `","method":`...)
	b, _ = appendJSONString(b, ctx.Request.Header.Method(), maxLogMethod)
	b = append(b, `,"host":`...)
	b, _ = appendJSONString(b, ctx.Request.Header.Host(), maxLogHost)

	b = append(b, `,"path":`...)
	path := ctx.URI().PathOriginal()
	if rs != nil {
		l.tmp = redactKeySegments(l.tmp[:0], path, rs.sources)
		path = l.tmp
	}
	b, cut := appendJSONString(b, path, maxLogPath)
	if cut {
		b = append(b, `,"path_truncated":true`...)
	}

	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"set":"`...)
	if rs != nil {
		b = append(b, rs.name...) // a valid set name needs no escaping
	}
	b = append(b, `","replica":`...)
	b, _ = appendJSONString(b, replica, len(replica))
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(r.tried), 10)
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendInt(b, int64(len(ctx.Request.Body())), 10)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendInt(b, int64(len(ctx.Response.Body())), 10)
	b = append(b, `,"duration":`...)
	b = appendSeconds(b, now.Sub(start))
	b = append(b, `,"upstream_duration":`...)
	b = appendSeconds(b, r.upstream)
	if reason != "" {
		b = append(b, `,"reason":"`...)
		b = append(b, reason...) // keyway's own words: no escaping needed
		b = append(b, '"')
	}
	if p.accessKey != nil && rs != nil {
		uri := ctx.URI()
		if key, ok := appendCanonicalKey(l.tmp[:0], rs, &ctx.Request.Header, uri.PathOriginal(), uri); ok {
			l.tmp = key
			l.out = p.accessKey(l.out[:0], key)
			b = append(b, `,"key":`...)
			b, _ = appendJSONString(b, l.out, maxLogKey)
		}
	}
	return append(b, "}\n"...)
}

// appendSeconds appends d in seconds, with up to nanosecond precision.
func appendSeconds(b []byte, d time.Duration) []byte {
	if d < 0 {
		d = 0
	}
	return strconv.AppendFloat(b, d.Seconds(), 'f', -1, 64)
}

// appendAddr appends a client address as ip:port ([ip]:port for IPv6).
func appendAddr(b []byte, a net.Addr) []byte {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			break
		}
		return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port)).AppendTo(b)
	case nil:
		return b
	}
	// Not TCP (tests' in-memory pipes): rare, so the allocation is fine;
	// escaped, since the address's String is not ours.
	b, _ = jsonstr.AppendEscaped(b, a.String(), math.MaxInt)
	return b
}

// redactKeySegments appends path with every segment a path_segment key
// source of the set reads replaced by "{key}": the key reaches the log
// only through the key field, in the form log.access.key chose.
func redactKeySegments(dst, path []byte, sources []keySource) []byte {
	seg := false
	for i := range sources {
		seg = seg || sources[i].kind == keyPathSegment
	}
	if !seg || len(path) == 0 || path[0] != '/' {
		return append(dst, path...)
	}
	rest := path[1:]
	for n := 1; ; n++ {
		dst = append(dst, '/')
		s := rest
		j := bytes.IndexByte(rest, '/')
		if j >= 0 {
			s, rest = rest[:j], rest[j+1:]
		}
		redact := false
		for i := range sources {
			redact = redact || sources[i].kind == keyPathSegment && sources[i].segment == n
		}
		if redact && len(s) > 0 {
			dst = append(dst, redactedSegment...)
		} else {
			dst = append(dst, s...)
		}
		if j < 0 {
			return dst
		}
	}
}

// appendCanonicalKey appends the request's key as routing used it: the
// first source present decides, in the canonical form the balancer hashes
// (its Append functions are its Hash functions' own extraction: HashKey of
// the result is the hash the request was routed by). ok is false for a
// request without a key or with a malformed one.
func appendCanonicalKey(dst []byte, rs *replicaSet, h *fasthttp.RequestHeader, path []byte, uri *fasthttp.URI) ([]byte, bool) {
	for i := range rs.sources {
		src := &rs.sources[i]
		var st balancer.KeyStatus
		switch src.kind {
		case keyHeader:
			dst, st = balancer.AppendHeaderKey(dst, h.PeekBytes(src.name))
		case keyPathSegment:
			dst, st = balancer.AppendPathSegmentKey(dst, path, src.segment)
		default:
			dst, st = balancer.AppendQueryKey(dst, uri.QueryString(), src.name)
		}
		if st != balancer.KeyMissing {
			return dst, st == balancer.KeyOK
		}
	}
	return dst, false
}

// appendJSONString appends s, cut to at most max bytes, as a JSON string
// (quoted) and reports whether it was cut: keyway's one escaper,
// jsonstr.AppendCut, under the name the proxy's files use.
func appendJSONString[S string | []byte](b []byte, s S, max int) ([]byte, bool) {
	return jsonstr.AppendCut(b, s, max)
}

// parseErrorReason names, for the access log, why keyway answered a
// request fasthttp could not read, from the status it chose.
func parseErrorReason(status int) string {
	switch status {
	case fasthttp.StatusRequestHeaderFieldsTooLarge:
		return "headers_too_large"
	case fasthttp.StatusRequestURITooLong:
		return "uri_too_long"
	case fasthttp.StatusRequestEntityTooLarge:
		return "body_too_large"
	case fasthttp.StatusRequestTimeout:
		return "read_timeout"
	}
	return "malformed"
}
