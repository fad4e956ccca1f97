package proxy

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"keyway/balancer"
)

// Route context: with replica_sets[].route_context.header set, every
// attempt tells its replica how keyway routed the request, in one header:
//
//	partition=1281; standin=1; ring=5dd67cb170aa7cfa; key=order-42; owner=orders-0
//
// partition is the key's partition; standin is 1 when the replica getting
// this attempt is not the partition's ring owner (the owner is out of
// rotation, or an earlier attempt to it failed), else 0; key is the key
// routed by, in the canonical form that was hashed, percent-encoded
// (appendRouteKey): a replica need not know which source gave it; owner
// is the ring owner's name, last because a replica name may contain ';'
// or '=': it runs to the end of the value. A request without a key
// carries only ring. ring identifies the routing view the decision was made with: the
// table's digest of ring parameters, ring members and rotation
// (balancer.Table.Digest), the one the proxies compare (GET /v1/fleet).
// Proxies that agree send the same value; a replica that sees two values
// at once is told that the proxies disagreed. Replicas should compare it
// for equality only.

// ringID is the ring identifier of one routing table, made once per table.
type ringID struct {
	t *balancer.Table[*Backend]
	v []byte
}

// ringID returns the ring identifier of t. It is made when a table is
// published (rebuilt) and cached; a request that sees a table first makes
// it then (one allocation per table, not per request). Safe for
// concurrent use.
func (st *setState) ringID(t *balancer.Table[*Backend]) []byte {
	if id := st.ring.Load(); id != nil && id.t == t {
		return id.v
	}
	v := []byte(t.Digest())
	st.ring.Store(&ringID{t: t, v: v})
	return v
}

var (
	strPartition = []byte("partition=")
	strStandin0  = []byte("; standin=0; ring=")
	strStandin1  = []byte("; standin=1; ring=")
	strRing      = []byte("ring=")
	strKey       = []byte("; key=")
	strOwner     = []byte("; owner=")
)

// setRouteContext sets the route context header name of an attempt going
// to slot of t, replacing any the client sent. key is the request's
// canonical key (appendCanonicalKey), nil without one. It allocates
// nothing while the value fits 512 bytes (replica name and encoded key
// of about 400 bytes together).
func setRouteContext(h *fasthttp.RequestHeader, name []byte, t *balancer.Table[*Backend], keyed bool, hash uint64, key []byte, slot int, ring []byte) {
	var buf [512]byte
	v := buf[:0]
	owner := -1
	if keyed {
		owner = t.Owner(hash)
	}
	if owner >= 0 {
		v = append(v, strPartition...)
		v = strconv.AppendInt(v, int64(t.Partition(hash)), 10)
		if slot == owner {
			v = append(v, strStandin0...)
		} else {
			v = append(v, strStandin1...)
		}
		v = append(v, ring...)
		v = append(v, strKey...)
		v = appendRouteKey(v, key)
		v = append(v, strOwner...)
		v = append(v, t.Replica(owner).Name...)
	} else {
		v = append(v, strRing...)
		v = append(v, ring...)
	}
	h.DelBytes(name)
	h.SetBytesKV(name, v)
}

// appendRouteKey appends key percent-encoded: letters, digits and -._~ as
// they are, every other byte as %XX (upper-case hex), so that the value
// holds no ';', '=', space or control byte whatever the key (a key is
// bytes: a header value, or a decoded path segment or query parameter).
// A replica decodes it with any URL unescaper (Go: url.PathUnescape).
func appendRouteKey(dst, key []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range key {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			dst = append(dst, c)
		default:
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		}
	}
	return dst
}
